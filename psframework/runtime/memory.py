"""Keep freed memory in the process, so that the tensors of every iteration reuse pages already mapped.

glibc's malloc gives large blocks their own mappings and returns them to the system when freed; a
rank that receives, encodes and decodes megabytes per round then faults every page in again each
time (about 3000 page faults per iteration on a vgg-small worker, a tenth of its processor time).
Raising the mapping threshold to its maximum and the trim threshold well above a rank's working set
makes freed blocks of up to 32 MiB reusable at once. Elsewhere (another C library, another system)
nothing changes.
"""

from __future__ import annotations

import ctypes
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest accepted value on 64-bit systems
TRIM_THRESHOLD = 1 << 30


def keep_freed_memory() -> bool:
    """Make glibc keep freed blocks of up to 32 MiB for reuse; return whether it took the settings."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    # The threshold first: setting either one turns glibc's own adaptive threshold off for good.
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
