#!/usr/bin/env bash
# Set up the environment if needed, then run the main job: SAZD coded training (1 server + 4
# workers, any 3 of 4 replies decode) on the embedded digits data, under MPI.
# Extra arguments are passed on as config overrides, e.g. hpc/quickstart.sh train.epochs=2
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$PSF_ROOT"
exec hpc/psf-mpirun -n 5 train configs/digits_sazd.yaml "$@"
