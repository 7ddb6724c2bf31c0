"""Let the tests import a torchvision build whose C++ operators do not load with the installed torch.

Where only torchvision's CUDA build can be installed next to a CPU torch (as on the machines that run
this suite), torchvision's `_C` library fails to load and `import torchvision` then stops at
registering fake kernels for two operators that were never defined. Classification models never call
those operators, so defining their schemas lets the real model code load. Nothing happens unless
torchvision is imported, or where its library loads. tests/conftest.py puts this directory on
PYTHONPATH, so every process the tests start (MPI ranks too) gets the hook.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

# The operators torchvision's _meta_registrations registers without checking that its library loaded.
SCHEMAS = ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
           "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_LIBRARIES = []  # the definitions live as long as their Library objects


def define_missing_operators(package_dir: str) -> bool:
    """Define torchvision's operator schemas if its C++ library does not load; return whether it did not."""
    import torch

    library = next((os.path.join(package_dir, name) for name in sorted(os.listdir(package_dir))
                    if name.startswith("_C") and name.endswith(".so")), None)
    try:
        if library is None:
            raise OSError("no _C library")
        torch.ops.load_library(library)
        return False
    except OSError:
        lib = torch.library.Library("torchvision", "DEF")
        for schema in SCHEMAS:
            lib.define(schema)
        _LIBRARIES.append(lib)
        return True


class _TorchvisionHook(importlib.abc.MetaPathFinder):
    """Run define_missing_operators once, just before torchvision itself is imported."""

    def find_spec(self, name, path=None, target=None):
        if name != "torchvision":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            define_missing_operators(list(spec.submodule_search_locations)[0])
        return spec


if not any(isinstance(finder, _TorchvisionHook) for finder in sys.meta_path):
    sys.meta_path.insert(0, _TorchvisionHook())
