"""Bad inputs to the codes raise one clear ValueError naming the problem."""

from __future__ import annotations


import numpy as np
import pytest
import torch

from fakedevice import InterfaceOnlyArray
from psframework.codes import (PolyCode, SAZDCode, UncodedCode, choose_symbol_size, from_bits, join_blocks,
                               make_code, plan_layout, split_blocks, to_bits)

CODES = [lambda: SAZDCode(5, 3), lambda: SAZDCode(5, 3, systematic=False), lambda: PolyCode(5, 3),
         lambda: UncodedCode(3)]


def blocks_for(code, shape=(4, 2), dtype=np.float64):
    return [np.ones(shape, dtype=dtype) for _ in range(code.k)]


@pytest.mark.parametrize("make", [SAZDCode, PolyCode])
def test_bad_sizes(make):
    with pytest.raises(ValueError, match=r"k must be an integer >= 1, got 0"):
        make(3, 0)
    with pytest.raises(ValueError, match=r"n must be >= k, got n=2 < k=3"):
        make(2, 3)
    with pytest.raises(ValueError, match=r"n must be an integer >= 1, got 3.5"):
        make(3.5, 2)
    with pytest.raises(ValueError, match=r"k must be an integer >= 1, got True"):
        make(3, True)


def test_bad_uncoded_size_and_flags():
    with pytest.raises(ValueError, match=r"k must be an integer >= 1, got -1"):
        UncodedCode(-1)
    with pytest.raises(ValueError, match=r"systematic must be True or False, got 'yes'"):
        SAZDCode(4, 2, systematic="yes")
    with pytest.raises(ValueError, match=r"unknown nodes 'gauss': expected one of chebyshev, equispaced, integers"):
        PolyCode(4, 2, nodes="gauss")


@pytest.mark.parametrize("make", CODES)
def test_too_few_packets(make):
    code = make()
    packets = code.encode(blocks_for(code))
    with pytest.raises(ValueError, match=r"too few packets: got 2 \(\[0, 1\]\), need at least k=3"):
        code.decode({0: packets[0], 1: packets[1]})


@pytest.mark.parametrize("make", CODES)
def test_unknown_and_duplicate_indices(make):
    code = make()
    packets = code.encode(blocks_for(code))
    with pytest.raises(ValueError, match=rf"unknown packet index {code.n}: expected an integer in 0..{code.n - 1}"):
        code.decode({0: packets[0], 1: packets[1], 2: packets[2], code.n: packets[0]})
    with pytest.raises(ValueError, match=r"unknown packet index -1"):
        code.decode({-1: packets[0], 0: packets[0], 1: packets[1], 2: packets[2]})
    with pytest.raises(ValueError, match=r"unknown packet index 'a'"):
        code.decode({"a": packets[0], 0: packets[0], 1: packets[1], 2: packets[2]})
    with pytest.raises(ValueError, match=r"duplicate packet index 1"):
        code.decode([(0, packets[0]), (1, packets[1]), (1, packets[1]), (2, packets[2])])


@pytest.mark.parametrize("make", CODES)
def test_mismatched_packets(make):
    code = make()
    packets = code.encode(blocks_for(code))
    short = packets[2][:-1]
    with pytest.raises(ValueError, match=r"packet 2 has shape .*, expected .* like packet 0"):
        code.decode({0: packets[0], 1: packets[1], 2: short})
    with pytest.raises(ValueError, match=r"packet 1 has dtype float32, expected float64 like packet 0"):
        code.decode({0: packets[0], 1: packets[1].astype(np.float32), 2: packets[2]})
    with pytest.raises(ValueError, match=r"packet 1 is a torch array but packet 0 is a numpy array"):
        code.decode({0: packets[0], 1: torch.from_numpy(packets[1]), 2: packets[2]})
    with pytest.raises(ValueError, match=r"expected a NumPy array, torch tensor or CuPy array, got list"):
        code.decode({0: packets[0], 1: [1.0], 2: packets[2]})
    bare = InterfaceOnlyArray(packets[0])  # a device array the codes cannot compute on
    with pytest.raises(ValueError, match=r"expected a NumPy array, torch tensor or CuPy array, got InterfaceOnlyArray"):
        code.decode({0: bare, 1: packets[1], 2: packets[2]})


@pytest.mark.parametrize("make", CODES)
def test_mismatched_blocks(make):
    code = make()
    blocks = blocks_for(code)
    with pytest.raises(ValueError, match=r"block 1 has shape \(3, 2\), expected \(4, 2\) like block 0"):
        code.encode([blocks[0], np.ones((3, 2)), blocks[2]])
    with pytest.raises(ValueError, match=r"block 2 has dtype int64, expected float64 like block 0"):
        code.encode([blocks[0], blocks[1], np.ones((4, 2), dtype=np.int64)])
    with pytest.raises(ValueError, match=rf"expected k={code.k} blocks, got 2"):
        code.encode(blocks[:2])
    with pytest.raises(ValueError, match=r"blocks must be a list or tuple of 3 arrays, got ndarray"):
        code.encode(np.stack(blocks))


@pytest.mark.parametrize("make", CODES)
def test_axis_out_of_range(make):
    code = make()
    blocks = blocks_for(code)
    with pytest.raises(ValueError, match=r"axis 2 is out of range for 2-dimensional arrays "
                                         r"\(expected -2 <= axis < 2\)"):
        code.encode(blocks, axis=2)
    packets = code.encode(blocks)
    with pytest.raises(ValueError, match=r"axis -3 is out of range for 2-dimensional arrays"):
        code.decode(dict(enumerate(packets)), axis=-3)
    with pytest.raises(ValueError, match=r"axis must be an integer, got 0.0"):
        code.decode(dict(enumerate(packets)), axis=0.0)


@pytest.mark.parametrize("make", CODES)
def test_length_not_a_multiple_of_symbol_size(make):
    code = make()
    with pytest.raises(ValueError, match=r"block length 4 along the axis is not a multiple of symbol_size 3"):
        code.encode(blocks_for(code), symbol_size=3)
    with pytest.raises(ValueError, match=r"symbol_size must be an integer >= 1, got 0"):
        code.encode(blocks_for(code), symbol_size=0)
    packets = code.encode(blocks_for(code, shape=(6, 2)), symbol_size=2)
    length = packets[0].shape[0]
    bad = 4 if length % 4 else 5
    with pytest.raises(ValueError, match=rf"packet length {length} along axis 0 is not a multiple of "
                                         rf"symbol_size {bad}"):
        code.decode(dict(enumerate(packets)), symbol_size=bad)


def test_sazd_packet_too_short():
    code = SAZDCode(6, 3)  # padding 4 symbols
    with pytest.raises(ValueError, match=r"packet length 4 along axis 0 is too short"):
        code.decode({i: np.zeros(4) for i in range(3)})
    with pytest.raises(ValueError, match=r"packet length 8 is too short"):
        code.block_length(8, symbol_size=2)


def test_unsupported_dtypes():
    code = SAZDCode(4, 2)
    with pytest.raises(ValueError, match=r"dtype bool is not supported: expected an integer, floating or "
                                         r"complex dtype"):
        code.encode([np.zeros(3, dtype=bool)] * 2)
    with pytest.raises(ValueError, match=r"dtype torch.uint32 is not supported: torch cannot add or subtract it"):
        code.encode([torch.zeros(3, dtype=torch.uint32)] * 2)
    with pytest.raises(ValueError, match=r"dtype int32 is not supported by PolyCode: real polynomial codes "
                                         r"need a floating"):
        PolyCode(4, 2).encode([np.zeros(3, dtype=np.int32)] * 2)
    with pytest.raises(ValueError, match=r"blocks must have at least one dimension"):
        code.encode([np.array(1.0), np.array(2.0)])


def test_make_code_rejects_unknown_kinds_and_sizes():
    with pytest.raises(ValueError, match=r"code kind: got 'stanza', expected one of shift-add, polynomial, split"):
        make_code("stanza", 4, 3)
    with pytest.raises(ValueError, match=r"split: got k=3 with n=4, expected k = n"):
        make_code("split", 4, 3)


def test_layout_errors():
    with pytest.raises(ValueError, match=r"k must be an integer >= 1, got 0"):
        split_blocks(np.zeros(4), 0)
    with pytest.raises(ValueError, match=r"axis 1 is out of range for 1-dimensional arrays"):
        split_blocks(np.zeros(4), 2, axis=1)
    with pytest.raises(ValueError, match=r"length 9 exceeds the 8 elements of the blocks along axis 0"):
        join_blocks([np.zeros(4), np.zeros(4)], length=9)
    with pytest.raises(ValueError, match=r"block 1 has shape \(3,\), expected \(4,\) like block 0"):
        join_blocks([np.zeros(4), np.zeros(3)])
    with pytest.raises(ValueError, match=r"channels_per_block must be an integer >= 1, got 0"):
        choose_symbol_size(0, 16)
    with pytest.raises(ValueError, match=r"max_symbols must be an integer >= 1, got 0"):
        choose_symbol_size(8, 0)
    with pytest.raises(ValueError, match=r"give exactly one of max_symbols and symbol_size"):
        plan_layout(10, 2)
    with pytest.raises(ValueError, match=r"length 21 exceeds the 20 decoded elements along axis 0"):
        code = SAZDCode(4, 2)
        packets = code.encode([np.zeros(10), np.zeros(10)])
        code.decode_joined(dict(enumerate(packets)), length=21)


def test_bit_view_errors():
    with pytest.raises(ValueError, match=r"dtype complex128 has no bit view"):
        to_bits(np.zeros(2, dtype=np.complex128))
    with pytest.raises(ValueError, match=r"from_bits expects an integer array, got dtype float32"):
        from_bits(np.zeros(2, dtype=np.float32), np.float32)
    with pytest.raises(ValueError, match=r"cannot view uint32 as float64: widths differ"):
        from_bits(np.zeros(2, dtype=np.uint32), np.float64)
    with pytest.raises(ValueError, match=r"cannot view torch.int32 as torch.float64: widths differ"):
        from_bits(torch.zeros(2, dtype=torch.int32), torch.float64)
