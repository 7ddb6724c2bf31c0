"""The argument parser of every psf command line (psf, psf sweep, psf report): a usage error is one line."""

from __future__ import annotations

import argparse
import typing

EXIT_USAGE = 2  # the exit status of a usage error or a bad input


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line, like every other psf error."""

    def error(self, message: str) -> "typing.NoReturn":
        self.exit(EXIT_USAGE, f"psf: error: {self.prog}: {message} (see {self.prog} --help)\n")
