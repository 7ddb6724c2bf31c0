"""Network emulation: the transfer time of a message on an emulated link, its queue, and when a message may go."""

from __future__ import annotations

import time

import pytest

from psframework.runtime.emulate import LinkEmulator, link_emulator


def test_transfer_time_is_bytes_over_bandwidth_plus_latency():
    link = LinkEmulator(bandwidth_gbps=10.0, latency_us=50.0)
    assert link.transfer_s(0) == pytest.approx(50e-6)
    assert link.transfer_s(1_250_000) == pytest.approx(1e-3 + 50e-6)  # 10 Mbit at 10 Gb/s
    assert LinkEmulator(latency_us=20.0).transfer_s(10**9) == pytest.approx(20e-6)  # unlimited bandwidth


def test_messages_queue_on_the_link_without_holding_the_sender_up():
    link = LinkEmulator(bandwidth_gbps=1.0, latency_us=100.0)
    sizes = [125_000, 0, 2_500_000]  # 1 ms, 0, 20 ms of wire time
    start = time.perf_counter()
    dues = [link(1, None, nbytes) for nbytes in sizes]
    elapsed = time.perf_counter() - start
    assert elapsed < 5e-3  # the sender goes on at once
    wire = 0.0
    for nbytes, due in zip(sizes, dues):  # each waits for the ones before it, then crosses
        wire += link.wire_s(nbytes)
        assert due >= start + wire + 100e-6
    assert dues == sorted(dues)
    least = sum(link.transfer_s(n) for n in sizes)
    assert link.delayed_s >= least and link.messages == 3


def test_a_blocking_transfer_waits_for_the_link():
    link = LinkEmulator(bandwidth_gbps=1.0)
    link(1, None, 1_250_000)  # 10 ms queued first
    start = time.perf_counter()
    link.wait(1_250_000)  # another 10 ms after it
    assert time.perf_counter() - start >= 0.02 - 1e-4


def test_off_means_no_emulator():
    assert link_emulator(None, 0.0) is None
    assert link_emulator(10.0, 0.0) is not None and link_emulator(None, 5.0) is not None


@pytest.mark.parametrize("kwargs,message", [
    ({"bandwidth_gbps": 0.0}, "bandwidth_gbps: got 0.0"),
    ({"bandwidth_gbps": -1.0}, "bandwidth_gbps: got -1.0"),
    ({"latency_us": -1.0}, "latency_us: got -1.0"),
])
def test_bad_settings_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LinkEmulator(**kwargs)
