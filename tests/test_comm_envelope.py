"""Envelopes, MPI tags and the wire header of psframework.comm (no MPI needed)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psframework.comm.envelope import (DTYPE_NAMES, HEADER_BYTES, LAST_LAYERED, MAX_KIND, MAX_LAYER, MAX_NDIM,
                                       MAX_PHASE, MAX_TAG, MIN_TAG_UB, Envelope, Kind, Phase, decode_header,
                                       encode_header, make_tag, split_tag)
from psframework.comm.errors import WatchdogTimeout


def test_every_kind_layer_phase_has_its_own_tag_below_the_guaranteed_tag_ub():
    tags = {}
    for kind in range(MAX_KIND + 1):
        for phase in range(MAX_PHASE + 1):
            for layer in range(MAX_LAYER + 1 if kind <= LAST_LAYERED else 1):  # the other kinds have no layer
                tag = make_tag(kind, layer, phase)
                assert 0 <= tag < MIN_TAG_UB
                assert split_tag(tag) == (kind, layer, phase)
                tags[tag] = (kind, layer, phase)
    layered = LAST_LAYERED + 1
    assert len(tags) == (layered * (MAX_LAYER + 1) + MAX_KIND + 1 - layered) * (MAX_PHASE + 1)
    assert max(tags) == MAX_TAG < MIN_TAG_UB


def test_control_and_stanza_messages_have_kinds_of_their_own_without_a_layer():
    stop = Envelope(Kind.STOP, 3, phase=Phase.OTHER)
    assert split_tag(stop.tag) == (Kind.STOP, 0, Phase.OTHER) and str(stop) == "STOP iteration 3 OTHER"
    assert Envelope(Kind.FEATURES, 3).tag != Envelope(Kind.REPLY, 3).tag
    with pytest.raises(ValueError, match="envelope layer: got 2, expected 0 for a STOP message"):
        Envelope(Kind.STOP, 3, layer=2)
    with pytest.raises(ValueError, match="expected kind 0"):
        make_tag(Kind.STOP, 1, 0)


def test_envelope_tag_leaves_the_iteration_out():
    a = Envelope(Kind.REPLY, 3, layer=7, phase=Phase.BACKWARD)
    assert a.tag == a.with_iteration(4).tag == make_tag(Kind.REPLY, 7, Phase.BACKWARD)
    assert a.tag != Envelope(Kind.REPLY, 3, layer=7, phase=Phase.FORWARD).tag
    assert str(a) == "REPLY iteration 3 layer 7 BACKWARD"


@pytest.mark.parametrize("fields, name", [
    ((MAX_KIND + 1, 0, 0, 0), "kind"), ((0, -1, 0, 0), "iteration"), ((0, 0, MAX_LAYER + 1, 0), "layer"),
    ((0, 0, 0, MAX_PHASE + 1), "phase"), ((True, 0, 0, 0), "kind"), ((0, 1.0, 0, 0), "iteration"),
])
def test_envelope_rejects_out_of_range_fields_naming_them(fields, name):
    with pytest.raises(ValueError, match=f"envelope {name}: got"):
        Envelope(*fields)


def test_envelope_accepts_numpy_integers():
    e = Envelope(np.int64(1), np.int32(5), np.int16(2), np.int8(1))
    assert e.tag == make_tag(1, 2, 1)


def test_make_tag_rejects_bad_fields():
    with pytest.raises(ValueError, match="expected kind 0"):
        make_tag(0, MAX_LAYER + 1, 0)
    with pytest.raises(ValueError, match="tag: got 40000"):
        split_tag(40000)


@settings(max_examples=200, deadline=None)
@given(kind=st.integers(0, MAX_KIND), iteration=st.integers(0, (1 << 62) - 1), layer=st.integers(0, MAX_LAYER),
       phase=st.integers(0, MAX_PHASE), dtype=st.sampled_from(DTYPE_NAMES),
       shape=st.lists(st.integers(0, 1 << 40), max_size=MAX_NDIM), nbytes=st.integers(0, 1 << 50))
def test_header_round_trips(kind, iteration, layer, phase, dtype, shape, nbytes):
    envelope = Envelope(kind, iteration, layer if kind <= LAST_LAYERED else 0, phase)
    words = encode_header(envelope, dtype, tuple(shape), nbytes)
    assert words.dtype == np.int64 and words.nbytes == HEADER_BYTES
    header = decode_header(words)
    assert header.envelope == envelope
    assert (header.dtype, header.shape, header.nbytes) == (dtype, tuple(shape), nbytes)


def test_header_rejects_what_it_cannot_carry():
    e = Envelope(Kind.COMMAND, 0)
    with pytest.raises(ValueError, match="dtype: got 'float8'"):
        encode_header(e, "float8", (1,), 1)
    with pytest.raises(ValueError, match="9 dimensions"):
        encode_header(e, "float32", (1,) * 9, 4)


def test_a_payload_taken_for_a_header_is_reported():
    payload = np.arange(16, dtype=np.int64)
    with pytest.raises(ValueError, match="magic"):
        decode_header(payload)
    words = encode_header(Envelope(Kind.COMMAND, 0), "float32", (2,), 8)
    words[5] = 99  # dtype code out of range
    with pytest.raises(ValueError, match="dtype code 99"):
        decode_header(words)


def test_watchdog_error_names_the_silent_ranks():
    error = WatchdogTimeout([3, 5], "REPLY iteration 2 layer 0 FORWARD", 1.5, arrived=[1, 2], needed=4)
    assert isinstance(error, RuntimeError)
    assert error.ranks == [3, 5] and error.arrived == [1, 2]
    assert str(error) == ("watchdog: no answer from rank(s) 3, 5 for REPLY iteration 2 layer 0 FORWARD after "
                          "1.5 s (2 of 4 needed replies arrived: ranks 1, 2)")
