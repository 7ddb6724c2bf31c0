"""Build an erasure code by kind and size."""

from __future__ import annotations

from psframework.codes.base import Code
from psframework.codes.poly import PolyCode, UncodedCode
from psframework.codes.sazd import SAZDCode

CODE_KINDS = ("shift-add", "polynomial", "split")


def make_code(kind: str, n: int, k: int, *, systematic: bool = True, nodes: str = "chebyshev") -> Code:
    """Return a shift-and-add code, a polynomial code (on `nodes`) or the plain split (k = n), by kind."""
    if kind == "split":
        if k != n:
            raise ValueError(f"split: got k={k} with n={n}, expected k = n (every worker is needed)")
        return UncodedCode(n)
    if kind == "polynomial":
        return PolyCode(n, k, nodes=nodes)
    if kind == "shift-add":
        return SAZDCode(n, k, systematic=systematic)
    raise ValueError(f"code kind: got {kind!r}, expected one of {', '.join(CODE_KINDS)}")
