"""Atomic file writes: results and checkpoints are never half-written."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Callable, Optional, Sequence


def atomic_write(path: str, write: Callable[[Any], None], mode: str = "w") -> None:
    """Write a file through `write(fh)` to a temporary name, then rename it into place."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        # mkstemp creates the file private (0600); give it the permissions a new file normally gets.
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, mode) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str, text: str) -> None:
    """Write text to `path` atomically."""
    atomic_write(path, lambda fh: fh.write(text))


def leave_for_launcher(path: Optional[str], text: str) -> bool:
    """Write text to a file a launcher asked for (a name in a folder of its own), if that folder is here.

    The launcher runs on one node: a rank elsewhere, or run without the launcher, writes nothing.
    Return whether it wrote.
    """
    if not path or not os.path.isdir(os.path.dirname(path)):
        return False
    atomic_write_text(path, text)
    return True


def atomic_write_json(path: str, obj: Any) -> None:
    """Write `obj` as indented JSON to `path` atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_page(argv: Sequence[str], default: str, render: Callable[[], str]) -> int:
    """Write a generated page to argv[0], else `default` (through a temporary file and a rename); return 0."""
    path = argv[0] if argv else default
    atomic_write_text(path, render())
    print(f"psf: wrote {path}")
    return 0
