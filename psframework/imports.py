"""User code named in a config: "package.module:factory" paths, imported and called with one-line errors."""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable, Collection, Mapping, Optional

from psframework.errors import ConfigError


def is_import_path(text: str) -> bool:
    """Return whether a name is a "package.module:factory" path rather than a built-in name."""
    return ":" in text


def load_factory(path: str, key: str) -> Callable[..., Any]:
    """Import "package.module:factory" (or "path/to/file.py:factory") and return the callable.

    ConfigError names `key` and the path when it does not import or is not callable.
    """
    module_name, _, attribute = path.rpartition(":")
    if not module_name or not attribute:
        raise ConfigError(f"{key}: got {path!r}, expected package.module:factory or path/to/file.py:factory")
    try:
        module = _import_file(module_name) if module_name.endswith(".py") else importlib.import_module(module_name)
    except Exception as exc:  # any failure inside the user's module is theirs to see, in one line
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ConfigError(f"{key}: {path!r} does not import: {type(exc).__name__}: {text}") from None
    factory: Any = module
    for part in attribute.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise ConfigError(f"{key}: module {module_name!r} has no attribute {attribute!r} (from {path!r})")
    if not callable(factory):
        raise ConfigError(f"{key}: {path!r} is a {type(factory).__name__}, expected a callable factory")
    return factory


def _import_file(filename: str) -> Any:
    """Import a Python file (relative paths from the current directory) once per process."""
    import importlib.util
    import os
    import sys

    full = os.path.abspath(filename)
    name = "psf_user_" + "".join(c if c.isalnum() else "_" for c in full)
    if name in sys.modules:
        return sys.modules[name]
    if not os.path.isfile(full):
        raise FileNotFoundError(f"no file {full} (relative paths start at the current directory)")
    spec = importlib.util.spec_from_file_location(name, full)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def call_factory(factory: Callable[..., Any], args: Mapping[str, Any], key: str,
                 offered: Optional[Mapping[str, Any]] = None, via_kwargs: Collection[str] = ()) -> Any:
    """Call a factory with `args`, adding each `offered` keyword it takes that `args` does not give.

    Offered keywords (such as in_channels and num_classes) let a factory adapt to the dataset. A factory
    takes one when its signature names it, or, for a name in `via_kwargs`, when it has **kwargs.
    """
    kwargs = dict(args)
    for name, value in (offered or {}).items():
        if name not in kwargs and accepts(factory, name, name in via_kwargs):
            kwargs[name] = value
    name = getattr(factory, "__qualname__", repr(factory))
    try:
        return factory(**kwargs)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"{key}: factory {name} failed with {type(exc).__name__}: {exc}") from None


def accepts(factory: Callable[..., Any], name: str, via_kwargs: bool) -> bool:
    """Return whether a factory's signature names keyword `name` (or, if via_kwargs, has **kwargs)."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a built-in without a signature: offer nothing
        return False
    named = parameters.get(name)
    if named is not None:
        return named.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return via_kwargs and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
