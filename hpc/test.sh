#!/usr/bin/env bash
# Set up the environment if needed, lint, then run the tests.
#
#   hpc/test.sh                 the whole suite (what CI runs), then the real-straggler tests once more
#                               with every pair of ranks on TCP (PSF_TEST_NETWORK=tcp)
#   hpc/test.sh -m "not slow"   the quick tier (no MPI or Slurm job): run it before every commit
#   hpc/test.sh -k config       extra arguments go to pytest (and skip the TCP re-run)
#
# Environment:
#   PSF_LINT=0        skip the flake8 check (it runs first and stops the run on any finding)
#   PSF_TEST_TCP=0    skip the TCP re-run of the whole-suite run
#   PSF_TEST_NETWORK  tcp: every test job's ranks talk over TCP (tests/mpiutil.py); default: shared memory
#   MPIEXEC_TIMEOUT   outer bound in seconds for every mpiexec the tests start (default 120)
#   PSF_EXTRAS        extras installed besides the test ones (default: vision, whose torchvision the
#                     tests of torchvision's models need)
#   and the knobs of hpc/env.sh (PSF_VENV, PSF_MPI, PSF_TORCH, ...)
set -euo pipefail
export PSF_EXTRAS="${PSF_EXTRAS-vision}"
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$PSF_ROOT"
if [ "${PSF_LINT:-1}" != 0 ]; then
    "$PSF_VENV/bin/python" -m flake8 psframework tests hpc || {
        echo "hpc/test.sh: flake8 found the problems above (PSF_LINT=0 skips the lint)" >&2; exit 1; }
fi
# Outer bound for every mpiexec the tests start; pytest-timeout bounds each test as well.
export MPIEXEC_TIMEOUT="${MPIEXEC_TIMEOUT:-120}"
# The tests start hundreds of Python processes: let them reuse the package's compiled bytecode.
unset PYTHONDONTWRITEBYTECODE
if [ $# -gt 0 ] || [ "${PSF_TEST_TCP:-1}" = 0 ]; then
    exec "$PSF_VENV/bin/python" -m pytest --durations=20 "$@"
fi
# The slowest tests are listed at the end: the suite's time is watched.
"$PSF_VENV/bin/python" -m pytest --durations=20
echo "hpc/test.sh: the real-straggler tests again, every pair of ranks on TCP"
PSF_TEST_NETWORK=tcp exec "$PSF_VENV/bin/python" -m pytest -s \
    "tests/test_stragglers_real.py::test_a_frozen_worker_does_not_hold_training_up[sazd]" \
    "tests/test_stragglers_real.py::test_a_frozen_worker_does_not_hold_training_up[ps]" \
    tests/test_comm_mpi.py::test_the_tcp_switch_puts_the_ranks_on_tcp_connections
