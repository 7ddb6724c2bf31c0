#!/usr/bin/env bash
# Set up the environment if needed, then run the main job on the embedded digits data.
# Extra arguments are passed on as config overrides, e.g. hpc/quickstart.sh train.epochs=2
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$PSF_ROOT"
exec psf train configs/digits_reference.yaml "$@"
