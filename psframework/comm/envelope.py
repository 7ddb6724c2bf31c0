"""Message envelopes: (kind, iteration, layer, phase), MPI tags and the wire header."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Tuple

import numpy as np

KIND_BITS = 3
PHASE_BITS = 2
LAYER_BITS = 10
MAX_LAYER = (1 << LAYER_BITS) - 1
MAX_PHASE = (1 << PHASE_BITS) - 1
MAX_ITERATION = (1 << 62) - 1
# The MPI standard guarantees only TAG_UB >= 32767. The kinds with a layer put kind, phase and layer
# in 15 bits (kinds 0..6 of 3 bits); the kinds without one take the next few tags, one per
# (kind, phase), so that every tag stays strictly below 32767.
MIN_TAG_UB = 32767


class Kind(IntEnum):
    """What a message is for; the transport treats kinds only as part of the tag.

    The kinds up to EVAL carry a layer; the others are single messages of the rounds' vocabulary,
    and their layer is always 0.
    """

    COMMAND = 0  # server -> worker: an input to compute on (activations, output gradients)
    REPLY = 1  # worker -> server: the result of a command
    PACKET = 2  # worker <-> worker: a coded packet of the relay dissemination
    PARAMS = 3  # parameters sent out
    GRADS = 4  # gradients sent in
    CONTROL = 5  # acknowledgements and signals of tools and tests
    EVAL = 6  # evaluation traffic
    STATE = 7  # server -> worker: send your state
    STATE_REPLY = 8  # worker -> server: its state
    STOP = 9  # the end (and the worker's report)
    DETACH = 10  # server -> worker: you were left out
    REJOIN = 11  # worker -> server: back (at the iteration it was detached at)
    READMIT = 12  # server -> worker: go on here, with a fresh state
    SNAPSHOT = 13  # server -> worker: your state, please
    SNAPSHOT_REPLY = 14  # worker -> server: its state
    STOP_EARLY = 15  # server -> worker: the run stops after this iteration
    STARTED = 16  # worker -> server: ready to train
    FEATURES = 17  # worker -> server (stanza): the features of the worker's shard
    FEATURE_GRADS = 18  # server -> worker (stanza): the gradient of the loss with respect to those features
    SCALE = 19  # server -> worker: an optimizer step's loss scale and whether the step is taken (loss scaling)
    SCALE_REPLY = 20  # worker -> server: whether the workers' own summed gradients are finite (loss scaling)


class Phase(IntEnum):
    """Which pass of an iteration a message belongs to."""

    FORWARD = 0
    BACKWARD = 1
    UPDATE = 2
    OTHER = 3


MAX_KIND = max(Kind)
LAST_LAYERED = Kind.EVAL  # the last kind with a layer
_SINGLE_BASE = (LAST_LAYERED + 1) << (LAYER_BITS + PHASE_BITS)  # the first tag of the kinds without a layer
_INTS = (int, Kind, Phase)  # exact types accepted without further checks (bool is not among them)


def _name(enum: type, value: int) -> str:
    try:
        return enum(value).name
    except ValueError:
        return str(value)


@dataclass(frozen=True)
class Envelope:
    """Identify one message: what it is, which iteration, layer and phase it belongs to."""

    kind: int
    iteration: int
    layer: int = 0
    phase: int = Phase.FORWARD

    def __post_init__(self) -> None:
        kind, iteration, layer, phase = self.kind, self.iteration, self.layer, self.phase
        if (type(kind) in _INTS and type(iteration) in _INTS and type(layer) in _INTS and type(phase) in _INTS
                and 0 <= kind <= MAX_KIND and 0 <= layer <= MAX_LAYER and 0 <= phase <= MAX_PHASE
                and 0 <= iteration <= MAX_ITERATION and (layer == 0 or kind <= LAST_LAYERED)):
            return
        for name, value, high in (("kind", kind, MAX_KIND), ("layer", layer, MAX_LAYER),
                                  ("phase", phase, MAX_PHASE), ("iteration", iteration, MAX_ITERATION)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= high:
                raise ValueError(f"envelope {name}: got {value!r}, expected an integer in 0..{high}")
        if layer != 0 and kind > LAST_LAYERED:
            raise ValueError(f"envelope layer: got {layer!r}, expected 0 for a {_name(Kind, kind)} message "
                             "(it has no layer)")

    @property
    def tag(self) -> int:
        """Return the MPI tag: kind, phase and layer; the iteration travels in the header."""
        return make_tag(self.kind, self.layer, self.phase)

    def with_iteration(self, iteration: int) -> "Envelope":
        """Return the same envelope for another iteration."""
        return Envelope(self.kind, iteration, self.layer, self.phase)

    def __str__(self) -> str:
        layer = f" layer {self.layer}" if self.kind <= LAST_LAYERED else ""
        return f"{_name(Kind, self.kind)} iteration {self.iteration}{layer} {_name(Phase, self.phase)}"


def make_tag(kind: int, layer: int, phase: int) -> int:
    """Return the tag of (kind, layer, phase); always below 32767, the smallest legal TAG_UB."""
    if (not 0 <= kind <= MAX_KIND or not 0 <= layer <= (MAX_LAYER if kind <= LAST_LAYERED else 0)
            or not 0 <= phase <= MAX_PHASE):
        raise ValueError(f"tag fields: got kind={kind}, layer={layer}, phase={phase}, "
                         f"expected kind 0..{MAX_KIND}, layer 0..{MAX_LAYER} (0 from kind {LAST_LAYERED + 1}), "
                         f"phase 0..{MAX_PHASE}")
    if kind > LAST_LAYERED:
        return _SINGLE_BASE + (int(kind) - LAST_LAYERED - 1) * (MAX_PHASE + 1) + int(phase)
    return (int(kind) << (LAYER_BITS + PHASE_BITS)) | (int(phase) << LAYER_BITS) | int(layer)


MAX_TAG = make_tag(MAX_KIND, 0, MAX_PHASE)


def split_tag(tag: int) -> Tuple[int, int, int]:
    """Return (kind, layer, phase) of a tag made by make_tag."""
    if not 0 <= tag <= MAX_TAG:
        raise ValueError(f"tag: got {tag}, expected 0..{MAX_TAG}")
    if tag >= _SINGLE_BASE:
        single, phase = divmod(tag - _SINGLE_BASE, MAX_PHASE + 1)
        return LAST_LAYERED + 1 + single, 0, phase
    return tag >> (LAYER_BITS + PHASE_BITS), tag & MAX_LAYER, (tag >> LAYER_BITS) & MAX_PHASE


# Wire header: int64 words sent as a small message right before each payload. For flow control the
# ack word says how many messages the sender had received from the destination when it posted this
# one, and the paced word whether the sender limits its messages in flight and so needs acks.
MAGIC = 0x50534632  # "PSF2"
MAX_NDIM = 8
_FIXED_WORDS = 10
HEADER_WORDS = _FIXED_WORDS + MAX_NDIM
HEADER_BYTES = HEADER_WORDS * 8
_W_MAGIC, _W_KIND, _W_ITER, _W_LAYER, _W_PHASE, _W_DTYPE, _W_NDIM, _W_NBYTES, _W_ACK, _W_PACED = range(_FIXED_WORDS)

DTYPE_NAMES = ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64",
               "bool", "complex64", "complex128", "uint16", "uint32", "uint64")
DTYPE_CODES = {name: code for code, name in enumerate(DTYPE_NAMES)}


@dataclass(frozen=True)
class Header:
    """The decoded header of one message: its envelope and the payload's dtype and shape."""

    envelope: Envelope
    dtype: str
    shape: Tuple[int, ...]
    nbytes: int
    ack: int = 0  # messages the sender had received from this rank when it posted this one
    paced: bool = False  # whether the sender waits for acks before posting more


def new_header_buffer() -> np.ndarray:
    """Return an empty header buffer."""
    return np.zeros(HEADER_WORDS, dtype=np.int64)


def encode_header(envelope: Envelope, dtype: str, shape: Tuple[int, ...], nbytes: int) -> np.ndarray:
    """Return the header words for a payload of `dtype`, `shape` and `nbytes` bytes."""
    code = DTYPE_CODES.get(dtype)
    if code is None:
        raise ValueError(f"dtype: got {dtype!r}, expected one of {', '.join(DTYPE_NAMES)}")
    ndim = len(shape)
    if ndim > MAX_NDIM:
        raise ValueError(f"shape: got {ndim} dimensions {tuple(shape)}, expected at most {MAX_NDIM}")
    words = [MAGIC, envelope.kind, envelope.iteration, envelope.layer, envelope.phase, code, ndim, nbytes, 0, 0]
    words += shape
    words += _PADDING[ndim]
    return np.array(words, dtype=np.int64)


_PADDING = [[0] * (MAX_NDIM - n) for n in range(MAX_NDIM + 1)]


def set_flow(words: np.ndarray, ack: int, paced: bool) -> None:
    """Write the flow-control words: messages received from the destination, and whether acks are wanted."""
    words[_W_ACK] = ack
    words[_W_PACED] = int(paced)


def decode_header(words: np.ndarray) -> Header:
    """Return the Header held in `words`; raise ValueError on a corrupt header."""
    w = words.tolist()
    if w[_W_MAGIC] != MAGIC:
        raise ValueError(f"message header: got magic {w[_W_MAGIC]:#x}, expected {MAGIC:#x} "
                         "(a payload was taken for a header: sender and receiver disagree on the protocol)")
    code, ndim, nbytes, ack = w[_W_DTYPE], w[_W_NDIM], w[_W_NBYTES], w[_W_ACK]
    if not 0 <= code < len(DTYPE_NAMES) or not 0 <= ndim <= MAX_NDIM or nbytes < 0:
        raise ValueError(f"message header: got dtype code {code}, ndim {ndim}, nbytes {nbytes}, "
                         f"expected code < {len(DTYPE_NAMES)}, ndim <= {MAX_NDIM}, nbytes >= 0")
    envelope = Envelope(w[_W_KIND], w[_W_ITER], w[_W_LAYER], w[_W_PHASE])
    shape = tuple(w[_FIXED_WORDS:_FIXED_WORDS + ndim])
    return Header(envelope, DTYPE_NAMES[code], shape, nbytes, ack, bool(w[_W_PACED]))
