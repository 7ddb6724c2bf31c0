#!/usr/bin/env bash
# Set up the environment if needed, lint, then run the whole test suite (unit and MPI tests).
# Extra arguments go to pytest, e.g. hpc/test.sh -k config
#
# Environment:
#   PSF_LINT=0        skip the flake8 check (it runs first and stops the run on any finding)
#   MPIEXEC_TIMEOUT   outer bound in seconds for every mpiexec the tests start (default 120)
#   and the knobs of hpc/env.sh (PSF_VENV, PSF_MPI, PSF_TORCH, ...)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$PSF_ROOT"
if [ "${PSF_LINT:-1}" != 0 ]; then
    "$PSF_VENV/bin/python" -m flake8 psframework tests hpc || {
        echo "hpc/test.sh: flake8 found the problems above (PSF_LINT=0 skips the lint)" >&2; exit 1; }
fi
# Outer bound for every mpiexec the tests start; pytest-timeout bounds each test as well.
export MPIEXEC_TIMEOUT="${MPIEXEC_TIMEOUT:-120}"
# The slowest tests are listed at the end: the suite's time is watched.
exec "$PSF_VENV/bin/python" -m pytest --durations=20 "$@"
