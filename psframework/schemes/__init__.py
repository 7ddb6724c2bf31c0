"""Training schemes: one module per scheme, holding its server and worker sides."""

from __future__ import annotations

from typing import Callable


def get_runner(scheme: str) -> Callable:
    """Return the `run(cfg, comm=None)` function of a scheme."""
    if scheme == "reference":
        from psframework.schemes.reference import run
        return run
    if scheme in ("sazd", "poly", "uncoded"):
        from psframework.schemes.coded import run
        return run
    if scheme == "ps":
        from psframework.schemes.ps import run
        return run
    if scheme == "stanza":
        from psframework.schemes.stanza import run
        return run
    if scheme == "sazd-naive":
        from psframework.schemes.sazd_naive import run
        return run
    raise NotImplementedError(f"scheme {scheme!r} is not available in this version of psframework")


__all__ = ["get_runner"]
