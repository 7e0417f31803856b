"""``kpair profile``: run a program and rank its kernels by the GPU time they take."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .. import progress
from .._util import check_output, private_tempdir, write_bytes_atomic
from ..capture.child import strip_separator
from ..capture.profile import PROFILE, format_table
from ..capture.profiler import run_profile
from ..errors import UsageError
from .base import Command, integer


class ProfileCmd(Command):
    """Run a Python program with CUPTI kernel activity records on and rank its kernels by total
    GPU time (launches, total, median and max time, share); writes profile.json."""

    name = "profile"
    help = "rank a program's kernels by the GPU time they take"

    @classmethod
    def add_arguments(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("-o", "--out", type=Path, default=Path("profile.json"),
                       help="the profile to write (default profile.json; an existing file is "
                       "replaced only with --force)")
        p.add_argument("--force", action="store_true",
                       help="replace the profile file if it exists (never a directory or a "
                       "special file)")
        p.add_argument("--top", type=integer(1, 1_000_000), default=20, metavar="N",
                       help="rows of the table (default 20); profile.json holds every kernel")
        p.add_argument("--json", action="store_true",
                       help='print {"out", "exit_status", "profile": profile.json} as one JSON '
                       "document on stdout (the program's own stdout then goes to stderr)")
        # dest "program": "command" is the subcommand's name (messages say "kpair VERB")
        p.add_argument("program", metavar="command", nargs=argparse.REMAINDER,
                       help="-- python prog.py ARGS... (the program to run)")

    def run(self, args: argparse.Namespace) -> int:
        if args.top < 1:
            raise UsageError(f"--top must be 1 or more, got {args.top}")
        # Refused before the program runs: a directory, a special file, an unwritable folder,
        # or a file the user had (without --force).
        check_output(args.out, replace=args.force)
        command = strip_separator(args.program)
        progress.stage("the program runs, profiling")
        # The child writes into a private folder; the profile reaches -o through the safe
        # write only, so the program can neither replace nor half-write what is there.
        with private_tempdir("profile") as tmp:
            status, profile = run_profile(command, tmp / PROFILE,
                                          stdout=sys.stderr.fileno() if args.json else None)
            data = (tmp / PROFILE).read_bytes() if profile is not None else None
        if profile is None:
            print(f"kpair profile: the program ended with status {status} and no profile was "
                  "written (profiling did not start, or the process ended abruptly)",
                  file=sys.stderr)
            if args.json:
                print(json.dumps({"out": None, "exit_status": status, "profile": None}))
            return status or 5
        write_bytes_atomic(args.out, data, replace=args.force)
        # To stderr, as capture reports: the program's stdout stays its own.
        print(format_table(profile, args.top), file=sys.stderr)
        print(f"kpair profile: {len(profile.kernels)} kernels written to {args.out}",
              file=sys.stderr)
        if args.json:
            print(json.dumps({"out": str(args.out), "exit_status": status,
                              "profile": json.loads(data)}, indent=1))
        return status
