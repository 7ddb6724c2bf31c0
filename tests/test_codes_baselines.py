"""Polynomial and uncoded baselines, the factory, and the SAZD versus polynomial accuracy gap."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from psframework.codes import (NODES, PolyCode, SAZDCode, UncodedCode, make_code, measure_decode_error,
                               vandermonde_nodes)


@pytest.mark.parametrize("nodes", NODES)
def test_poly_round_trip_every_subset(nodes):
    n, k = 6, 4
    code = PolyCode(n, k, nodes=nodes)
    rng = np.random.default_rng(0)
    blocks = [rng.standard_normal((3, 5)) for _ in range(k)]
    packets = code.encode(blocks, axis=1)
    assert len(packets) == n and all(p.shape == (3, 5) for p in packets) and code.padding == 0
    # packet j is the polynomial with the blocks as coefficients, evaluated at node j
    x = vandermonde_nodes(n, nodes)
    np.testing.assert_allclose(packets[2], sum(x[2] ** i * b for i, b in enumerate(blocks)), rtol=1e-12)
    for chosen in itertools.combinations(range(n), k):
        decoded = code.decode({j: packets[j] for j in chosen}, axis=1)
        for got, want in zip(decoded, blocks):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)


def test_poly_nodes():
    np.testing.assert_allclose(vandermonde_nodes(3, "chebyshev"), [np.cos(np.pi / 6), 0.0, -np.cos(np.pi / 6)],
                               atol=1e-15)
    np.testing.assert_allclose(vandermonde_nodes(3, "equispaced"), [-1.0, 0.0, 1.0])
    np.testing.assert_allclose(vandermonde_nodes(3, "integers"), [1.0, 2.0, 3.0])


def test_poly_inverse_is_cached_and_torch_agrees():
    code = PolyCode(7, 5)
    assert code.inverse((0, 2, 3, 5, 6)) is code.inverse((0, 2, 3, 5, 6))
    rng = np.random.default_rng(1)
    blocks = [rng.standard_normal((4, 3)) for _ in range(5)]
    np_packets = code.encode(blocks)
    t_packets = code.encode([torch.from_numpy(b) for b in blocks])
    chosen = (6, 5, 3, 2, 0)
    np_blocks = code.decode({j: np_packets[j] for j in chosen})
    t_blocks = code.decode({j: t_packets[j] for j in chosen})
    for a, b, want in zip(np_blocks, t_blocks, blocks):
        assert isinstance(b, torch.Tensor) and b.dtype == torch.float64
        np.testing.assert_allclose(b.numpy(), a, atol=1e-12)
        np.testing.assert_allclose(a, want, atol=1e-9)


def test_uncoded_round_trip():
    code = UncodedCode(3)
    assert (code.n, code.k, code.padding) == (3, 3, 0)
    blocks = [np.arange(6).reshape(2, 3) + 10 * i for i in range(3)]
    packets = code.encode(blocks)
    assert all(np.array_equal(p, b) and p is not b for p, b in zip(packets, blocks))
    decoded = code.decode({2: packets[2], 0: packets[0], 1: packets[1]})
    assert all(np.array_equal(d, b) for d, b in zip(decoded, blocks))
    tensors = code.decode({i: torch.from_numpy(p) for i, p in enumerate(packets)})
    assert all(isinstance(t, torch.Tensor) and np.array_equal(t.numpy(), b) for t, b in zip(tensors, blocks))


@pytest.mark.parametrize("name, kind", [("shift-add", SAZDCode), ("polynomial", PolyCode), ("split", UncodedCode)])
def test_make_code(name, kind):
    n, k = 6, 6 if name == "split" else 4
    code = make_code(name, n, k, systematic=False, nodes="equispaced")
    assert isinstance(code, kind) and (code.n, code.k) == (n, k)
    if kind is SAZDCode:
        assert code.systematic is False
    if kind is PolyCode:
        assert code.nodes == "equispaced"


def test_sazd_is_far_more_accurate_than_poly_at_20_16():
    sazd = measure_decode_error(SAZDCode(20, 16), 16, limit=24, seed=3)
    poly = measure_decode_error(PolyCode(20, 16, "chebyshev"), 16, limit=24, seed=3)
    assert not sazd.exhaustive and sazd.arrival_sets == 24
    assert sazd.worst <= 2e-5
    assert poly.worst >= 1000 * sazd.worst
