"""Symbol layout helpers, bit-exact transport and the measured error budget."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from psframework.codes import (BlockLayout, SAZDCode, arrival_sets, choose_symbol_size, from_bits, join_blocks,
                               max_symbols_within, measure_decode_error, plan_layout, split_blocks, to_bits)


@given(channels=st.integers(1, 2000), budget=st.integers(1, 64))
def test_choose_symbol_size_keeps_blocks_within_budget(channels, budget):
    size = choose_symbol_size(channels, budget)
    symbols = -(-channels // size)
    assert symbols <= budget
    assert size == 1 or -(-channels // (size - 1)) > symbols  # no smaller size gives as few symbols
    assert symbols * size - channels < size  # padding below one symbol


def test_plan_layout():
    layout = plan_layout(100, 3, max_symbols=16)
    assert layout == BlockLayout(100, 3, 3)
    assert (layout.symbols, layout.block_length, layout.padded_length, layout.padding) == (12, 36, 108, 8)
    assert plan_layout(64, 4, symbol_size=2).symbols == 8


@given(length=st.integers(1, 40), k=st.integers(1, 6), symbol_size=st.integers(1, 4), axis=st.integers(0, 1))
def test_split_and_join_round_trip(length, k, symbol_size, axis):
    shape = [3, 3]
    shape[axis] = length
    x = np.arange(np.prod(shape)).reshape(shape) + 1
    blocks = split_blocks(x, k, axis=axis, symbol_size=symbol_size)
    layout = BlockLayout(length, k, symbol_size)
    assert len(blocks) == k and all(b.shape[axis] == layout.block_length for b in blocks)
    joined = np.concatenate(blocks, axis=axis)
    assert np.all(np.take(joined, range(length, layout.padded_length), axis=axis) == 0)
    back = join_blocks(blocks, axis=axis, length=length)
    assert np.array_equal(back, x) and back.flags.c_contiguous


def test_split_without_padding_returns_views():
    x = np.arange(12)
    blocks = split_blocks(x, 3, symbol_size=2)
    assert all(np.shares_memory(b, x) for b in blocks)


def test_coded_layer_with_padding_and_symbols_end_to_end():
    # 10 channels, k=3, symbol size 2: padded to 12, coded, two packets lost, decoded and cut back
    code = SAZDCode(5, 3)
    x = torch.randn(2, 10, 4, 4, dtype=torch.float64)
    blocks = split_blocks(x, 3, axis=1, symbol_size=2)
    packets = code.encode(blocks, axis=1, symbol_size=2)
    y = code.decode_joined({j: packets[j] for j in (1, 3, 4)}, axis=1, symbol_size=2, length=10)
    torch.testing.assert_close(y, x, rtol=0, atol=1e-12)


SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -3.5e38, 1.0, np.pi], dtype=np.float64)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_bit_exact_transport_numpy(dtype):
    rng = np.random.default_rng(0)
    blocks = [rng.standard_normal((9, 4)).astype(dtype) for _ in range(4)]
    with np.errstate(over="ignore"):  # -3.5e38 is -inf in float16
        blocks[1][:, 0] = SPECIALS.astype(dtype)
    if dtype == np.float32:
        blocks[2][0, 0] = np.array([0x7FC01234], dtype=np.uint32).view(np.float32)[0]  # NaN with a payload
    code = SAZDCode(7, 4)
    bits = [to_bits(b) for b in blocks]
    assert bits[0].dtype.kind == "u" and bits[0].dtype.itemsize == np.dtype(dtype).itemsize
    assert np.shares_memory(bits[0], blocks[0])
    packets = code.encode(bits)
    decoded = code.decode({j: packets[j] for j in (6, 5, 4, 0)})
    for got, want in zip(decoded, blocks):
        back = from_bits(got, dtype)
        assert back.dtype == dtype
        assert back.tobytes() == want.tobytes()  # every bit, NaN payloads and signed zeros included


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_bit_exact_transport_torch(dtype):
    torch.manual_seed(0)
    blocks = [torch.randn(9, 4).to(dtype) for _ in range(3)]
    blocks[0][:, 0] = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-3, -2.0, 1.0, 3.0])
    code = SAZDCode(6, 3, systematic=False)
    bits = [to_bits(b) for b in blocks]
    assert not bits[0].dtype.is_floating_point and bits[0].element_size() == blocks[0].element_size()
    packets = code.encode(bits)
    decoded = code.decode({j: packets[j] for j in (5, 3, 1)})
    for got, want in zip(decoded, blocks):
        back = from_bits(got, dtype)
        assert back.dtype == dtype
        assert torch.equal(back.view(got.dtype), want.view(got.dtype))


def test_integers_pass_through_bit_views():
    x = np.arange(4, dtype=np.int16)
    assert to_bits(x) is x
    t = torch.arange(4, dtype=torch.int64)
    assert to_bits(t) is t


def test_arrival_sets_exhaustive_or_seeded_sample():
    sets, exhaustive = arrival_sets(5, 3)
    assert exhaustive and len(sets) == 10
    sample, exhaustive = arrival_sets(20, 16, limit=30, seed=7)
    assert not exhaustive and len(sample) == len(set(sample)) == 30
    assert all(len(s) == 16 and list(s) == sorted(s) for s in sample)
    assert arrival_sets(20, 16, limit=30, seed=7)[0] == sample


def test_measured_error_grows_with_block_length_and_budget_picks_longest_fit():
    code = SAZDCode(8, 5)
    errors = [measure_decode_error(code, L).worst for L in (4, 16, 64)]
    assert errors[0] < errors[1] < errors[2]
    budget = 2 * errors[1]
    best = max_symbols_within(code, budget, candidates=(4, 16, 64), limit=None)
    assert best == 16
    with pytest.raises(ValueError, match=r"no block length in \[64\] keeps"):
        max_symbols_within(code, errors[0] / 10, candidates=(64,), limit=None)
    with pytest.raises(ValueError, match=r"budget must be a positive relative error, got 0"):
        max_symbols_within(code, 0)
