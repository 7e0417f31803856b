"""``kpair capture``: run a program and capture its kernel dispatches into snapshots; with
``--top K``, a profiling run first chooses the K kernels with the most GPU time."""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from .. import progress
from .._util import check_output_dir, write_bytes_atomic
from ..capture.child import child_command, child_environment, status_of, strip_separator
from ..capture.program import ENV
from ..errors import UsageError
from .base import Command, integer

#: The largest size option (``--max-region-bytes``).
MAX_SIZE = 1 << 40
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``1073741824``, ``512MiB``, ``2G`` → bytes (binary units)."""
    m = _SIZE.match(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 512MiB, 2GiB)")
    scale = 1024 ** " KMGT".index(m.group(2).upper() or " ")
    size = int(float(m.group(1)) * scale)
    if not 1 <= size <= MAX_SIZE:
        raise argparse.ArgumentTypeError(f"must be 1 byte to 1TiB, not {text!r}")
    return size


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
        p.add_argument("--nth", type=integer(1, 2**31), default=1, metavar="N",
                       help="start at the Nth matching launch (default 1)")
        p.add_argument("--max", type=integer(0, 2**31), default=None, metavar="K",
                       help="capture at most K dispatches; 0 = no limit (default 1)")
        p.add_argument("--distinct", action="store_true",
                       help="only the first launch of each kernel counts as a match")
        p.add_argument("--top", type=integer(1, 1000), metavar="K",
                       help="run the program twice: a profiling run ranks kernels by total GPU "
                       "time, then the first dispatch of each of the K most expensive (among "
                       "those matching --kernel) is captured; profile.json is kept in DIR")
        p.add_argument("--max-region-bytes", type=parse_size, default=2 << 30, metavar="SIZE",
                       help="leave out regions larger than this and mark the snapshot "
                       "incomplete (default 2GiB)")
        p.add_argument("--module-loading", choices=("eager", "lazy"), default="eager",
                       help="CUDA_MODULE_LOADING for the program (default eager: every code "
                       "object is reported as it loads; lazy is cheaper, but drivers have been "
                       "seen not to report the code objects of cudart kernels, PyTorch's own)")
        p.add_argument("--json", action="store_true",
                       help='print {"out", "exit_status", "capture": capture.json} as one '
                       "JSON document on stdout (the program's own stdout then goes to stderr)")
        # dest "program": "command" is the subcommand's name (messages say "kpair VERB")
        p.add_argument("program", metavar="command", nargs=argparse.REMAINDER,
                       help="-- python prog.py ARGS... (the program to run)")

    def run(self, args: argparse.Namespace) -> int:
        from ..capture.cupti import find_cupti
        from ..capture.session import SUMMARY

        command = strip_separator(args.program)
        argv = child_command(command)
        if args.max is not None and args.max < 0:
            raise UsageError(f"--max must be 0 (no limit) or more, got {args.max}")
        if args.nth < 1:
            raise UsageError(f"--nth must be 1 or more, got {args.nth}")
        if args.top is not None:
            if args.top < 1:
                raise UsageError(f"--top must be 1 or more, got {args.top}")
            if args.nth != 1 or args.max is not None or args.distinct:
                raise UsageError("--top takes the first dispatch of each chosen kernel: it "
                                 "does not combine with --nth, --max or --distinct")
        out = check_output_dir(args.out, empty=True)  # a new or empty directory, writable
        find_cupti()  # fail here, with the install hint, rather than inside the child
        settings = {"out": str(out.resolve()), "kernel": args.kernel, "nth": args.nth,
                    "max": 1 if args.max is None else args.max or None,
                    "distinct": args.distinct, "max_region_bytes": args.max_region_bytes,
                    "command": command}
        if args.top is not None:
            return self.run_top(args, argv, settings)
        progress.stage("the program runs, capturing")
        proc = subprocess.run(argv, env=child_environment(ENV, settings, args.module_loading),
                              stdout=_program_stdout(args))
        status = status_of(proc.returncode)
        summary = report(out / SUMMARY, status)
        _emit(args, out, status, summary)
        return status

    def run_top(self, args: argparse.Namespace, argv: list[str], settings: dict) -> int:
        """The profiling run, then the capture run with the chosen names as the filter."""
        from ..capture.profile import PROFILE, top
        from ..capture.profiler import run_profile
        from ..capture.session import SUMMARY

        with tempfile.TemporaryDirectory(prefix="kpair-profile-") as tmp:
            progress.stage("the program runs, profiling")
            status, profile = run_profile(settings["command"], Path(tmp) / PROFILE,
                                          stdout=_program_stdout(args))
            data = (Path(tmp) / PROFILE).read_bytes() if profile is not None else b""
        if profile is None:
            print(f"kpair capture: the profiling run ended with status {status} and wrote no "
                  "profile: nothing captured", file=sys.stderr)
            _emit(args, args.out, status, None, note="the profiling run wrote no profile")
            return status or 5
        chosen = top(profile, args.top, args.kernel)
        if status:
            print(f"kpair capture: note: the program ended with status {status} in the "
                  "profiling run", file=sys.stderr)
        if not chosen:
            what = f" matched --kernel {args.kernel!r}" if args.kernel else " ran"
            print(f"kpair capture: no kernel{what} in the profiling run "
                  f"({len(profile.kernels)} kernels timed): nothing captured", file=sys.stderr)
            _emit(args, args.out, status, None, note=f"no kernel{what} in the profiling run")
            return status
        share = sum(t.share for t in chosen)
        print(f"kpair capture: profiling run: the {len(chosen)} most expensive kernels take "
              f"{share:.1%} of {profile.kernel_time_ns / 1e6:.2f} ms of kernel time; capturing "
              "the first dispatch of each", file=sys.stderr)
        settings.update(
            kernel=None, nth=1, max=len(chosen), distinct=True,
            names=[t.name for t in chosen],
            profile={"file": PROFILE, "sha256": hashlib.sha256(data).hexdigest(),
                     "top": args.top, "kernel": args.kernel,
                     "exit_status": profile.exit_status,
                     "kernel_time_ns": profile.kernel_time_ns,
                     "chosen": [{"rank": i, "name": t.name, "demangled": t.demangled,
                                 "launches": t.launches, "total_ns": t.total_ns,
                                 "share": t.share} for i, t in enumerate(chosen, 1)]})
        progress.stage("the program runs again, capturing")
        proc = subprocess.run(argv, env=child_environment(ENV, settings, args.module_loading),
                              stdout=_program_stdout(args))
        status = status_of(proc.returncode)
        out = args.out
        if out.is_dir():
            write_bytes_atomic(out / PROFILE, data, replace=False)
        summary = report(out / SUMMARY, status)
        _emit(args, out, status, summary)
        return status


def _program_stdout(args: argparse.Namespace) -> int | None:
    """Where the program's stdout goes: its own (inherited), or stderr under ``--json``, so
    that kpair's stdout holds nothing but its one JSON document."""
    return sys.stderr.fileno() if args.json else None


def _emit(args: argparse.Namespace, out: Path, status: int, summary: dict | None,
          note: str | None = None) -> None:
    if args.json:
        doc = {"out": str(out), "exit_status": status, "capture": summary}
        if note:
            doc["note"] = note
        print(json.dumps(doc, indent=1))


def report(path: Path, status: int) -> dict | None:
    """Say what was captured (to stderr: the program's stdout stays its own); the summary
    read back (None when the program left none)."""
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        print(f"kpair capture: the program ended with status {status} and left no "
              f"{path.name}: capture did not start", file=sys.stderr)
        return None
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
    return summary
