"""Checks of the integers and axes that every part of the codes takes: one ValueError line each."""

from __future__ import annotations

import operator
from typing import Any


def _as_index(value: Any, message: str) -> int:
    """Return `value` as an int (booleans refused); raise ValueError(message) otherwise."""
    if isinstance(value, bool):
        raise ValueError(message)
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(message) from None


def check_int(value: Any, name: str, minimum: int) -> int:
    """Return `value` as an int; raise ValueError unless it is an integer >= `minimum`."""
    number = _as_index(value, f"{name} must be an integer >= {minimum}, got {value!r}")
    if number < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {number}")
    return number


def check_axis(axis: Any, ndim: int) -> int:
    """Return `axis` normalised to 0..ndim-1; raise ValueError when it is out of range."""
    axis = _as_index(axis, f"axis must be an integer, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for {ndim}-dimensional arrays "
                         f"(expected {-ndim} <= axis < {ndim})")
    return axis % ndim
