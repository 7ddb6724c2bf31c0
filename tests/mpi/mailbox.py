"""Mailbox under MPI (2 ranks): everything from the server is taken in, handed out by envelope."""

from __future__ import annotations

import time

import torch

from psframework.comm import Envelope, Kind, Mailbox, Phase, Transport, WatchdogTimeout, setup_roles


def main() -> None:
    roles = setup_roles()
    t = Transport(roles.comm, cuda_aware="false", timeout_s=20.0)
    envelopes = [Envelope(Kind.COMMAND, it, layer, Phase.FORWARD) for it in (1, 2, 3) for layer in (0, 1)]
    envelopes.append(Envelope(Kind.CONTROL, 3, 2, Phase.OTHER))  # an empty message
    if roles.is_server:
        for i, env in enumerate(envelopes[:-1]):
            t.isend(1, torch.full((1000 * (i + 1),), float(i)), env)
        t.isend(1, torch.zeros(0), envelopes[-1])
        t.recv(1, Envelope(Kind.REPLY, 3, 0, Phase.OTHER))
        print("OK mailbox", flush=True)
    else:
        box = Mailbox(t, 0)
        time.sleep(0.5)  # everything is on its way: the mailbox must take it all in while we look
        box.progress()
        assert len(box.kept) == len(envelopes), sorted(box.kept)
        assert box.has(envelopes[3]) and not box.has(Envelope(Kind.COMMAND, 4, 0, Phase.FORWARD))
        for i in (5, 0, 3, 1, 4, 2):  # any order, by envelope
            x = box.take(envelopes[i])
            assert x.shape == (1000 * (i + 1),) and bool((x == i).all()), (i, x[:3])
        assert box.take(envelopes[-1]).numel() == 0
        try:
            box.take(Envelope(Kind.COMMAND, 9, 0, Phase.FORWARD), timeout_s=0.3)
        except WatchdogTimeout as error:
            assert "rank(s) 0" in str(error), str(error)
        else:
            raise AssertionError("a missing message must raise the watchdog")
        box.close()
        t.send(0, torch.zeros(1), Envelope(Kind.REPLY, 3, 0, Phase.OTHER))
    t.close(timeout_s=1.0)


if __name__ == "__main__":
    main()
