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
import shutil
import sys
import traceback

from .. import __version__, progress
from .._util import remove_live_tempdirs
from ..errors import KpairError
from .asm import Asm
from .base import ArgumentParser, Command, HelpFormatter, UsageExit, sigterm_unwinds
from .capture import Capture
from .core import Inspect, Pair
from .errordoc import print_error_document
from .evaluate import Evaluate
from .mcp import McpCmd
from .optimize import Optimize
from .policy import PolicyCmd
from .profile import ProfileCmd
from .release import Demo, ReleaseCmd, Report, Verify
from .replay import ReplayCmd
from .run import RunCmd

#: Every subcommand, in the order of the pipeline; a new command adds itself here.
COMMANDS: list[type[Command]] = [ProfileCmd, Capture, ReplayCmd, Pair, RunCmd, Evaluate, Inspect,
                                 PolicyCmd, ReleaseCmd, Verify, Report, Demo, Optimize, Asm,
                                 McpCmd]


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
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
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except UsageExit as e:  # argparse refused the command line: one line, exit 2
        print(f"{e.prog}: {e.message}", file=sys.stderr)
        if _wants_json(argv):
            print_error_document(e.prog, 2, e.message, kind="UsageError")
        return 2
    name = f"kpair {args.command}"
    as_json = bool(getattr(args, "json", False))

    def fail(code: int, message: str, error: BaseException) -> int:
        print(f"{name}: {message}", file=sys.stderr)
        if as_json:
            print_error_document(name, code, error if str(error) == message else message,
                                 kind=type(error).__name__)
        return code

    with sigterm_unwinds():
        try:
            with progress.using(progress.for_command(name,
                                                     quiet=getattr(args, "quiet", False))):
                return args._command().run(args)
        except KpairError as e:
            return fail(e.exit_code, str(e), e)
        except KeyboardInterrupt as e:
            remove_live_tempdirs()  # those of pool threads, which do not unwind
            code = getattr(e, "exit_code", 130)
            how = "terminated (SIGTERM)" if code == 143 else "interrupted"
            return fail(code, f"{how}; temporary files removed, earlier results left as "
                        "they were", e)
        except BrokenPipeError:
            # The reader of stdout went away (| head): nothing more to say to it.
            with contextlib.suppress(OSError):
                sys.stdout = open(_devnull(), "w")  # noqa: SIM115 - for the exit flush
            return 5
        except shutil.Error as e:  # a copy that failed midway (disk full): one line
            return fail(5, _copy_failed(e), e)
        except OSError as e:
            where = f"{e.filename}: " if e.filename else ""
            return fail(5, f"{where}{e.strerror or e}", e)
        except Exception as e:  # a bug: its traceback for the report, then one line
            traceback.print_exc()
            return fail(5, f"internal error (a bug in kpair; please report it): "
                        f"{type(e).__name__}: {e}", e)


def _wants_json(argv: list[str]) -> bool:
    """``--json`` among the options (not in a program's own arguments after ``--``)."""
    options = argv[:argv.index("--")] if "--" in argv else argv
    return "--json" in options


def _copy_failed(e: shutil.Error) -> str:
    """``shutil.Error``'s list of (source, destination, reason), as one line."""
    failures = e.args[0] if e.args and isinstance(e.args[0], list) else []
    if not failures:
        return f"a copy failed: {e}"
    _, dst, why = failures[0]
    why = str(why)
    reason = why.split("] ", 1)[1].split(":", 1)[0] if why.startswith("[Errno") else why
    more = f" and {len(failures) - 1} more file(s)" if len(failures) > 1 else ""
    return f"{dst}: cannot be written ({reason}){more}; nothing was kept"


def _devnull() -> str:
    import os

    return os.devnull
