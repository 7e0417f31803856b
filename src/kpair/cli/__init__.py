"""The ``kpair`` command line. Each subcommand is a small class with ``add_arguments``/``run``.

``main(argv)`` is callable from tests and returns the exit status (documented in README):
0 pass / success, 1 correctness failure, 2 usage, 3 bad input file, 4 backend, architecture,
symbol or ABI problem, 5 runtime failure (driver error, crash, timeout).
"""

from __future__ import annotations

import argparse
import sys

from .. import __version__
from ..errors import KpairError
from .asm import Asm
from .base import Command
from .capture import Capture
from .core import Inspect, Pair
from .evaluate import Evaluate
from .mcp import McpCmd
from .optimize import Optimize
from .policy import PolicyCmd
from .profile import ProfileCmd
from .release import Demo, ReleaseCmd, Report, Verify
from .replay import Replay
from .run import Run

#: Every subcommand, in the order of the pipeline; a new command adds itself here.
COMMANDS: list[type[Command]] = [ProfileCmd, Capture, Replay, Pair, Run, Evaluate, Inspect,
                                 PolicyCmd, ReleaseCmd, Verify, Report, Demo, Optimize, Asm,
                                 McpCmd]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kpair", description="Pair harnesses for GPU kernels: capture a real dispatch, "
        "replay a baseline and an optimized kernel on it, judge and time them.")
    parser.add_argument("--version", action="version", version=f"kpair {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for cls in COMMANDS:
        p = sub.add_parser(cls.name, help=cls.help, description=cls.__doc__)
        cls.add_arguments(p)
        p.set_defaults(_command=cls)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args._command().run(args)
    except KpairError as e:
        print(f"kpair {args.command}: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("kpair: interrupted", file=sys.stderr)
        return 130
