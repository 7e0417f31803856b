"""The ``kpair`` command line. Each subcommand is a small class with ``add_arguments``/``run``.

``main(argv)`` is callable from tests and returns the exit status (the table is in
``kpair.errors`` and README "Exit codes"): 0 pass / success, 1 correctness failure, 2 usage
(an output that may not be written included), 3 bad input file, 4 backend, architecture,
symbol or ABI problem, 5 runtime failure (driver error, crash, timeout), 130 interrupted
(Ctrl-C), 143 terminated (SIGTERM). No user error ends in a traceback: a ``KpairError`` is
printed as one line; an ``OSError`` that escaped a command is printed with its path.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from .. import __version__, progress
from .._util import remove_live_tempdirs
from ..errors import KpairError
from .asm import Asm
from .base import Command, HelpFormatter, sigterm_unwinds
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
    for p in _parsers(parser):
        p.formatter_class = HelpFormatter
        if p is not parser and not any(isinstance(a, argparse._SubParsersAction)
                                       for a in p._actions):
            p.add_argument("-q", "--quiet", action="store_true",
                           help="no progress on stderr (default: progress on stderr, live on "
                           "a terminal, plain lines otherwise; KPAIR_PROGRESS=plain|off)")
    return parser


def _parsers(parser: argparse.ArgumentParser):
    """``parser`` and every subcommand's parser below it."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with sigterm_unwinds():
        try:
            with progress.using(progress.for_command(f"kpair {args.command}",
                                                     quiet=getattr(args, "quiet", False))):
                return args._command().run(args)
        except KpairError as e:
            print(f"kpair {args.command}: {e}", file=sys.stderr)
            return e.exit_code
        except KeyboardInterrupt as e:
            remove_live_tempdirs()  # those of pool threads, which do not unwind
            code = getattr(e, "exit_code", 130)
            how = "terminated (SIGTERM)" if code == 143 else "interrupted"
            print(f"kpair {args.command}: {how}; temporary files removed, earlier results "
                  "left as they were", file=sys.stderr)
            return code
        except BrokenPipeError:
            # The reader of stdout went away (| head): nothing more to say to it.
            with contextlib.suppress(OSError):
                sys.stdout = open(_devnull(), "w")  # noqa: SIM115 - for the exit flush
            return 5
        except OSError as e:
            where = f"{e.filename}: " if e.filename else ""
            print(f"kpair {args.command}: {where}{e.strerror or e}", file=sys.stderr)
            return 5


def _devnull() -> str:
    import os

    return os.devnull
