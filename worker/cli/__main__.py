"""`python -m worker.cli ...` is `grounded ...`."""

from .main import main

main()
