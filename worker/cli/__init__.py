"""`grounded`: the command line. `cli` is the typer app; `main` is the console script."""

from .main import cli, main

__all__ = ["cli", "main"]
