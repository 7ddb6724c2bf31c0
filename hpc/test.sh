#!/usr/bin/env bash
# Set up the environment if needed, then run the whole test suite (unit and MPI tests).
# Extra arguments go to pytest, e.g. hpc/test.sh -k config
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$PSF_ROOT"
# Outer bound for every mpiexec the tests start; pytest-timeout bounds each test as well.
export MPIEXEC_TIMEOUT="${MPIEXEC_TIMEOUT:-120}"
exec "$PSF_VENV/bin/python" -m pytest "$@"
