"""Build the erasure code a configuration asks for."""

from __future__ import annotations

from typing import Any

from psframework.codes.base import Code, check_int
from psframework.codes.poly import PolyCode, UncodedCode
from psframework.codes.sazd import SAZDCode

CODED_SCHEMES = ("sazd", "sazd-naive", "poly", "uncoded")


def make_code(config: Any) -> Code:
    """Return the code of `config.scheme` with the sizes in `config.code` (n, k, systematic, symbol_channels, nodes)."""
    scheme = getattr(config, "scheme", None)
    if scheme not in CODED_SCHEMES:
        raise ValueError(f"scheme {scheme!r} has no erasure code: expected one of {', '.join(CODED_SCHEMES)}")
    code = config.code
    check_int(code.symbol_channels, "code.symbol_channels", 1)
    if scheme == "uncoded":
        return UncodedCode(code.n)  # every worker is needed: k = n
    if scheme == "poly":
        return PolyCode(code.n, code.k, nodes=code.nodes)
    return SAZDCode(code.n, code.k, systematic=code.systematic)
