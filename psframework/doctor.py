"""psf doctor: print the MPI, thread, GPU and binding set-up of every rank.

Run it as ``psf doctor`` on one process or as ``mpiexec -n N python -m mpi4py -m psframework doctor``;
rank 0 prints one table with a row per rank.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
from typing import Any, Dict, List, Optional, Sequence

from psframework import environment
from psframework.comm.cuda import SETTINGS


def _versions() -> Dict[str, str]:
    """Return the versions of torch, CuPy and NumPy, and torch's view of CUDA."""
    import numpy
    import torch

    info = {"python": platform.python_version(), "numpy": numpy.__version__, "torch": torch.__version__,
            "torch_cuda": torch.version.cuda}
    try:
        import cupy

        info["cupy"] = cupy.__version__
    except ImportError:
        info["cupy"] = "not installed"
    except Exception as error:  # a broken CUDA install shows up here; report it, do not fail
        info["cupy"] = f"unusable ({error})"
    return info


def _gpus() -> List[str]:
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def collect_rank(comm: Any, cuda_aware: str = "auto") -> Dict[str, Any]:
    """Return this rank's host, local rank, thread plan, GPU binding and CUDA-awareness (collective over comm)."""
    import torch

    from psframework.comm.cuda import resolve_cuda_aware
    from psframework.runtime.binding import plan_gpu_binding
    from psframework.runtime.threads import plan_threads

    binding = plan_gpu_binding(comm)
    plan = plan_threads(comm)
    name = torch.cuda.get_device_name(binding.device) if binding.device is not None else None
    return {"rank": comm.Get_rank(), "host": socket.gethostname(), "pid": os.getpid(),
            "local_rank": binding.local.rank, "local_rank_source": binding.local.source,
            "ranks_per_node": plan.ranks_per_node, "ranks_per_node_source": plan.source,
            "cores_per_node": plan.cores_per_node, "usable_cores": plan.usable_cores, "threads": plan.threads,
            "visible_gpus": binding.visible_gpus, "cuda_visible_devices": environment.cuda_visible_devices(),
            "gpu": None if binding.device is None else f"cuda:{binding.device}", "gpu_name": name,
            "cuda_aware": "yes" if resolve_cuda_aware(cuda_aware, comm).aware else "no"}


def collect_global(comm: Any, cuda_aware: str) -> Dict[str, Any]:
    """Return the MPI library, thread level, world size, CUDA-awareness and library versions."""
    import mpi4py
    from mpi4py import MPI

    from psframework.comm.cuda import resolve_cuda_aware

    levels = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
              MPI.THREAD_SERIALIZED: "serialized", MPI.THREAD_MULTIPLE: "multiple"}
    awareness = resolve_cuda_aware(cuda_aware, comm)
    info = {"mpi_library": " ".join(MPI.Get_library_version().strip().splitlines()[0].split()),
            "mpi_vendor": "%s %s" % (MPI.get_vendor()[0], ".".join(map(str, MPI.get_vendor()[1]))),
            "mpi_standard": "%d.%d" % MPI.Get_version(), "mpi4py": mpi4py.__version__,
            "thread_level": levels.get(MPI.Query_thread(), str(MPI.Query_thread())),
            "thread_level_requested": str(mpi4py.rc.thread_level), "world_size": comm.Get_size(),
            "tag_ub": comm.Get_attr(MPI.TAG_UB), "cuda_aware": awareness.aware,
            "cuda_aware_setting": cuda_aware, "cuda_aware_method": awareness.method, "gpus": _gpus()}
    info.update(_versions())
    return info


COLUMNS = (("rank", "rank"), ("host", "host"), ("pid", "pid"), ("local rank", "local_rank"),
           ("from", "local_rank_source"), ("ranks/node", "ranks_per_node"), ("cores/node", "cores_per_node"),
           ("usable", "usable_cores"), ("threads", "threads"), ("GPUs", "visible_gpus"), ("binding", "gpu"),
           ("GPU name", "gpu_name"), ("CUDA-aware", "cuda_aware"))


def format_report(info: Dict[str, Any], ranks: Sequence[Dict[str, Any]]) -> str:
    """Return the doctor's report: global facts, then a table with one row per rank."""
    aware = "yes" if info["cuda_aware"] else "no"
    lines = [
        "psframework doctor",
        f"  MPI library      {info['mpi_library']}",
        f"  MPI vendor       {info['mpi_vendor']} (MPI standard {info['mpi_standard']}), mpi4py {info['mpi4py']}",
        f"  thread level     {info['thread_level']} (requested {info['thread_level_requested']})",
        f"  world size       {info['world_size']}",
        f"  TAG_UB           {info['tag_ub']} (message tags stay below 32767)",
        f"  CUDA-aware MPI   {aware}: cuda_aware={info['cuda_aware_setting']}, {info['cuda_aware_method']}",
        f"  GPUs             {len(info['gpus'])}" + (": " + ", ".join(info["gpus"]) if info["gpus"] else ""),
        f"  torch            {info['torch']} "
        + (f"(CUDA {info['torch_cuda']})" if info["torch_cuda"] else "(CPU build)"),
        f"  CuPy             {info['cupy']}",
        f"  NumPy            {info['numpy']}, Python {info['python']}",
        "",
    ]
    cells = [[("cpu" if key == "gpu" else "-") if r.get(key) is None else str(r[key]) for _, key in COLUMNS]
             for r in sorted(ranks, key=lambda r: r["rank"])]
    rows = [[h for h, _ in COLUMNS]] + cells
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    for row in rows:
        lines.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """Return the doctor's argument parser."""
    parser = argparse.ArgumentParser(prog="psf doctor", description="print the MPI, thread, GPU and "
                                     "binding set-up; under mpiexec rank 0 prints a row per rank")
    parser.add_argument("--cuda-aware", choices=SETTINGS, default="auto",
                        help="the comm.cuda_aware setting to resolve (default: auto)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Print the report; return 0, or 1 when MPI cannot be initialised."""
    args = build_parser().parse_args(argv)
    try:
        from mpi4py import MPI
    except Exception as error:  # no MPI library: say so, with what can still be known
        print(f"psframework doctor: MPI unavailable ({type(error).__name__}: {error})", file=sys.stderr)
        print(json.dumps(_versions(), indent=2))
        return 1
    comm = MPI.COMM_WORLD
    info = collect_global(comm, args.cuda_aware)
    ranks = comm.gather(collect_rank(comm, args.cuda_aware), root=0)
    if comm.Get_rank() == 0:
        if args.json:
            print(json.dumps({"global": info, "ranks": ranks}, indent=2))
        else:
            print(format_report(info, ranks))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
