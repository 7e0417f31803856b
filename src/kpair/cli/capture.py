"""``kpair capture``: run a program and capture its kernel dispatches into snapshots."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from ..errors import UsageError
from .base import Command

#: Interpreter options that take a value (``python -X dev prog.py``).
_OPTIONS_WITH_VALUE = {"-X", "-W", "--check-hash-based-pycs"}
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``1073741824``, ``512MiB``, ``2G`` → bytes (binary units)."""
    m = _SIZE.match(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 512MiB, 2GiB)")
    scale = 1024 ** " KMGT".index(m.group(2).upper() or " ")
    return int(float(m.group(1)) * scale)


def is_python(word: str) -> bool:
    name = os.path.basename(word)
    return bool(re.fullmatch(r"python[\d.]*", name)) or (
        os.path.isabs(word) and os.path.realpath(word) == os.path.realpath(sys.executable))


def child_command(command: list[str]) -> list[str]:
    """The command with ``-m kpair.capture.program`` inserted after the interpreter's options.

    ``python -u prog.py a`` → ``python -u -m kpair.capture.program prog.py a``; the program part
    (script, ``-m module`` or ``-c code``) and its arguments are passed on untouched.
    """
    if not command:
        raise UsageError("no command given: kpair capture -o DIR -- python prog.py ARGS...")
    if not is_python(command[0]):
        raise UsageError(f"kpair capture runs Python programs: the command must start with a "
                         f"Python interpreter (python, python3, ...), not {command[0]!r}. "
                         "For other programs, capture from inside with kpair.capture.capture()")
    i = 1
    while i < len(command):
        word = command[i]
        if word in ("-m", "-c") or not word.startswith("-") or word == "-":
            break
        if word == "--":
            i += 1
            break
        i += 2 if word in _OPTIONS_WITH_VALUE else 1
    if i >= len(command):
        raise UsageError("the Python command names no program (a script, -m MODULE or -c CODE)")
    return [*command[:i], "-m", "kpair.capture.program", *command[i:]]


def child_environment(settings: dict, module_loading: str) -> dict:
    from ..capture.program import ENV

    env = dict(os.environ)
    env[ENV] = json.dumps(settings)
    env["CUDA_MODULE_LOADING"] = module_loading.upper()
    # The child may be another interpreter: make this kpair importable there too.
    here = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), here) if p)
    return env


def status_of(returncode: int) -> int:
    """A child's status as a shell reports it: 128 + signal number when it was killed."""
    return 128 - returncode if returncode < 0 else returncode


class Capture(Command):
    """Run a Python program and capture its kernel dispatches into snapshots (CUDA, CUPTI)."""

    name = "capture"
    help = "capture kernel dispatches of a program into snapshots"

    @classmethod
    def add_arguments(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("-o", "--out", type=Path, required=True,
                       help="output directory (new or empty): one snapshot per dispatch, "
                       "plus capture.json")
        p.add_argument("--kernel", metavar="REGEX",
                       help="capture kernels whose mangled or demangled name matches")
        p.add_argument("--nth", type=int, default=1, metavar="N",
                       help="start at the Nth matching launch (default 1)")
        p.add_argument("--max", type=int, default=1, metavar="K",
                       help="capture at most K dispatches; 0 = no limit (default 1)")
        p.add_argument("--distinct", action="store_true",
                       help="only the first launch of each kernel counts as a match")
        p.add_argument("--max-region-bytes", type=parse_size, default=2 << 30, metavar="SIZE",
                       help="leave out regions larger than this and mark the snapshot "
                       "incomplete (default 2GiB)")
        p.add_argument("--module-loading", choices=("eager", "lazy"), default="eager",
                       help="CUDA_MODULE_LOADING for the program (default eager: every code "
                       "object is reported as it loads; lazy is cheaper, but drivers have been "
                       "seen not to report the code objects of cudart kernels, PyTorch's own)")
        p.add_argument("command", nargs=argparse.REMAINDER,
                       help="-- python prog.py ARGS... (the program to run)")

    def run(self, args: argparse.Namespace) -> int:
        from ..capture.cupti import find_cupti
        from ..capture.session import SUMMARY

        command = list(args.command)
        if command and command[0] == "--":
            command = command[1:]
        argv = child_command(command)
        if args.max < 0:
            raise UsageError(f"--max must be 0 (no limit) or more, got {args.max}")
        if args.nth < 1:
            raise UsageError(f"--nth must be 1 or more, got {args.nth}")
        out = args.out
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise UsageError(f"{out} exists and is not empty; capture writes into a new or "
                             "empty directory")
        find_cupti()  # fail here, with the install hint, rather than inside the child
        settings = {"out": str(out.resolve()), "kernel": args.kernel, "nth": args.nth,
                    "max": args.max or None, "distinct": args.distinct,
                    "max_region_bytes": args.max_region_bytes, "command": command}
        proc = subprocess.run(argv, env=child_environment(settings, args.module_loading))
        status = status_of(proc.returncode)
        report(out / SUMMARY, status)
        return status


def report(path: Path, status: int) -> None:
    """Say what was captured (to stderr: the program's stdout stays its own)."""
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        print(f"kpair capture: the program ended with status {status} and left no "
              f"{path.name}: capture did not start", file=sys.stderr)
        return
    captured = [d for d in summary["dispatches"] if d["status"] == "captured"]
    failed = [d for d in summary["dispatches"] if d["status"] != "captured"]
    print(f"kpair capture: {len(captured)} dispatches captured into {path.parent} "
          f"({summary['launches_seen']} launches of {summary['distinct_kernels_seen']} "
          f"distinct kernels seen; program exit status {status})", file=sys.stderr)
    for d in captured:
        print(f"  {d['snapshot']}  grid {d['grid']} block {d['block']}  {d['regions']} "
              f"regions, {d['region_bytes']} bytes (segments {d['segment_bytes']})",
              file=sys.stderr)
    for d in failed:
        print(f"  not captured: {d['kernel']}: {d.get('reason', d['status'])}", file=sys.stderr)
    for note in summary.get("notes", []):
        print(f"kpair capture: {note}", file=sys.stderr)
