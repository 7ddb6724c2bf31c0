#!/usr/bin/env bash
# The real-GPU check: every scheme with device=cuda against the CPU reference trainer, bit-exact
# relay and codec on the device, transport bandwidth of device vs host buffers, and iteration times
# of sazd, stanza and ps on the GPU vs the CPU. Writes docs/benchmarks/gpu.md; exit status 1 if a
# check failed. Five ranks share one GPU; about 5 minutes on one H200.
#
#   hpc/gpu-check.sh            # the whole check
#   hpc/gpu-check.sh --quick    # two schemes, small messages: a smoke run
#
# Environment:
#   PSF_PYTHON   the Python with psframework, a CUDA torch and mpi4py (default: python3)
# An MPI library must be reachable: mpiexec next to that Python or on PATH (pip install mpich puts
# one in a virtual environment; cluster users load their MPI module).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PSF_PYTHON:-python3}"
bin="$(dirname "$(command -v "$python")")"
if [ ! -x "$bin/mpiexec" ] && ! command -v mpiexec >/dev/null; then
    echo "hpc/gpu-check.sh: no mpiexec next to $python or on PATH: pip install mpich, or load your MPI module" >&2
    exit 2
fi
cd "$root"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export MPIEXEC_TIMEOUT="${MPIEXEC_TIMEOUT:-600}"
exec "$python" -m psframework.bench.gpu "$@"
