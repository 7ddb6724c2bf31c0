"""Threaded zigzag decoding: bit-identical to one thread, split plans, the thread setting and its errors."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from psframework.arrays import backend_of
from psframework.arrays.cuda_backends import CupyBackend
from psframework.codes import SAZDCode, get_decode_threads, set_decode_threads
from psframework.codes import threads as decode_threads
from psframework.codes import zigzag
from psframework.codes.zigzag import MIN_STRIPE_SYMBOL_BYTES, plan_stripes


@pytest.fixture
def small_stripes(monkeypatch):
    """Split block sets of a few KiB, so threaded decoding is exercised on small arrays."""
    monkeypatch.setattr(zigzag, "MIN_STRIPE_SYMBOL_BYTES", 8)


@pytest.fixture
def pool_calls(monkeypatch):
    """Record how many stripes each pool run was handed."""
    counts = []
    run = decode_threads.POOL.run

    def spy(tasks):
        counts.append(len(tasks))
        run(tasks)

    monkeypatch.setattr(decode_threads.POOL, "run", spy)
    return counts


@pytest.fixture
def clean_setting(monkeypatch):
    monkeypatch.delenv(decode_threads.ENV_VAR, raising=False)
    set_decode_threads(None)
    yield monkeypatch
    set_decode_threads(None)


def make_blocks(rng, dtype, k, shape):
    if np.dtype(dtype).kind == "f":
        return [rng.standard_normal(shape).astype(dtype) for _ in range(k)]
    info = np.iinfo(dtype)
    return [rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True) for _ in range(k)]


def bits(x: np.ndarray) -> np.ndarray:
    """The array's raw bits, so -0.0 and NaN payloads count as differences too."""
    return np.ascontiguousarray(x).view(np.uint8)


# (n, k, axis, symbol_size, block shape, arrival set); the 4-systematic-lost sets are the longest zigzag chains
CASES = [
    (12, 8, 0, 1, (16, 40), (4, 5, 6, 7, 8, 9, 10, 11)),
    (12, 8, 0, 1, (16, 40), (0, 1, 2, 5, 8, 9, 10, 11)),
    (16, 12, 1, 2, (3, 32, 40), (0, 2, 4, 6, 8, 10, 11, 12, 13, 14, 15, 1)),
    (16, 12, 1, 2, (3, 32, 40), (4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)),
    (20, 16, -1, 1, (6, 16), (0, 1, 2, 5, 7, 8, 9, 10, 11, 13, 14, 15, 16, 17, 18, 19)),
    (20, 16, 0, 3, (48, 5, 7), (3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 19)),
    (7, 4, 2, 1, (2, 3, 10, 33), (3, 4, 5, 6)),
]


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("n, k, axis, symbol_size, shape, arrived", CASES)
def test_threaded_decode_is_bit_identical_to_one_thread(small_stripes, pool_calls, dtype, n, k, axis, symbol_size,
                                                        shape, arrived):
    code = SAZDCode(n, k)
    rng = np.random.default_rng(n * 100 + k)
    blocks = make_blocks(rng, dtype, k, shape)
    packets = code.encode(blocks, axis=axis, symbol_size=symbol_size)
    given = {j: packets[j] for j in arrived}
    one = code.decode_joined(given, axis=axis, symbol_size=symbol_size, threads=1)
    assert pool_calls == []  # one thread: no pool
    for threads in (2, 3, 4):
        got = code.decode_joined(given, axis=axis, symbol_size=symbol_size, threads=threads)
        assert pool_calls[-1] > 1  # the decode really was split
        np.testing.assert_array_equal(bits(got), bits(one))
    if dtype == np.int32:  # and exact
        np.testing.assert_array_equal(one, np.concatenate(blocks, axis=axis))
    else:
        assert np.abs(one - np.concatenate(blocks, axis=axis)).max() < 1e-4


def test_threaded_decode_at_the_real_threshold():
    # (12,8) with 4 systematic packets lost, float32 symbols of 96 KiB: just large enough for 2 stripes
    n, k, L, width = 12, 8, 16, 2 * MIN_STRIPE_SYMBOL_BYTES // 4
    assert len(plan_stripes(1, width, 4, 2)) == 2 and len(plan_stripes(1, width - 16, 4, 2)) == 1
    code = SAZDCode(n, k)
    rng = np.random.default_rng(0)
    blocks = [rng.standard_normal((L, width)).astype(np.float32) for _ in range(k)]
    packets = code.encode(blocks)
    for arrived in [(4, 5, 6, 7, 8, 9, 10, 11), (0, 1, 2, 5, 8, 9, 10, 11)]:
        given = {j: packets[j] for j in arrived}
        one = code.decode_joined(given, threads=1)
        two = code.decode_joined(given, threads=2)
        np.testing.assert_array_equal(bits(two), bits(one))
        assert np.abs(one - np.concatenate(blocks)).max() < 1e-4


def test_threaded_decode_into_a_reused_output_and_from_strided_packets(small_stripes, pool_calls):
    code = SAZDCode(12, 8)
    rng = np.random.default_rng(1)
    blocks = [rng.standard_normal((16, 72)).astype(np.float32) for _ in range(8)]
    packets = code.encode(blocks)
    wide = [np.zeros((p.shape[0], 2 * p.shape[1]), dtype=np.float32) for p in packets]
    for w, p in zip(wide, packets):
        w[:, ::2] = p
    strided = {j: wide[j][:, ::2] for j in range(4, 12)}  # every other column: no canonical view without a copy
    assert not strided[4].flags.c_contiguous
    one = code.decode_joined(strided, threads=1)
    out = np.full_like(one, np.nan)
    decoded = code.decode(strided, threads=2, out=out)
    assert all(np.shares_memory(d, out) for d in decoded) and pool_calls[-1] == 2
    np.testing.assert_array_equal(bits(out), bits(one))


def test_torch_cpu_tensors_decode_like_numpy_in_threads(small_stripes, pool_calls):
    code = SAZDCode(16, 12)
    rng = np.random.default_rng(2)
    blocks = [rng.standard_normal((2, 16, 10)).astype(np.float32) for _ in range(12)]
    packets = code.encode(blocks, axis=1)
    arrived = tuple(range(4, 16))
    expected = code.decode_joined({j: packets[j] for j in arrived}, axis=1, threads=1)
    tensors = {j: torch.from_numpy(packets[j].copy()).requires_grad_(j == 5) for j in arrived}
    got = code.decode_joined(tensors, axis=1, threads=2)
    assert isinstance(got, torch.Tensor) and not got.requires_grad and pool_calls[-1] == 2  # 2 outer rows
    np.testing.assert_array_equal(bits(got.numpy()), bits(expected))


def test_tensors_numpy_cannot_view_take_the_torch_path():
    code = SAZDCode(7, 4)
    blocks = [torch.arange(24, dtype=torch.bfloat16).reshape(8, 3) + i for i in range(4)]  # small ints: exact
    packets = code.encode(blocks)
    torch_backend = backend_of(packets[0])
    assert torch_backend.host_views(packets) is None
    assert torch_backend.host_views([p.float() for p in packets]) is not None
    decoded = code.decode({j: packets[j] for j in (1, 4, 5, 6)}, threads=2)
    for got, want in zip(decoded, blocks):
        assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    assert CupyBackend.host_views(None, [np.zeros(3)]) is None  # device arrays keep their single stream


# --- how a decode is split ---

def test_small_block_sets_stay_in_one_stripe():
    every = (slice(None), slice(None))
    assert plan_stripes(1, 1 << 20, 4, 1) == [every]  # one thread
    assert plan_stripes(1, 16384, 4, 4) == [every]  # 64 KiB symbols (an 8 MiB (12,8) block set): one stripe
    assert plan_stripes(64, 48, 4, 4) == [every]  # 12 KiB symbols
    assert len(plan_stripes(1, 3 * MIN_STRIPE_SYMBOL_BYTES // 4, 4, 8)) == 3  # as many as the size allows


@pytest.mark.parametrize("width, itemsize, threads", [(1 << 16, 4, 2), (100003, 4, 3), (40001, 16, 4),
                                                      (1 << 15, 8, 4)])
def test_column_stripes_cover_every_column_on_cache_line_boundaries(width, itemsize, threads):
    stripes = plan_stripes(1, width, itemsize, threads)
    assert len(stripes) == threads
    starts = [columns.start for _, columns in stripes]
    stops = [columns.stop for _, columns in stripes]
    assert starts[0] == 0 and stops[-1] == width and starts[1:] == stops[:-1]
    assert all(start * itemsize % 64 == 0 for start in starts)
    sizes = [stop - start for start, stop in zip(starts, stops)]
    assert max(sizes) - min(sizes) <= 2 * 64 // itemsize  # balanced
    assert all(lines == slice(None) for lines, _ in stripes)


def test_outer_rows_split_when_they_divide_evenly():
    width = MIN_STRIPE_SYMBOL_BYTES // 4  # one stripe's worth per outer row
    assert plan_stripes(4, width, 4, 2) == [(slice(0, 2), slice(None)), (slice(2, 4), slice(None))]
    assert [lines for lines, _ in plan_stripes(6, width, 4, 3)] == [slice(0, 2), slice(2, 4), slice(4, 6)]
    assert all(lines == slice(None) for lines, _ in plan_stripes(3, width, 4, 2))  # 3 rows: columns instead


# --- the thread setting ---

@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2", None])
def test_bad_thread_counts_are_rejected(bad):
    code = SAZDCode(5, 3)
    packets = code.encode([np.zeros((4, 2)) for _ in range(3)])
    given = {j: packets[j] for j in (0, 3, 4)}
    if bad is not None:
        with pytest.raises(ValueError, match=rf"threads must be an integer >= 1, got {bad!r}"):
            code.decode(given, threads=bad)
        with pytest.raises(ValueError, match=rf"threads must be an integer >= 1, got {bad!r}"):
            code.decode_joined(given, threads=bad)
        with pytest.raises(ValueError, match=rf"threads must be an integer >= 1, got {bad!r}"):
            set_decode_threads(bad)


def test_default_threads_come_from_the_setting_then_the_environment(clean_setting):
    default = decode_threads.default_decode_threads()
    assert 1 <= default <= decode_threads.MAX_DEFAULT_THREADS
    assert get_decode_threads() == default
    clean_setting.setenv(decode_threads.ENV_VAR, "3")
    set_decode_threads(None)
    assert get_decode_threads() == 3
    set_decode_threads(5)
    assert get_decode_threads() == 5
    set_decode_threads(None)
    assert get_decode_threads() == 3


@pytest.mark.parametrize("raw, message", [
    ("many", "environment variable PSF_DECODE_THREADS: got 'many', expected an integer >= 1"),
    ("0", "environment variable PSF_DECODE_THREADS: got '0', expected an integer >= 1")])
def test_bad_environment_thread_counts_are_rejected(clean_setting, raw, message):
    clean_setting.setenv(decode_threads.ENV_VAR, raw)
    with pytest.raises(ValueError, match=message):
        get_decode_threads()
    code = SAZDCode(4, 3)
    packets = code.encode([np.ones(3) for _ in range(3)])
    with pytest.raises(ValueError, match=message):
        code.decode({j: packets[j] for j in range(3)})  # the default is needed, so the bad value surfaces
    assert [float(b[0]) for b in code.decode({j: packets[j] for j in range(3)}, threads=1)] == [1.0, 1.0, 1.0]


# --- the pool ---

def test_pool_reraises_a_stripe_error_after_every_stripe_finished():
    finished = []

    def ok(i):
        def task():
            finished.append(i)
        return task

    def fail():
        raise RuntimeError("stripe failed")

    with pytest.raises(RuntimeError, match="stripe failed"):
        decode_threads.POOL.run([ok(0), fail, ok(2)])
    assert sorted(finished) == [0, 2]
    with pytest.raises(RuntimeError, match="stripe failed"):
        decode_threads.POOL.run([fail, ok(1)])
    assert sorted(finished) == [0, 1, 2]
    decode_threads.POOL.run([ok(3), ok(4)])  # still usable
    assert sorted(finished) == [0, 1, 2, 3, 4]


def test_concurrent_decodes_share_the_pool(small_stripes):
    code = SAZDCode(12, 8)
    rng = np.random.default_rng(3)
    blocks = [rng.integers(-2**31, 2**31, size=(16, 64), dtype=np.int64).astype(np.int32) for _ in range(8)]
    packets = code.encode(blocks)
    want = np.concatenate(blocks)
    failures = []

    def decode_many(arrived):
        given = {j: packets[j] for j in arrived}
        for _ in range(20):
            if not np.array_equal(code.decode_joined(given, threads=2), want):
                failures.append(arrived)

    callers = [threading.Thread(target=decode_many, args=(arrived,))
               for arrived in [(4, 5, 6, 7, 8, 9, 10, 11), (0, 1, 2, 5, 8, 9, 10, 11), (0, 2, 4, 6, 8, 9, 10, 11)]]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert failures == []
