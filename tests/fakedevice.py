"""A fake CUDA array over host memory: exercises the device buffer paths on a machine without a GPU."""

from __future__ import annotations

import numpy as np


class FakeDeviceArray:
    """Host memory dressed as a CUDA array (interface version 3, no stream to synchronise).

    With MPICH on a CPU the pointer really is host memory, so handing it to MPI exercises the
    CUDA-aware path, and with device copies replaced by host copies, the staging path.
    """

    def __init__(self, host: np.ndarray) -> None:
        self.host = host

    @property
    def __cuda_array_interface__(self) -> dict:
        h = self.host
        return {"shape": h.shape, "typestr": h.dtype.str, "data": (h.ctypes.data, False),
                "strides": None if h.flags.c_contiguous else h.strides, "version": 3, "stream": None}
