"""Run the psf command line: python -m psframework (or python -m mpi4py -m psframework)."""

from psframework.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
