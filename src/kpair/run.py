"""Compatibility entry for harnesses made by kpair 0.1, whose ``run_harness.py`` imports
``kpair.run.harness_main``; new harnesses import ``kpair.cli.run``."""

from .cli.run import harness_main

__all__ = ["harness_main"]
