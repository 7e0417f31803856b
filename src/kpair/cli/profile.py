"""``kpair profile``: run a program and rank its kernels by the GPU time they take."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import UsageError
from .base import Command


class ProfileCmd(Command):
    """Run a Python program with CUPTI kernel activity records on and rank its kernels by total
    GPU time (launches, total, median and max time, share); writes profile.json."""

    name = "profile"
    help = "rank a program's kernels by the GPU time they take"

    @classmethod
    def add_arguments(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("-o", "--out", type=Path, default=Path("profile.json"),
                       help="the profile to write (default profile.json; must not exist)")
        p.add_argument("--top", type=int, default=20, metavar="N",
                       help="rows of the table (default 20); profile.json holds every kernel")
        p.add_argument("command", nargs=argparse.REMAINDER,
                       help="-- python prog.py ARGS... (the program to run)")

    def run(self, args: argparse.Namespace) -> int:
        from ..capture.child import strip_separator
        from ..capture.profile import format_table
        from ..capture.profiler import run_profile

        if args.top < 1:
            raise UsageError(f"--top must be 1 or more, got {args.top}")
        from .. import progress

        progress.stage("the program runs, profiling")
        status, profile = run_profile(strip_separator(args.command), args.out)
        if profile is None:
            print(f"kpair profile: the program ended with status {status} and no profile was "
                  "written (profiling did not start, or the process ended abruptly)",
                  file=sys.stderr)
            return status or 5
        # To stderr, as capture reports: the program's stdout stays its own.
        print(format_table(profile, args.top), file=sys.stderr)
        print(f"kpair profile: {len(profile.kernels)} kernels written to {args.out}",
              file=sys.stderr)
        return status
