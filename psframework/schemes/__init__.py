"""Training schemes: the registry, the one driver, and one module per scheme with its server and worker sides.

A run starts at psframework.schemes.entry.train.
"""

from __future__ import annotations

from psframework.schemes.registry import Scheme, SchemeError, get_scheme, register, scheme_names

__all__ = ["Scheme", "SchemeError", "get_scheme", "register", "scheme_names"]
