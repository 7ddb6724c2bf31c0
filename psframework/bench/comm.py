"""psf bench comm: bandwidth of the project's transport next to mpi4py's pingpong, and first-k overhead.

Run under MPI with 2 or more ranks: ``mpiexec -n 2 python -m mpi4py -m psframework bench comm``.
Rank 0 is the server and rank 1 the worker for the bandwidth tables; the first-k table uses every
worker. Raw pingpong (mpi4py.bench.pingpong, called in-process) and transport measurements are
interleaved, repeated, and reported as medians so that drifts of the machine hit both alike.
Rank 0 writes comm.json and the comm.md rendered from it (atomically) to --out; `--render` re-renders
comm.md from a comm.json without MPI.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Union

from psframework import environment
from psframework.bench import expectations as expect
from psframework.bench import report as rep
from psframework.bench.machine import cpu_model

KIB, MIB = 1 << 10, 1 << 20
COMMAND = "mpiexec -n {n} python -m mpi4py -m psframework bench comm"
PROG = "psf bench comm"


def build_parser() -> argparse.ArgumentParser:
    """Return the benchmark's argument parser."""
    parser = argparse.ArgumentParser(prog=PROG, description="transport bandwidth vs mpi4py pingpong, and "
                                     "first-k-of-n overhead; run under mpiexec -n 2 or more")
    rep.add_report_options(parser, "comm")
    parser.add_argument("--min-size", type=int, default=KIB, help="smallest message in bytes (default 1 KiB)")
    parser.add_argument("--max-size", type=int, default=64 * MIB, help="largest message in bytes (default 64 MiB)")
    parser.add_argument("--repeats", type=int, default=9, help="interleaved repetitions per size (median kept)")
    parser.add_argument("--timeout-s", type=float, default=120.0,
                        help="transport watchdog during the measurements (as comm.timeout_s in training)")
    parser.add_argument("--quick", action="store_true", help="few sizes and repetitions: a smoke run")
    return parser


def _iterations(nbytes: int, quick: bool) -> int:
    """Return timed iterations per measurement: about 512 MiB moved for large messages, at least 10."""
    if nbytes <= 64 * KIB:
        n = 200
    elif nbytes <= MIB:
        n = 50
    else:
        n = max(10, 512 * MIB // nbytes)
    return max(2, n // 10) if quick else n


def raw_pingpong(comm: Any, nbytes: int, iterations: int) -> float:
    """Return mpi4py.bench pingpong's one-way time for one size (ranks 0 and 1; others only synchronise)."""
    from mpi4py import bench

    args = ["-q", "-m", str(nbytes), "-n", str(nbytes), "-s", "2", "-l", str(iterations),
            "--skip-large", "2", "--loop-large", str(iterations), "--skip-huge", "2", "--loop-huge", str(iterations)]
    (size, mean, _), = bench.pingpong(comm, args, verbose=False)
    assert size == nbytes
    return mean


def timed_exchanges(one_exchange: Callable[[int], None], iterations: int) -> float:
    """Run two warm-up exchanges, then `iterations` timed ones; return the mean seconds per timed exchange."""
    one_exchange(0)
    one_exchange(1)
    start = time.perf_counter()
    for i in range(2, iterations + 2):
        one_exchange(i)
    return (time.perf_counter() - start) / iterations


def transport_one_way(t: Any, nbytes: int, iterations: int, server_sends: bool, torch_memory: bool = False) -> float:
    """Return the time per message of nbytes through the transport, each answered by an empty ack.

    The empty ack (a header alone) keeps messages from piling up, as the pingpong's return trip does.
    Tensors are NumPy-backed (host_empty), as the pingpong's buffers are; torch_memory=True uses
    torch's own allocator instead.
    """
    import torch

    from psframework.comm import Envelope, Kind, Phase
    from psframework.comm.buffers import host_empty

    rank = t.rank
    payload = torch.empty(nbytes, dtype=torch.uint8) if torch_memory else host_empty((nbytes,), "uint8")
    ack = torch.empty(0, dtype=torch.uint8)
    data_env = Envelope(Kind.COMMAND if server_sends else Kind.REPLY, 0, layer=1, phase=Phase.FORWARD)
    ack_env = Envelope(Kind.CONTROL, 0, layer=1, phase=Phase.OTHER)
    sender = 0 if server_sends else 1
    receiver = 1 - sender
    t.comm.Barrier()

    def one_exchange(i: int) -> None:
        data, done = data_env.with_iteration(i), ack_env.with_iteration(i)
        if rank == sender:
            t.send(receiver, payload, data)
            t.recv(receiver, done, out=ack)
        elif rank == receiver:
            t.recv(sender, data, out=payload)
            t.send(sender, ack, done)

    return timed_exchanges(one_exchange, iterations)


def raw_sendrecv_pingpong(comm: Any, nbytes: int, iterations: int) -> float:
    """Return half the round trip of a plain MPI Send/Recv pingpong on buffers made as the transport's are."""
    from mpi4py import MPI

    from psframework.comm.buffers import host_empty

    s_msg, r_msg = host_empty((nbytes,), "uint8").numpy(), host_empty((nbytes,), "uint8").numpy()
    rank = comm.Get_rank()
    comm.Barrier()

    def one_exchange(i: int) -> None:
        if rank == 0:
            comm.Send([s_msg, MPI.BYTE], 1, 1)
            comm.Recv([r_msg, MPI.BYTE], 1, 2)
        elif rank == 1:
            comm.Recv([r_msg, MPI.BYTE], 0, 1)
            comm.Send([s_msg, MPI.BYTE], 0, 2)

    return timed_exchanges(one_exchange, iterations) / 2


def transport_pingpong(t: Any, nbytes: int, iterations: int) -> float:
    """Return half the round trip of nbytes there and nbytes back through the transport, as pingpong does."""
    from psframework.comm import Envelope, Kind, Phase
    from psframework.comm.buffers import host_empty

    s_msg, r_msg = host_empty((nbytes,), "uint8"), host_empty((nbytes,), "uint8")  # as pingpong: two buffers
    there = Envelope(Kind.COMMAND, 0, layer=2, phase=Phase.FORWARD)
    back = Envelope(Kind.REPLY, 0, layer=2, phase=Phase.FORWARD)
    t.comm.Barrier()

    def one_exchange(i: int) -> None:
        go, come = there.with_iteration(i), back.with_iteration(i)
        if t.rank == 0:
            t.send(1, s_msg, go)
            t.recv(1, come, out=r_msg)
        elif t.rank == 1:
            t.recv(0, go, out=r_msg)
            t.send(0, s_msg, come)

    return timed_exchanges(one_exchange, iterations) / 2


def measure_bandwidth(comm: Any, t: Any, sizes: List[int], repeats: int, quick: bool) -> List[Dict[str, Any]]:
    """Return per size the median one-way times of raw pingpong and both transport directions."""
    rows = []
    for nbytes in sizes:
        iterations = _iterations(nbytes, quick)
        raw, plain, pp, s2w, w2s = [], [], [], [], []
        for _ in range(repeats):
            raw.append(raw_pingpong(comm, nbytes, iterations))
            plain.append(raw_sendrecv_pingpong(comm, nbytes, iterations))
            pp.append(transport_pingpong(t, nbytes, iterations))
            s2w.append(transport_one_way(t, nbytes, iterations, server_sends=True))
            w2s.append(transport_one_way(t, nbytes, iterations, server_sends=False))
        samples = {"pingpong": raw, "sendrecv_pingpong": plain, "transport_pingpong": pp,
                   "server_to_worker": s2w, "worker_to_server": w2s}
        row: Dict[str, Any] = {"bytes": nbytes, "iterations": iterations, "repeats": repeats}
        for name, values in samples.items():
            row[f"{name}_s"] = statistics.median(values)
            row[f"{name}_MBps"] = nbytes / row[f"{name}_s"] / 1e6
        # Ratios pair each transport measurement with the pingpong measured just before it, so that
        # slow spells of a shared machine cancel out; the median over repetitions is kept.
        for name in ("transport_pingpong", "server_to_worker", "worker_to_server"):
            row[f"ratio_{name}"] = statistics.median(r / x for r, x in zip(raw, samples[name]))
        row["ratio_transport_vs_sendrecv"] = statistics.median(r / x for r, x in zip(plain, pp))
        row["samples_s"] = samples
        rows.append(row)
        if comm.Get_rank() == 0:
            print(f"  {_size(nbytes):>8}  pingpong {row['pingpong_MBps']:9.1f} MB/s  "
                  f"send/recv {row['sendrecv_pingpong_MBps']:9.1f}  "
                  f"transport pingpong {row['transport_pingpong_MBps']:9.1f} ({row['ratio_transport_pingpong']:.2f})  "
                  f"server->worker {row['server_to_worker_MBps']:9.1f} ({row['ratio_server_to_worker']:.2f})  "
                  f"worker->server {row['worker_to_server_MBps']:9.1f} ({row['ratio_worker_to_server']:.2f})",
                  flush=True)
    return rows


def measure_memory(comm: Any, t: Any, nbytes: int, repeats: int, quick: bool) -> Dict[str, Any]:
    """Return server->worker bandwidth of one large size from NumPy-backed and from torch-allocated tensors."""
    iterations = _iterations(nbytes, quick)
    numpy_backed, torch_alloc = [], []
    for _ in range(repeats):
        numpy_backed.append(transport_one_way(t, nbytes, iterations, server_sends=True))
        torch_alloc.append(transport_one_way(t, nbytes, iterations, server_sends=True, torch_memory=True))
    row = {"bytes": nbytes, "numpy_backed_MBps": nbytes / statistics.median(numpy_backed) / 1e6,
           "torch_allocator_MBps": nbytes / statistics.median(torch_alloc) / 1e6,
           "THP_MEM_ALLOC_ENABLE": environment.get("THP_MEM_ALLOC_ENABLE") or ""}
    if comm.Get_rank() == 0:
        print(f"  {_size(nbytes):>8}  NumPy-backed tensors {row['numpy_backed_MBps']:9.1f} MB/s  "
              f"torch allocator {row['torch_allocator_MBps']:9.1f} MB/s", flush=True)
    return row


def _round(t: Any, mode: str, workers: List[int], buffers: Dict[int, Any], payload: Any, it: int, k: int) -> float:
    """Run one command/reply round; on the server return the seconds from the commands to the k-th reply."""
    import torch
    from mpi4py import MPI

    from psframework.comm import Envelope, Kind, Phase

    cmd = Envelope(Kind.COMMAND, it, layer=2, phase=Phase.FORWARD)
    rep = Envelope(Kind.REPLY, it, layer=2, phase=Phase.FORWARD)
    raw_tag = 30000
    if t.rank == 0:
        start = time.perf_counter()
        if mode == "first-k":
            gather = t.post_gather(workers, rep, buffers)
        elif mode == "raw":
            requests = [t.comm.Irecv([buffers[w].numpy(), MPI.BYTE], w, raw_tag) for w in workers]
        for w in workers:
            t.isend(w, torch.tensor(it), cmd)
        if mode == "first-k":
            gather.wait(k)
        elif mode == "raw":
            MPI.Request.Waitall(requests)
        else:
            for w in workers:
                t.recv(w, rep, out=buffers[w])
        elapsed = time.perf_counter() - start
        t.outbox.sweep()
        return elapsed
    t.recv(0, cmd)
    if mode == "raw":
        t.comm.Send([payload.numpy(), MPI.BYTE], 0, raw_tag)
    else:
        t.send(0, payload, rep)
    return 0.0


def measure_first_k(comm: Any, t: Any, sizes: List[int], repeats: int, quick: bool) -> List[Dict[str, Any]]:
    """Return per size the median round time of raw receives, plain transport receives and first-k-of-n."""
    from psframework.comm.buffers import host_empty

    workers = list(range(1, t.size))
    n = len(workers)
    modes = [("raw", n), ("plain", n), ("first-k", n)] + ([("first-k", n - 1)] if n > 1 else [])
    rows, it = [], 0
    for nbytes in sizes:
        rounds = max(5, _iterations(nbytes, quick) // 2)
        buffers = {w: host_empty((nbytes,), "uint8") for w in workers}
        payload = host_empty((nbytes,), "uint8")
        payload.fill_(1)
        samples: Dict[str, List[float]] = {}
        for _ in range(repeats):
            for mode, k in modes:
                name = mode if mode != "first-k" else f"first-{k}-of-{n}"
                t.comm.Barrier()
                times = []
                for _ in range(rounds + 2):
                    times.append(_round(t, mode, workers, buffers, payload, it, k))
                    it += 1
                samples.setdefault(name, []).append(statistics.mean(times[2:]))
                t.drain(5.0)  # the replies a k < n round left behind
                t.comm.Barrier()
        row: Dict[str, Any] = {"bytes": nbytes, "workers": n, "rounds": rounds, "repeats": repeats}
        for name, values in samples.items():
            row[f"{name}_s"] = statistics.median(values)
        if comm.Get_rank() != 0:  # only the server times rounds
            continue
        raw, plain, first = row["raw_s"], row["plain_s"], row[f"first-{n}-of-{n}_s"]
        row["overhead_s"] = first - plain
        row["overhead_pct"] = 100.0 * (first - plain) / plain
        row["overhead_vs_raw_s"] = first - raw
        row["overhead_vs_raw_pct"] = 100.0 * (first - raw) / raw
        rows.append(row)
        print(f"  {_size(nbytes):>8}  raw {row['raw_s'] * 1e6:9.1f} us  plain {plain * 1e6:9.1f} us  "
              f"first-{n}-of-{n} {first * 1e6:9.1f} us  overhead {row['overhead_pct']:+.1f}% vs plain, "
              f"{row['overhead_vs_raw_pct']:+.1f}% vs raw", flush=True)
    return rows


def _quiet_barrier(comm: Any) -> None:
    """Synchronise, sleeping between checks instead of spinning on a core."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.02)


def _size(nbytes: int) -> str:
    if nbytes >= MIB and nbytes % MIB == 0:
        return f"{nbytes // MIB} MiB"
    if nbytes >= KIB and nbytes % KIB == 0:
        return f"{nbytes // KIB} KiB"
    return f"{nbytes} B"


def machine_info(comm: Any) -> Dict[str, Any]:
    """Return what the figures were measured on."""
    import mpi4py
    import torch
    from mpi4py import MPI

    return {"host": socket.gethostname(), "cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(),
            "mpi_library": " ".join(MPI.Get_library_version().strip().splitlines()[0].split()),
            "mpi4py": mpi4py.__version__, "torch": torch.__version__, "python": platform.python_version(),
            "world_size": comm.Get_size(), "load_average_1min": os.getloadavg()[0]}


def _machine_lines(report: Dict[str, Any]) -> List[str]:
    """Return the machine section."""
    m = report["machine"]
    size = m["world_size"]
    return ["## Machine", "",
            f"- host: {m['host']}, CPU: {m['cpu']}, {m['cores']} cores, {m['platform']}",
            f"- MPI: {m['mpi_library']}, mpi4py {m['mpi4py']}, torch {m['torch']}, Python {m['python']}",
            f"- MPI processes: {size} (rank 0 server, ranks 1..{size - 1} workers), measured {report['date']}; "
            f"1-minute load average {m['load_average_1min']:.2f} at the end of the run (the run's own {size} "
            "processes count in it: well above that, other work shared the machine)"
            + ("; more processes than cores: idle and waiting ranks share cores with working ones, which "
               "perturbs every figure, the bandwidth ones included (measure bandwidth with at most one process "
               "per core)" if size > (m["cores"] or 1) else ""), "",
            "Rerun with:", "", "```", report["command"], "```", ""]


def _bandwidth_lines(report: Dict[str, Any]) -> List[str]:
    """Return the bandwidth table and what its smallest size shows."""
    lines = ["## Bandwidth (MB/s, 1 MB = 10^6 bytes)", "",
             "mpi4py pingpong: `mpi4py.bench.pingpong` called in-process, its one-way time (half a round trip "
             "of two equal messages, separate send and receive buffers). Send/Recv pingpong: the same exchange "
             "in plain MPI on buffers made as the transport's are (NumPy-backed tensors), a second reference. "
             "Transport pingpong: the same exchange through the transport. Server -> worker and worker -> server: "
             "one message through the transport, answered by an empty acknowledgement (a header alone); their "
             "working set is half the pingpong's, which favours them where the messages fit in cache. Ratio: "
             "transport over mpi4py pingpong bandwidth, each transport measurement paired with the pingpong "
             "measured just before it, median over the repetitions (so that slow spells of the machine hit both "
             "sides of a pair).", "",
             "| size | mpi4py pingpong | Send/Recv pingpong | transport pingpong | ratio | vs Send/Recv "
             "| server -> worker | ratio | worker -> server | ratio |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["bandwidth"]:
        lines.append(f"| {_size(r['bytes'])} | {r['pingpong_MBps']:.1f} | {r['sendrecv_pingpong_MBps']:.1f} | "
                     f"{r['transport_pingpong_MBps']:.1f} | {r['ratio_transport_pingpong']:.2f} | "
                     f"{r['ratio_transport_vs_sendrecv']:.2f} | {r['server_to_worker_MBps']:.1f} | "
                     f"{r['ratio_server_to_worker']:.2f} | {r['worker_to_server_MBps']:.1f} | "
                     f"{r['ratio_worker_to_server']:.2f} |")
    if report["bandwidth"]:
        small = report["bandwidth"][0]
        lines += ["", f"The smallest messages show the transport's fixed cost: {_size(small['bytes'])} takes "
                  f"{small['transport_pingpong_s'] * 1e6:.1f} us one way through the transport against "
                  f"{small['pingpong_s'] * 1e6:.1f} us for mpi4py's pingpong (two MPI messages per message, a "
                  "header built and checked in Python)."]
    return lines + [""]


def _memory_lines(mem: Dict[str, Any]) -> List[str]:
    """Return the section on NumPy-backed against torch-allocated tensors."""
    if not mem:
        return []
    return ["## Where the tensor memory comes from", "",
            "Server -> worker bandwidth through the transport for the largest size, from tensors backed by "
            "NumPy memory (`psframework.comm.buffers.host_empty`, which the tables above use, as mpi4py's "
            "pingpong uses NumPy arrays) and from tensors of torch's own allocator "
            f"(THP_MEM_ALLOC_ENABLE={mem['THP_MEM_ALLOC_ENABLE'] or 'unset'}). NumPy asks Linux for transparent "
            "huge pages on large arrays; torch does so only with THP_MEM_ALLOC_ENABLE=1, which `hpc/psf-mpirun` "
            "and the `jobs/` templates export.", "",
            "| size | NumPy-backed tensors | torch allocator |", "|---:|---:|---:|",
            f"| {_size(mem['bytes'])} | {mem['numpy_backed_MBps']:.1f} | {mem['torch_allocator_MBps']:.1f} |", ""]


def _first_k_lines(fk: List[Dict[str, Any]]) -> List[str]:
    """Return the first-k-of-n overhead table."""
    if not fk:
        return []
    n = fk[0]["workers"]
    names = [key[:-2] for key in fk[0] if key.endswith("_s") and not key.startswith("overhead")]
    lines = ["## First-k-of-n overhead", "",
             f"One round: the server sends a small command to each worker ({n} here) and receives one reply "
             "of the given size from each. raw: MPI Irecv/Waitall without envelopes; plain: the transport's "
             f"blocking receives in rank order; first-{n}-of-{n}: pre-posted receives and a wait for all "
             "replies, the same work as plain; the overheads compare it with plain and with raw. Plain "
             "receives take the replies one after the other, raw and first-k take them as they come, "
             "concurrently" + (f"; first-{n - 1}-of-{n} stops at the first {n - 1} replies." if n > 1 else "."), "",
             "| size | " + " | ".join(f"{name} (us)" for name in names) + " | overhead vs plain | overhead vs raw |",
             "|---:|" + "---:|" * (len(names) + 2)]
    for r in fk:
        cells = " | ".join(f"{r[name + '_s'] * 1e6:.1f}" for name in names)
        lines.append(f"| {_size(r['bytes'])} | {cells} | {r['overhead_s'] * 1e6:+.1f} us "
                     f"({r['overhead_pct']:+.1f}%) | {r['overhead_vs_raw_s'] * 1e6:+.1f} us "
                     f"({r['overhead_vs_raw_pct']:+.1f}%) |")
    return lines + [""]


def render(report: Dict[str, Any], expectations: Optional[Dict[str, Any]] = None) -> str:
    """Return the communication benchmark report as Markdown."""
    inputs = report["inputs"]
    header = f"a {inputs['header_bytes']}-byte header" if inputs.get("header_bytes") else "a header"
    lines = ["# Communication benchmark", "",
             f"Bandwidth of the psframework transport (enveloped messages: {header}, then the payload, torch CPU "
             "tensors as zero-copy NumPy views) next to `python -m mpi4py.bench pingpong` measured in the same "
             "run, and the cost of first-k-of-n receives over plain receives. Medians over "
             f"{inputs['repeats']} interleaved repetitions. The transport ran with its watchdog on "
             f"(timeout {inputs['timeout_s']:g} s), as in training.", ""]
    lines += (_machine_lines(report) + _bandwidth_lines(report) + _memory_lines(report["memory"])
              + _first_k_lines(report["first_k"]))
    return "\n".join(lines + expect.section(report, expectations))


def message_sizes(args: argparse.Namespace) -> List[int]:
    """Return the powers of two from --min-size to --max-size (up to 256 KiB with --quick)."""
    sizes = [1 << i for i in range(args.max_size.bit_length()) if args.min_size <= 1 << i <= args.max_size]
    if args.quick:
        sizes = [s for s in sizes if s <= 256 * KIB] or sizes[:1]
    return sizes


def measure_all(comm: Any, sizes: List[int], repeats: int, timeout_s: float, quick: bool) -> Dict[str, Any]:
    """Measure bandwidth and memory on ranks 0 and 1, then first-k-of-n on every rank; return the figures."""
    from mpi4py import MPI

    from psframework.comm import Transport

    rank = comm.Get_rank()
    say = (lambda text: print(text, flush=True)) if rank == 0 else (lambda text: None)
    say(f"{PROG}: {comm.Get_size()} processes, sizes {_size(sizes[0])}..{_size(sizes[-1])}, {repeats} repetitions")
    say("bandwidth (ranks 0 and 1):")
    # Bandwidth runs on ranks 0 and 1 alone; the others wait without spinning so as not to steal cores.
    pair = comm.Split(0 if rank < 2 else MPI.UNDEFINED, rank)
    figures: Dict[str, Any] = {"bandwidth": [], "memory": {}}
    if pair != MPI.COMM_NULL:
        t = Transport(pair, cuda_aware="false", timeout_s=timeout_s)
        figures["bandwidth"] = measure_bandwidth(pair, t, sizes, repeats, quick)
        say("memory:")
        figures["memory"] = measure_memory(pair, t, sizes[-1], repeats, quick)
        t.close(5.0)
        pair.Free()
    _quiet_barrier(comm)
    t = Transport(comm, cuda_aware="false", timeout_s=timeout_s)
    fk_sizes = [s for s in (KIB, 64 * KIB, MIB, 8 * MIB) if sizes[0] <= s <= sizes[-1]] or [sizes[0]]
    say(f"first-k-of-n ({comm.Get_size() - 1} workers):")
    figures["first_k"] = measure_first_k(comm, t, fk_sizes, repeats, quick)
    t.close(5.0)
    return figures


def measure(args: argparse.Namespace, argv: List[str]) -> Union[Dict[str, Any], int]:
    """Measure under MPI; return the report on rank 0, exit status 0 on the others and 2 on bad options."""
    if args.min_size < 1 or args.max_size < args.min_size:
        return rep.fail(PROG, f"--min-size {args.min_size} / --max-size {args.max_size}: expected "
                        "1 <= min-size <= max-size")
    if args.repeats < 1:
        return rep.fail(PROG, f"--repeats {args.repeats}: expected >= 1")
    from mpi4py import MPI

    from psframework.comm.envelope import HEADER_BYTES

    comm = MPI.COMM_WORLD
    if comm.Get_size() < 2:
        return rep.fail(PROG, f"needs at least 2 MPI processes, got {comm.Get_size()}; run: {COMMAND.format(n=2)}")
    sizes = message_sizes(args)
    repeats = min(args.repeats, 2) if args.quick else args.repeats
    figures = measure_all(comm, sizes, repeats, args.timeout_s, args.quick)
    if comm.Get_rank() != 0:
        return 0
    inputs = {"sizes": sizes, "repeats": repeats, "timeout_s": args.timeout_s, "quick": args.quick,
              "header_bytes": HEADER_BYTES}
    return {"benchmark": "comm", "command": rep.command_line(COMMAND.format(n=comm.Get_size()), argv),
            "machine": machine_info(comm), "date": rep.today(), "inputs": inputs, **figures}


def main(argv: Optional[List[str]] = None) -> int:
    """Run the benchmark (or re-render with --render); return 0, or 2 when it is not run under MPI with 2 ranks."""
    return rep.main("comm", build_parser(), argv, measure, render)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
