"""psf bench gpu: the real-GPU check, one command that writes docs/benchmarks/gpu.md.

Checks, with `--device cuda` (the default; `--device cpu` runs the same machinery on a CPU):
1. every distributed scheme trains 30 iterations on digits on the device under mpiexec and matches
   the single-process reference trainer on the CPU (same seed and data order) within 1e-3 relative;
2. relay dissemination's integer view restores a device tensor bit-exactly from every k-subset;
3. SA decoding of integer data on the device equals decoding on the host, bit for bit;
4. transport bandwidth for device buffers next to host buffers, 1-64 MiB (rank 0 to rank 1 and back);
5. iteration time of every scheme with a vgg-small benchmark config (configs/bench_*.yaml: ps, stanza,
   sazd, uncoded) on the device and on the CPU.
Checks 1-3 pass or fail; 4 and 5 are measurements. The exit status is 1 if any check failed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

import torch

from psframework.bench.machine import cpu_model
from psframework.fileio import atomic_write_text

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "configs")
PROG = "psf bench gpu"
MIB = 1 << 20
TOLERANCE = 1e-3
MATCH = ["train.lr_schedule=constant", "train.lr=0.05", "train.weight_decay=0.001", "train.momentum=0.9",
         "output.progress=off", "output.overwrite=true"]


def build_parser() -> argparse.ArgumentParser:
    """Return the check's argument parser."""
    parser = argparse.ArgumentParser(prog=PROG, description="real-GPU check: every scheme on the device vs the "
                                     "CPU reference, bit-exact device codec and relay, bandwidth, iteration times")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="device under test")
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks"), help="directory of gpu.md")
    parser.add_argument("--iterations", type=int, default=30, help="training iterations per scheme")
    parser.add_argument("--max-size", type=int, default=64 * MIB, help="largest message of the bandwidth table")
    parser.add_argument("--quick", action="store_true", help="two schemes, small messages, few iterations")
    parser.add_argument("--pingpong", action="store_true", help=argparse.SUPPRESS)  # the MPI part of check 4
    return parser


def run_training(config: str, out: str, name: str, overrides: Sequence[str], ranks: int) -> Dict[str, Any]:
    """Train one run (under mpiexec when ranks > 1); return its summary and per-iteration losses."""
    from psframework.launch import run_mpi

    args = ["-m", "psframework", "train", config, f"name={name}", f"output.dir={out}", *MATCH, *overrides]
    if ranks > 1:
        proc = run_mpi(ranks, args, timeout_s=600)
    else:
        import subprocess

        proc = subprocess.run([sys.executable] + args, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or "").strip().splitlines()[-3:])
        return {"error": f"exit status {proc.returncode}: {tail}"}
    run_dir = os.path.join(out, name)
    with open(os.path.join(run_dir, "summary.json")) as fh:
        summary = json.load(fh)
    with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
        summary["losses"] = [json.loads(line)["loss"] for line in fh]
    return summary


def check_schemes(device: str, out: str, iterations: int, quick: bool) -> List[Dict[str, Any]]:
    """Train every distributed scheme on the device; compare its losses with the CPU reference's."""
    from psframework.schemes import get_scheme, scheme_names

    config = os.path.join(CONFIGS, "digits_sazd.yaml")
    length = [f"train.max_iterations={iterations}"]
    reference = run_training(config, out, "reference", ["scheme=reference", "device=cpu", *length], 1)
    names = [n for n in scheme_names() if get_scheme(n).mpi]
    rows = []
    for name in names[:2] if quick else names:
        scheme = get_scheme(name)
        extra = ["code.k=4"] if scheme.k_equals_n else []
        t0 = time.perf_counter()
        run = run_training(config, out, name, [f"scheme={name}", f"device={device}", *length, *extra],
                           scheme.world_size(4))
        rows.append(compare(name, run, reference, time.perf_counter() - t0))
    return rows


def compare(name: str, run: Dict[str, Any], reference: Dict[str, Any], seconds: float) -> Dict[str, Any]:
    """Return a check row: the largest relative loss difference against the reference."""
    if "error" in run or "error" in reference:
        return {"check": name, "ok": False, "detail": run.get("error") or reference.get("error")}
    ours, ref = run["losses"], reference["losses"]
    if len(ours) != len(ref):
        return {"check": name, "ok": False, "detail": f"{len(ours)} iterations, reference {len(ref)}"}
    worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(ours, ref))
    return {"check": name, "ok": worst <= TOLERANCE, "detail": f"max relative loss difference {worst:.1e} over "
            f"{len(ref)} iterations (limit {TOLERANCE:.0e}), {seconds:.1f} s"}


def check_relay(device: str) -> Dict[str, Any]:
    """Relay dissemination of a float tensor on the device: every k-subset restores it bit-exactly."""
    from psframework.schemes.coded.dissemination import RelayDissemination
    from psframework.settings import CodeSettings

    dissemination = RelayDissemination(CodeSettings(kind="shift-add", n=4, k=3))
    x = torch.randn(32, 6, 14, 14, generator=torch.Generator().manual_seed(1)).to(device)
    packets = dissemination.packets(x)
    bad = [subset for subset in itertools.combinations(range(4), 3)
           if not torch.equal(dissemination.restore({j: packets[j] for j in subset}, x.shape, x.dtype).view(
               torch.int32), x.view(torch.int32))]
    where = {str(p.device) for p in packets}
    return {"check": "relay integer view", "ok": not bad and where == {str(x.device)},
            "detail": f"packets on {', '.join(sorted(where))}; subsets not bit-exact: {bad or 'none'}"}


def check_codec(device: str) -> Dict[str, Any]:
    """SA-coded integer blocks decoded on the device equal the host decoding, for every k-subset."""
    from psframework.codes import SAZDCode

    code = SAZDCode(5, 3, systematic=True)
    data = torch.randint(-2**20, 2**20, (3, 64, 1000), generator=torch.Generator().manual_seed(2))
    blocks = list(data)
    host = code.encode(blocks, axis=0)
    dev = code.encode([b.to(device) for b in blocks], axis=0)
    mismatched = []
    for subset in itertools.combinations(range(5), 3):
        a = code.decode_joined({j: host[j] for j in subset}, axis=0, length=3 * 64)
        b = code.decode_joined({j: dev[j] for j in subset}, axis=0, length=3 * 64)
        if not torch.equal(a, b.cpu()):
            mismatched.append(subset)
    return {"check": "codec on device vs host", "ok": not mismatched,
            "detail": f"10 subsets of SAZDCode(5, 3) on int64 blocks; mismatched: {mismatched or 'none'}"}


def pingpong(device: str, sizes: Sequence[int], repeats: int = 5) -> None:
    """Under mpiexec -n 2: time rank 0 -> 1 -> 0 round trips of host and device tensors; rank 0 prints JSON."""
    from mpi4py import MPI

    from psframework.comm import Transport
    from psframework.comm.rounds import Msg

    results = []
    for where in ("host", device):
        target = None if where == "host" else device
        transport = Transport(MPI.COMM_WORLD, timeout_s=120, device=target)
        for size in sizes:
            x = torch.ones(size // 4, dtype=torch.float32, device=target or "cpu")
            times = []
            for r in range(repeats + 1):  # the first round trip warms up (allocations, staging buffers)
                MPI.COMM_WORLD.Barrier()
                t0 = time.perf_counter()
                if transport.rank == 0:
                    transport.send(1, x, Msg.params(r + 1))
                    transport.recv(1, Msg.params(r + 1))
                else:
                    back = transport.recv(0, Msg.params(r + 1))
                    transport.send(0, back, Msg.params(r + 1))
                times.append(time.perf_counter() - t0)
            times = sorted(times[1:])
            results.append({"buffer": where, "bytes": size, "mib_s": 2 * size / MIB / times[len(times) // 2],
                            "cuda_aware": transport.cuda_aware})
        transport.close()
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(json.dumps(results), flush=True)


def bandwidth(device: str, max_size: int) -> List[Dict[str, Any]]:
    """Run the pingpong under mpiexec -n 2; return its rows (an error row if it fails)."""
    from psframework.launch import run_mpi

    sizes = [s for s in (MIB, 4 * MIB, 16 * MIB, 64 * MIB) if s <= max_size] or [max_size]
    proc = run_mpi(2, ["-m", "psframework.bench.gpu", "--pingpong", "--device", device,
                       "--max-size", str(max_size)], timeout_s=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    if proc.returncode != 0 or not lines:
        return [{"buffer": "error", "bytes": 0, "mib_s": 0.0, "detail": (proc.stderr or "").strip()[-300:]}]
    rows = json.loads(lines[-1])
    return [r for r in rows if r["bytes"] in sizes]


def iteration_times(device: str, out: str, quick: bool) -> List[Dict[str, Any]]:
    """Return the mean iteration time of every scheme with a benchmark config (vgg-small: ps, stanza, sazd,
    uncoded) on the device and on the CPU."""
    from psframework.schemes import scheme_names

    configs = {name: os.path.join(CONFIGS, f"bench_{name}.yaml") for name in scheme_names()}
    timed = [name for name, path in configs.items() if os.path.isfile(path)]
    rows = []
    for name in timed[:1] if quick else timed:
        config = configs[name]
        row: Dict[str, Any] = {"scheme": name}
        for where in dict.fromkeys((device, "cpu")):  # once when the device under test is the CPU
            length = f"train.max_iterations={5 if quick else 30}"
            run = run_training(config, out, f"time-{name}-{where}", [f"device={where}", length], 5)
            row[where] = run.get("mean_iteration_s") if "error" not in run else None
        rows.append(row)
    return rows


def render(report: Dict[str, Any]) -> str:
    """Return the Markdown report."""
    lines = ["# GPU check", "", f"`{report['command']}` on {report['machine']}, {report['date']}.", "",
             "| check | result | detail |", "|---|---|---|"]
    for row in report["checks"]:
        lines.append(f"| {row['check']} | {'pass' if row['ok'] else 'FAIL'} | {row['detail']} |")
    lines += ["", "Transport round trips, rank 0 to rank 1 and back (median of 5; device buffers staged "
              "through pinned host memory unless the MPI is CUDA-aware):", "",
              "| buffer | MiB | MiB/s | CUDA-aware MPI |", "|---|---|---|---|"]
    for row in report["bandwidth"]:
        lines.append(f"| {row['buffer']} | {row['bytes'] // MIB} | {row['mib_s']:.0f} | {row.get('cuda_aware')} |")
    device = report["device"]
    lines += ["", "Mean iteration time (s), 5 ranks sharing the node, vgg-small benchmark configs:", "",
              f"| scheme | {device} | cpu | cpu / {device} |", "|---|---|---|---|"]
    for row in report["iterations"]:
        a, b = row.get(device), row.get("cpu")
        ratio = f"{b / a:.2f}" if a and b else "-"
        lines.append(f"| {row['scheme']} | {a if a is None else f'{a:.4f}'} | {b if b is None else f'{b:.4f}'} | "
                     f"{ratio} |")
    return "\n".join(lines) + "\n"


def machine(device: str) -> str:
    """Describe this machine: host, CPU and the GPU under test."""
    gpu = torch.cuda.get_device_name(0) if device == "cuda" and torch.cuda.is_available() else "no GPU"
    return f"{socket.gethostname()} ({cpu_model()}, {os.cpu_count()} cores, {gpu}, torch {torch.__version__})"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the GPU check and write gpu.md; return 1 if any check failed."""
    args = build_parser().parse_args(argv)
    if args.pingpong:
        sizes = [s for s in (MIB, 4 * MIB, 16 * MIB, 64 * MIB) if s <= args.max_size] or [args.max_size]
        pingpong(args.device, sizes)
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"{PROG}: error: --device cuda but torch sees no CUDA device on {socket.gethostname()}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="psf-gpu-check-") as out:
        checks = check_schemes(args.device, out, 5 if args.quick else args.iterations, args.quick)
        checks += [check_relay(args.device), check_codec(args.device)]
        for row in checks:
            print(f"{PROG}: {row['check']}: {'pass' if row['ok'] else 'FAIL'}: {row['detail']}", flush=True)
        report = {"command": "hpc/gpu-check.sh" + (" --quick" if args.quick else ""), "device": args.device,
                  "machine": machine(args.device), "date": time.strftime("%Y-%m-%d"), "checks": checks,
                  "bandwidth": bandwidth(args.device, args.max_size), "iterations": iteration_times(
                      args.device, out, args.quick)}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "gpu.md")
    atomic_write_text(path, render(report))
    print(f"{PROG}: wrote {path}", flush=True)
    return 0 if all(row["ok"] for row in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
