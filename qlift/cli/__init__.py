"""The qlift command line: a thin Click layer over the qlift library."""

from qlift.cli.main import cli, main

__all__ = ["cli", "main"]
