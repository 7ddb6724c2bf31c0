"""The coded path at speed, in one process: wide relay symbols, one packet's encoding, deferred updates,
the detach rule and the emulated link's queue."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
import torch

from psframework.codes import (WIDE_OVERHEAD, PolyCode, SAZDCode, UncodedCode, split_blocks, wide_layout)
from psframework.codes.layout import WIDE_MAX_SYMBOLS
from psframework.codes.zigzag import COPY
from psframework.comm import Envelope, Kind, Transport
from psframework.comm.rounds import cpu_per_iteration
from psframework.comm.server_link import MPIServerLink
from psframework.schemes.coded.dissemination import RelayDissemination
from psframework.settings import CodeSettings

CODES = [(4, 3, True), (4, 3, False), (8, 6, True), (8, 6, False), (5, 2, True), (6, 3, False)]


@pytest.mark.parametrize("code", [SAZDCode(4, 3), SAZDCode(5, 3, systematic=False), PolyCode(5, 3),
                                  UncodedCode(3)], ids=repr)
@pytest.mark.parametrize("array", [np.arange, torch.arange], ids=["numpy", "torch"])
def test_one_packet_is_the_packet_of_the_whole_encoding(code, array):
    blocks = split_blocks(array(3 * 2 * 4 * 5, dtype=np.float64 if array is np.arange else torch.float64)
                          .reshape(3 * 2, 4, 5), code.k, axis=0, symbol_size=2)
    every = code.encode(blocks, axis=0, symbol_size=2)
    for j in range(code.n):
        one = code.encode_packet(blocks, j, axis=0, symbol_size=2)
        assert tuple(one.shape) == tuple(every[j].shape)
        if isinstance(code, PolyCode):  # one row of the generator: BLAS may round it apart from the product
            assert np.allclose(np.asarray(one), np.asarray(every[j]), rtol=1e-12, atol=0)
        else:  # shifts and additions in the same order: the same bits
            assert np.array_equal(np.asarray(one), np.asarray(every[j]))
    with pytest.raises(ValueError, match="unknown packet index"):
        code.encode_packet(blocks, code.n)


@pytest.mark.parametrize("n,k,systematic", CODES)
def test_wide_symbols_keep_the_extra_bytes_small_and_the_symbols_few(n, k, systematic):
    code = SAZDCode(n, k, systematic=systematic)
    for length in (1, 7, 1000, 2 ** 20 + 3):
        layout = wide_layout(length, k, code.padding)
        assert layout.padded_length >= length and layout.padding < k * layout.symbol_size
        assert 1 <= layout.symbols <= WIDE_MAX_SYMBOLS
        if length >= k * WIDE_MAX_SYMBOLS * 64 and code.padding <= WIDE_OVERHEAD * WIDE_MAX_SYMBOLS:
            assert code.padding / layout.symbols <= WIDE_OVERHEAD
    assert wide_layout(10 ** 6, 3, 0).symbols == 1  # a code that pads nothing: one symbol per block


@pytest.mark.parametrize("n,k,systematic", CODES)
def test_relay_restores_every_bit_from_every_k_subset(n, k, systematic):
    relay = RelayDissemination(CodeSettings(kind="shift-add", n=n, k=k, systematic=systematic))
    x = torch.randn(5, 7, 3, 11)
    x.view(-1)[:4] = torch.tensor([float("nan"), -0.0, float("inf"), 1e-45])  # payloads a float copy could lose
    x.view(torch.int32).view(-1)[4] = 0x7FC00123  # a NaN with a payload
    packets = relay.packets(x)
    assert len(packets) == n and all(p.numel() == relay.delivered(x.numel()) for p in packets)
    for used in itertools.combinations(range(n), k):
        back = relay.restore({j: packets[j] for j in used}, x.shape, torch.float32)
        assert torch.equal(back.view(torch.int32), x.view(torch.int32))


@pytest.mark.parametrize("n,k,systematic", CODES)
def test_relay_decoding_costs_the_same_calls_whatever_the_tensor_size(n, k, systematic):
    relay = RelayDissemination(CodeSettings(kind="shift-add", n=n, k=k, systematic=systematic))
    calls = []
    for numel in (3 * 10 ** 4, 3 * 10 ** 6):  # a hundred times the elements, as many symbols
        layout = relay.layout(numel)
        assert layout.symbols <= WIDE_MAX_SYMBOLS
        schedules = [relay.code.schedule(used, layout.symbols) for used in itertools.combinations(range(n), k)]
        calls.append(max(len(s.row_calls) for s in schedules))
    assert max(calls) <= 8 * WIDE_MAX_SYMBOLS and max(calls) <= 1.05 * min(calls)


def test_the_systematic_packets_are_only_copied():
    code = SAZDCode(8, 6)
    schedule = code.schedule(tuple(range(6)), wide_layout(10 ** 6, 6, code.padding).symbols)
    assert [op[0] for op in schedule.ops] == [COPY] * 6  # one copy per block: nothing to solve


def test_blocks_inside_the_tensor_are_views_and_only_the_padded_one_is_a_copy():
    x = torch.arange(10.0)
    blocks = split_blocks(x, 3)  # blocks of 4: the last holds 2 values and 2 zeros
    assert blocks[0].data_ptr() == x.data_ptr() and blocks[1].data_ptr() == x.data_ptr() + 4 * 4
    assert blocks[2].tolist() == [8.0, 9.0, 0.0, 0.0]
    assert not np.shares_memory(blocks[2].numpy(), x.numpy())


class FakeTransport:
    """What the server link's detach rule (Roster.detach_laggards) reads of a transport: kept-back messages and signs
    of life."""

    def __init__(self, oldest, heard):
        self.oldest, self.heard = oldest, heard
        self.failed, self.detached = set(), []
        self.stats = None
        self.outbox = self  # the send side: what is kept back, signs of life, dropping

    def oldest_kept(self, rank):
        return self.oldest.get(rank)

    def heard_from(self, rank):
        return self.heard[rank]

    def progress(self):
        return 0

    def drop(self, rank):
        return 3

    def isend(self, rank, data, envelope, urgent=False):
        self.detached.append(rank)


def test_only_a_worker_that_is_behind_and_silent_is_detached():
    # Rank 1 is 2 iterations behind and silent since before iteration 9; rank 2 as far behind but it
    # acknowledged something during iteration 9 (slow, not stopped); rank 3 is not behind at all.
    transport = FakeTransport(oldest={1: 8, 2: 8}, heard={1: 100.0, 2: 105.0, 3: 0.0})
    link = MPIServerLink(transport, [1, 2, 3], detach_after=2, say=lambda line: None)
    link.roster.iteration = 10
    link.roster.started = {8: 98.0, 9: 104.0, 10: 110.0}
    link.roster.detach_laggards([1, 2, 3])
    assert transport.detached == [1] and list(link.members.detached) == [1]
    assert link.members.log == [{"rank": 1, "detached_at": 10, "readmitted_at": None}]


def self_transport(hook):
    from mpi4py import MPI

    return Transport(MPI.COMM_SELF, cuda_aware="false", timeout_s=10.0, send_hook=hook)


def test_a_message_waits_on_its_emulated_link_while_the_sender_goes_on():
    due = []

    def link(dest, envelope, nbytes):  # every message crosses in 0.15 s, one after another
        due.append(max([time.perf_counter()] + due) + 0.15)
        return due[-1]

    t = self_transport(link)
    start = time.perf_counter()
    handles = [t.isend(0, np.full(2, i, np.float32), Envelope(Kind.COMMAND, i)) for i in range(2)]
    assert time.perf_counter() - start < 0.1  # isend returns at once
    assert all(h.requests is None for h in handles)  # held back on the link
    assert t.recv(0, Envelope(Kind.COMMAND, 0)).tolist() == [0, 0]
    assert time.perf_counter() - start >= 0.15
    assert t.recv(0, Envelope(Kind.COMMAND, 1)).tolist() == [1, 1]
    assert time.perf_counter() - start >= 0.3
    t.close()


def test_a_message_received_is_a_sign_of_life():
    t = self_transport(None)
    before = t.outbox.heard_from(0)
    time.sleep(0.01)
    t.isend(0, np.zeros(1, np.float32), Envelope(Kind.COMMAND, 1))
    t.recv(0, Envelope(Kind.COMMAND, 1))
    assert t.outbox.heard_from(0) > before
    t.close()


def test_processor_time_per_iteration_adds_the_workers_reports():
    reports = [{"cpu_s": 2.0, "cpu_steps": 10}, {"cpu_s": 3.0, "cpu_steps": 10}, {"cpu_s": 0.0, "cpu_steps": 0}]
    figures = cpu_per_iteration(0.1, reports)
    assert figures == pytest.approx({"server": 0.1, "workers": 0.5, "total": 0.6})
