"""SAZD codec: construction, exhaustive decodability, exactness, accuracy, backends and layouts."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from fakedevice import FakeDeviceArray
from psframework.arrays import backend_of
from psframework.codes import (NotDecodableError, SAZDCode, compile_schedule, has_increasing_difference,
                               nonsystematic_shifts, systematic_shifts)
from psframework.codes import zigzag
from psframework.codes.zigzag import _NEG_P, _NSUM, _PSUM, COPY, ISUB, RNEG, RSUB, SUB, run_backend_rows, run_rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def relative_error(decoded, blocks) -> float:
    got = np.stack([np.asarray(b, dtype=np.float64) for b in decoded])
    want = np.stack(blocks).astype(np.float64)
    return float(np.abs(got - want).max() / np.abs(want).max())


# --- construction ---

def test_systematic_shift_matrix():
    shifts = systematic_shifts(7, 4)
    assert (shifts[:4] == np.where(np.eye(4, dtype=bool), 0, -1)).all()
    assert shifts[4].tolist() == [0, 0, 0, 0]
    assert shifts[5].tolist() == [0, 1, 2, 3]
    assert shifts[6].tolist() == [0, 2, 4, 6]


def test_nonsystematic_shift_matrix():
    assert nonsystematic_shifts(3, 3).tolist() == [[0, 0, 0], [0, 1, 2], [0, 2, 4]]


@pytest.mark.parametrize("n, k, systematic, padding", [
    (4, 3, True, 0), (5, 3, True, 2), (12, 8, True, 21), (20, 16, True, 45), (6, 6, True, 0),
    (4, 3, False, 6), (12, 8, False, 77), (1, 1, False, 0),
])
def test_padding_and_packet_length(n, k, systematic, padding):
    code = SAZDCode(n, k, systematic)
    assert code.padding == padding == int(code.shifts.max())
    assert code.packet_length(10) == 10 + padding
    assert code.packet_length(12, symbol_size=3) == 12 + 3 * padding
    assert code.block_length(code.packet_length(12, 3), 3) == 12


def test_shifts_are_read_only():
    code = SAZDCode(5, 3)
    with pytest.raises(ValueError):
        code.shifts[0, 0] = 5


@pytest.mark.parametrize("n", range(1, 13))
def test_constructions_have_increasing_difference(n):
    for k in range(1, n + 1):
        assert has_increasing_difference(systematic_shifts(n, k))
        assert has_increasing_difference(nonsystematic_shifts(n, k))


def test_increasing_difference_detects_violations():
    assert not has_increasing_difference(np.array([[0, 0, 0], [0, 1, 1]]))
    assert not has_increasing_difference(np.array([[0, 2, 1], [0, 0, 0]]))
    assert has_increasing_difference(np.array([[0, -1, 0], [0, 5, 1]]))  # one common block pair only


def test_compile_reports_undecodable_packet_sets():
    shifts = np.array([[0, 1], [0, 1]])  # equal rows: no symbol is ever alone
    with pytest.raises(NotDecodableError, match="cannot be zigzag decoded"):
        compile_schedule(shifts, (0, 1), 4)


# --- exhaustive decodability, exactness and accuracy ---

@pytest.mark.parametrize("systematic", [True, False])
@pytest.mark.parametrize("n", range(1, 11))
def test_every_k_subset_decodes_bit_exact_and_accurate(n, systematic):
    rng = np.random.default_rng(n)
    L = 16
    for k in range(1, n + 1):
        code = SAZDCode(n, k, systematic)
        ints = [rng.integers(0, 2**32, size=(L, 3), dtype=np.uint32) for _ in range(k)]
        floats = [rng.standard_normal((L, 16)).astype(np.float32) for _ in range(k)]
        int_packets, float_packets = code.encode(ints), code.encode(floats)
        for chosen in itertools.combinations(range(n), k):
            decoded = code.decode({j: int_packets[j] for j in chosen})
            for got, want in zip(decoded, ints):
                assert got.dtype == np.uint32 and np.array_equal(got, want), (n, k, chosen)
            error = relative_error(code.decode({j: float_packets[j] for j in chosen}), floats)
            assert error <= 1e-5, (n, k, systematic, chosen, error)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint64])
def test_integer_decoding_wraps_around(dtype):
    info = np.iinfo(dtype)
    code = SAZDCode(7, 4)
    rng = np.random.default_rng(0)
    blocks = [rng.integers(info.min, info.max, size=(8, 5), dtype=dtype, endpoint=True) for _ in range(4)]
    blocks[0][:] = info.max  # sums overflow for sure
    packets = code.encode(blocks)
    decoded = code.decode({j: packets[j] for j in (3, 4, 5, 6)})
    for got, want in zip(decoded, blocks):
        assert got.dtype == dtype and np.array_equal(got, want)


def test_schedules_only_copy_subtract_and_sum():
    code = SAZDCode(12, 8)
    for chosen in [(4, 5, 6, 7, 8, 9, 10, 11), (0, 1, 6, 7, 8, 9, 10, 11), (0, 2, 4, 6, 8, 9, 10, 11)]:
        kinds = {op[0] for op in code.schedule(chosen, 16).ops}
        assert kinds <= {COPY, SUB, ISUB, RSUB, RNEG}


def test_schedule_merges_runs_into_whole_block_slices():
    k, L = 6, 16
    code = SAZDCode(8, k)
    schedule = code.schedule((0, 1, 3, 4, 5, 6), L)  # block 2 lost, rebuilt from the plain-sum parity
    assert len(schedule.ops) == 2 * k - 2  # k-1 copies, then one subtraction per other block
    assert all(op[2] == L for op in schedule.ops)
    assert schedule.levels == 2


def test_schedule_is_compiled_once():
    code = SAZDCode(6, 4)
    assert code.schedule((2, 3, 4, 5), 8) is code.schedule((2, 3, 4, 5), 8)


def test_decoder_prefers_systematic_then_low_parity_packets():
    code = SAZDCode(7, 4)
    assert code.choose_packets(range(7)) == (0, 1, 2, 3)
    assert code.choose_packets([6, 5, 4, 2, 1]) == (1, 2, 4, 5)
    rng = np.random.default_rng(1)
    blocks = [rng.integers(-100, 100, size=(5,)) for _ in range(4)]
    packets = code.encode(blocks)
    decoded = code.decode({j: packets[j] for j in (6, 5, 4, 2, 1)})  # extra packet ignored
    assert all(np.array_equal(a, b) for a, b in zip(decoded, blocks))


def test_packets_are_shifted_sums():
    code = SAZDCode(6, 3, systematic=True)
    blocks = [np.array([1, 2]), np.array([10, 20]), np.array([100, 200])]
    packets = code.encode(blocks)
    assert code.padding == 4
    assert packets[0].tolist() == [1, 2, 0, 0, 0, 0]
    assert packets[3].tolist() == [111, 222, 0, 0, 0, 0]
    assert packets[4].tolist() == [1, 12, 120, 200, 0, 0]
    assert packets[5].tolist() == [1, 2, 10, 20, 100, 200]


# --- axes, symbol sizes, joined output ---

def test_axis_and_symbol_size_shift_whole_symbols():
    code = SAZDCode(5, 2)
    rng = np.random.default_rng(2)
    blocks = [rng.integers(0, 1000, size=(2, 6, 3)) for _ in range(2)]
    packets = code.encode(blocks, axis=1, symbol_size=3)
    assert packets[4].shape == (2, 6 + 3 * code.padding, 3)
    # parity row r=2 shifts block 1 by 2 symbols of 3 elements: 6 elements along axis 1
    expected = np.zeros_like(packets[4])
    expected[:, 0:6] += blocks[0]
    expected[:, 6:12] += blocks[1]
    assert np.array_equal(packets[4], expected)
    decoded = code.decode({3: packets[3], 4: packets[4]}, axis=-2, symbol_size=3)
    assert all(np.array_equal(a, b) for a, b in zip(decoded, blocks))


def test_decode_joined_returns_one_array_cut_to_length():
    code = SAZDCode(6, 4)
    x = np.arange(2 * 16).reshape(2, 16)
    blocks = [x[:, 4 * i:4 * i + 4] for i in range(4)]
    packets = code.encode(blocks, axis=1)
    joined = code.decode_joined({j: packets[j] for j in (1, 2, 4, 5)}, axis=1)
    assert np.array_equal(joined, x)
    cut = code.decode_joined({j: packets[j] for j in (1, 2, 4, 5)}, axis=1, length=14)
    assert np.array_equal(cut, x[:, :14])


# --- torch ---

def test_torch_and_numpy_agree():
    code = SAZDCode(9, 6)
    rng = np.random.default_rng(3)
    ints = [rng.integers(-2**31, 2**31, size=(12, 4), dtype=np.int64).astype(np.int32) for _ in range(6)]
    floats = [rng.standard_normal((12, 4)) for _ in range(6)]
    for blocks in (ints, floats):
        np_packets = code.encode(blocks)
        t_packets = code.encode([torch.from_numpy(b.copy()) for b in blocks])
        for a, b in zip(np_packets, t_packets):
            assert isinstance(b, torch.Tensor)
            np.testing.assert_array_equal(a, b.numpy())  # encoding is order-free: identical bits
        chosen = (0, 2, 6, 7, 8, 4)
        np_blocks = code.decode({j: np_packets[j] for j in chosen})
        t_blocks = code.decode({j: t_packets[j] for j in chosen})
        for a, b, want in zip(np_blocks, t_blocks, blocks):
            assert isinstance(b, torch.Tensor) and b.dtype == torch.from_numpy(want).dtype
            if want.dtype.kind == "i":
                np.testing.assert_array_equal(b.numpy(), want)
                np.testing.assert_array_equal(a, want)
            else:
                np.testing.assert_allclose(b.numpy(), a, rtol=0, atol=1e-12)


def test_torch_decode_accepts_non_contiguous_and_grad_tensors():
    code = SAZDCode(6, 4)
    base = [torch.randn(5, 8, dtype=torch.float64) for _ in range(4)]
    packets = code.encode([b.t() for b in base], axis=0)  # blocks are (8, 5) views
    views = {j: packets[j].t().contiguous().t() for j in (0, 3, 4, 5)}  # non-contiguous packets
    assert not views[4].is_contiguous()
    views[5] = views[5].clone().requires_grad_(True)
    decoded = code.decode(views, axis=0)
    for got, want in zip(decoded, base):
        assert not got.requires_grad
        torch.testing.assert_close(got, want.t(), rtol=0, atol=1e-12)


def test_coded_convolution_decodes_to_the_layer_output():
    # worker j computes conv(X, packet_j); the SA-coded output channels decode along axis 1
    torch.manual_seed(0)
    x = torch.randn(2, 3, 9, 9, dtype=torch.float64)
    weight = torch.randn(8, 3, 3, 3, dtype=torch.float64)
    code = SAZDCode(6, 4)
    packets = code.encode(list(weight.split(2, dim=0)), axis=0, symbol_size=1)
    replies = {j: F.conv2d(x, packets[j]) for j in (5, 1, 4, 2)}
    y = code.decode_joined(replies, axis=1)
    torch.testing.assert_close(y, F.conv2d(x, weight), rtol=1e-12, atol=1e-10)


# --- property-based ---

DTYPES = [np.int32, np.uint16, np.int64, np.float64]


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_round_trip_property(data):
    n = data.draw(st.integers(1, 7), label="n")
    k = data.draw(st.integers(1, n), label="k")
    systematic = data.draw(st.booleans(), label="systematic")
    ndim = data.draw(st.integers(1, 3), label="ndim")
    axis = data.draw(st.integers(-ndim, ndim - 1), label="axis")
    symbol_size = data.draw(st.integers(1, 3), label="symbol_size")
    symbols = data.draw(st.integers(1, 9), label="symbols")
    shape = [data.draw(st.integers(1, 4), label=f"dim{d}") for d in range(ndim)]
    shape[axis] = symbols * symbol_size
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    arrived = data.draw(st.lists(st.integers(0, n - 1), min_size=k, max_size=n, unique=True), label="arrived")
    use_torch = data.draw(st.booleans(), label="torch") and dtype != np.uint16
    rng = np.random.default_rng(len(arrived) * 100 + symbols)
    if np.dtype(dtype).kind == "f":
        blocks = [rng.standard_normal(shape).astype(dtype) for _ in range(k)]
    else:
        info = np.iinfo(dtype)
        blocks = [rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True) for _ in range(k)]
    code = SAZDCode(n, k, systematic)
    inputs = [torch.from_numpy(b.copy()) for b in blocks] if use_torch else blocks
    packets = code.encode(inputs, axis=axis, symbol_size=symbol_size)
    assert all(tuple(p.shape)[axis] == code.packet_length(shape[axis], symbol_size) for p in packets)
    decoded = code.decode({j: packets[j] for j in arrived}, axis=axis, symbol_size=symbol_size)
    assert len(decoded) == k
    for got, want in zip(decoded, blocks):
        got = got.numpy() if use_torch else got
        assert got.shape == want.shape and got.dtype == want.dtype
        if np.dtype(dtype).kind == "f":
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-9 * max(1.0, float(np.abs(want).max())))
        else:
            np.testing.assert_array_equal(got, want)


@given(n=st.integers(1, 30), k=st.integers(1, 30))
def test_padding_formula(n, k):
    if k > n:
        n, k = k, n
    assert SAZDCode(n, k).padding == max(0, n - k - 1) * (k - 1)
    assert SAZDCode(n, k, systematic=False).padding == (n - 1) * (k - 1)


def test_decode_into_a_reused_output():
    code = SAZDCode(7, 4)
    rng = np.random.default_rng(4)
    blocks = [rng.integers(-50, 50, size=(6, 3)) for _ in range(4)]
    packets = code.encode(blocks)
    out = np.full((24, 3), 99)
    decoded = code.decode({j: packets[j] for j in (1, 4, 5, 6)}, out=out)
    assert all(np.shares_memory(d, out) and np.array_equal(d, b) for d, b in zip(decoded, blocks))
    joined = code.decode_joined({j: packets[j] for j in (0, 2, 5, 6)}, out=out)
    assert joined is out and np.array_equal(out, np.concatenate(blocks))
    given = {j: packets[j] for j in range(4)}
    with pytest.raises(ValueError, match=r"out has shape \(20, 3\), expected \(24, 3\)"):
        code.decode(given, out=np.zeros((20, 3), dtype=out.dtype))
    with pytest.raises(ValueError, match=r"out has dtype float64, expected int64 like the packets"):
        code.decode(given, out=np.zeros((24, 3)))
    with pytest.raises(ValueError, match=r"out must be contiguous, got a strided view"):
        code.decode(given, out=np.zeros((24, 6), dtype=out.dtype)[:, ::2])
    with pytest.raises(ValueError, match=r"out is a torch array but the packets are numpy arrays"):
        code.decode(given, out=torch.zeros(24, 3, dtype=torch.int64))


def test_strided_sums_are_exact_on_both_backends():
    code = SAZDCode(12, 8)
    chosen = (0, 1, 6, 7, 8, 9, 10, 11)  # four blocks lost: long zigzag chains of lone symbols
    kinds = {op[0] for op in code.schedule(chosen, 16).ops}
    assert {RSUB, RNEG} <= kinds
    rng = np.random.default_rng(5)
    blocks = [rng.integers(-2**31, 2**31, size=(16, 2, 3), dtype=np.int64).astype(np.int32) for _ in range(8)]
    for inputs in (blocks, [torch.from_numpy(b.copy()) for b in blocks]):
        packets = code.encode(inputs, axis=0)
        decoded = code.decode({j: packets[j] for j in chosen})
        for got, want in zip(decoded, blocks):
            np.testing.assert_array_equal(np.asarray(got), want)
    symbol_blocks = [b.reshape(8, 2, 2, 3).transpose(1, 0, 2, 3).reshape(2, 16, 3) for b in blocks]
    packets = code.encode(symbol_blocks, axis=1, symbol_size=2)
    decoded = code.decode({j: packets[j] for j in chosen}, axis=1, symbol_size=2)
    assert all(np.array_equal(got, want) for got, want in zip(decoded, symbol_blocks))


def test_bound_schedule_writes_merged_negations_first():
    code = SAZDCode(12, 8)
    used = (4, 5, 6, 7, 8, 9, 10, 11)
    rnegs = [op for op in code.schedule(used, 16).ops if op[0] == RNEG]
    calls = code.schedule(used, 16).row_calls
    negs = [call for call in calls if call[0] == _NEG_P]
    assert calls[:len(negs)] == tuple(negs)  # before the first round
    assert len(negs) < len(rnegs)  # neighbouring start values share one slice
    starts = {(slot, dst.start + j, src.start + j)
              for _, (_, dst), slot, (_, src) in negs for j in range(dst.stop - dst.start)}
    assert starts == {(slot, dst, src) for _, dst, _, slot, src, _ in rnegs}
    sums = sum(call[0] in (_NSUM, _PSUM) for call in calls)
    assert sums == sum(op[0] in (RSUB, RNEG) for op in code.schedule(used, 16).ops)


def test_unevenly_spaced_terms_fall_back_to_subtractions():
    # parity rows (0, 1, 3) and (0, 2, 5) space a symbol's terms unevenly in the decoded buffer: no strided sum
    shifts = np.array([[0, -1, -1], [-1, 0, -1], [-1, -1, 0], [0, 1, 3], [0, 2, 5]])
    assert has_increasing_difference(shifts)
    L, used = 6, (2, 3, 4)
    schedule = compile_schedule(shifts, used, L)
    kinds = {op[0] for op in schedule.ops}
    assert not kinds & {RSUB, RNEG} and ISUB in kinds
    rng = np.random.default_rng(6)
    for dtype in (np.int16, np.float64):
        blocks = rng.integers(-2**15, 2**15, size=(3, L, 4)).astype(dtype)
        packets = []
        for j in used:
            packet = np.zeros((L + 5, 4), dtype=dtype)
            for i in np.flatnonzero(shifts[j] >= 0):
                packet[shifts[j, i]:shifts[j, i] + L] += blocks[i]
            packets.append(packet)
        out = np.empty((3 * L, 4), dtype=dtype)
        schedule.run(backend_of(out), packets, out, 0, 1)
        np.testing.assert_array_equal(out, blocks.reshape(3 * L, 4))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128, np.int32, np.uint8])
def test_strided_sums_across_dtypes_and_layouts(dtype):
    code = SAZDCode(12, 8)
    chosen = (4, 5, 6, 7, 8, 9, 10, 11)
    rng = np.random.default_rng(7)
    raw = rng.integers(-40, 40, size=(8, 3, 16 * 2, 5))  # small integers: every sum is exact in any dtype
    blocks = [(b + 1j * np.flip(b) if np.dtype(dtype).kind == "c" else b).astype(dtype) for b in raw]
    packets = code.encode(blocks, axis=1, symbol_size=2)
    decoded = code.decode({j: packets[j] for j in chosen}, axis=1, symbol_size=2)
    for got, want in zip(decoded, blocks):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    if np.dtype(dtype).kind != "c":
        t_decoded = code.decode({j: torch.from_numpy(packets[j].copy()) for j in chosen}, axis=1, symbol_size=2)
        for got, want in zip(t_decoded, blocks):
            np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("dtype, count", [(np.float32, 5), (np.float64, 8), (np.float32, 11), (np.int64, 5),
                                          (np.complex64, 3)])
def test_negated_sum_may_write_over_a_summed_slice(dtype, count):
    # host decodes: BLAS (short floating sums of unsplit block sets) or a ufunc reduction; other arrays:
    # the backend's reduction. Each may overwrite one of its inputs.
    rng = np.random.default_rng(count)
    rows = rng.integers(-1000, 1000, size=(2, 40, 6)).astype(dtype)
    run = (slice(None), slice(1, 1 + 3 * (count - 1) + 1, 3))
    want = -rows[run].sum(axis=1)
    for blas in (True, False):
        got = rows.copy()
        run_rows(((_NSUM, run, count, (slice(None), 7)),), [], got, blas=blas)  # row 7 is in the run
        np.testing.assert_array_equal(got[:, 7], want)
        np.testing.assert_array_equal(np.delete(got, 7, axis=1), np.delete(rows, 7, axis=1))
    if np.dtype(dtype).kind != "c":
        tensor = torch.from_numpy(rows.copy())
        run_backend_rows(backend_of(tensor), ((_NSUM, run, count, (slice(None), 7)),), [], tensor)
        np.testing.assert_array_equal(tensor[:, 7].numpy(), want)


@pytest.mark.parametrize("dtype", [">f4", ">i4", "<f8"])
def test_decode_takes_any_byte_order(dtype):
    code = SAZDCode(12, 8)
    rng = np.random.default_rng(3)
    blocks = [(rng.standard_normal((16, 40)) * 100).astype(dtype) for _ in range(8)]
    packets = code.encode(blocks)
    decoded = code.decode({j: packets[j] for j in range(4, 12)})  # four systematic packets lost: strided sums
    for got, want in zip(decoded, blocks):
        if np.dtype(dtype).kind == "i":
            assert np.array_equal(got, want)
        else:
            want = want.astype(np.float64)
            assert np.abs(got.astype(np.float64) - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("dtype", [torch.int32, torch.float32])
def test_device_arrays_decode_like_host_arrays(monkeypatch, dtype):
    # GPU arrays run the same canonical calls through their backend, one operation each; here torch CPU
    # tensors are sent down that path by hiding their host views.
    code = SAZDCode(12, 8)
    gen = torch.Generator().manual_seed(5)
    blocks = [(torch.randn(2, 32, 5, generator=gen) * 1000).to(dtype) for _ in range(8)]
    packets = code.encode(blocks, axis=1, symbol_size=2)
    backend_type = type(backend_of(packets[0]))
    for used in [tuple(range(8)), tuple(range(4, 12)), (0, 1, 2, 5, 8, 9, 10, 11)]:
        arrived = {j: packets[j] for j in used}
        host = code.decode_joined(arrived, axis=1, symbol_size=2)
        with monkeypatch.context() as patch:
            patch.setattr(backend_type, "host_views", lambda self, arrays: None)
            device = code.decode_joined(arrived, axis=1, symbol_size=2)
        want = torch.cat(blocks, dim=1)
        if dtype == torch.int32:  # wrap-around integers: exact on both paths
            assert torch.equal(device, host) and torch.equal(device, want)
        else:  # the sums may round differently (BLAS on the host): both within the decoding error
            for got in (device, host):
                assert float((got - want).abs().max()) <= 2e-5 * float(want.abs().max())


@pytest.mark.parametrize("dtype", [np.int32, np.float64])
def test_fake_device_arrays_decode_through_backend_calls(monkeypatch, dtype):
    # arrays of a device backend have no host views: encode and decode run one backend call per operation
    rng = np.random.default_rng(8)
    blocks = [rng.integers(-1000, 1000, size=(2, 32, 5)).astype(dtype) for _ in range(8)]
    code = SAZDCode(12, 8)
    monkeypatch.setattr(zigzag, "run_rows", None)  # a host decode would fail
    packets = code.encode([FakeDeviceArray(b) for b in blocks], axis=1, symbol_size=2)
    assert all(isinstance(p, FakeDeviceArray) for p in packets)
    want = np.concatenate(blocks, axis=1)
    for used in [tuple(range(8)), tuple(range(4, 12)), (0, 1, 2, 5, 8, 9, 10, 11)]:
        got = code.decode_joined({j: packets[j] for j in used}, axis=1, symbol_size=2)
        assert isinstance(got, FakeDeviceArray)
        np.testing.assert_array_equal(got.host, want)  # small integers: every sum is exact in both dtypes
    got.host[...] = 0
    blocks_back = code.decode({j: packets[j] for j in range(4, 12)}, axis=1, symbol_size=2, out=got)
    assert np.shares_memory(blocks_back[0].host, got.host)
    np.testing.assert_array_equal(got.host, want)


def test_codes_and_arrays_import_without_torch():
    script = ("import sys; import psframework.codes, psframework.arrays; "
              "assert 'torch' not in sys.modules and 'mpi4py' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", script], check=True, cwd=ROOT)
