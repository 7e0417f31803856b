"""Capturing a whole program from outside it: ``capture_program`` runs the program in a
capture child (``python -m kpair.capture.program``), optionally after a profiling child
(``python -m kpair.capture.profiler``) that chooses the ``top`` kernels by GPU time.

This is what ``kpair capture`` does; ``kpair optimize`` and the MCP workspace call it too.
Messages for the user (what was captured, what was not) go through ``log``; the program's
own output goes where ``stdout``/``stderr`` say.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import progress
from .._util import check_output_dir, write_bytes_atomic
from ..errors import UsageError
from .child import ChildRun, child_command, child_environment, run_child
from .cupti import find_cupti
from .profile import PROFILE
from .profile import top as top_of
from .profiler import run_profile
from .program import ENV
from .session import DEFAULT_MAX_REGION_BYTES, SUMMARY

Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


@dataclass(frozen=True)
class CaptureOutcome:
    """What ``capture_program`` did: the output directory, the program's exit status (as a
    shell reports it), ``capture.json`` read back (None when the program left none), why
    nothing was captured when ``top`` chose nothing, and whether a run hit ``timeout_s``."""

    out: Path
    exit_status: int
    summary: dict | None
    note: str | None = None
    timed_out: bool = False
    #: the profiling run (``top``) wrote no profile: nothing was chosen, nothing captured
    no_profile: bool = False

    def to_json(self) -> dict:
        """``kpair capture --json``'s document."""
        doc = {"out": str(self.out), "exit_status": self.exit_status, "capture": self.summary}
        if self.note:
            doc["note"] = self.note
        return doc


def capture_program(command: Sequence[str], out: str | os.PathLike, *,
                    kernel: str | None = None, nth: int = 1, max: int | None = 1,
                    distinct: bool = False, top: int | None = None,
                    ranges: Sequence[str] | None = None,
                    max_region_bytes: int = DEFAULT_MAX_REGION_BYTES,
                    module_loading: str | None = "eager", env: dict | None = None,
                    stdout=None, stderr=None, cwd: str | os.PathLike | None = None,
                    timeout_s: float | None = None, log: Log = _stderr,
                    store_bytes: bool = False,
                    post_digest_over: int | None = None) -> CaptureOutcome:
    """Run ``command`` (``python [options] prog.py ARGS``) with capture installed, writing
    one snapshot per captured dispatch and ``capture.json`` into ``out`` (new or empty).

    ``kernel`` (a regular expression), ``nth``, ``max`` (None: no limit) and ``distinct``
    choose the dispatches; with ``top`` a profiling run first ranks kernels by GPU time and
    the first dispatch of each of the ``top`` most expensive (among those matching
    ``kernel``) is captured, the profile kept as ``out/profile.json``. ``env``: the
    program's environment (default this process's); ``timeout_s``: a limit on the whole
    (each child's process group is killed past it; what was captured is kept).

    ``ranges``: capture these ranges instead of single dispatches (``kpair.capture.ranges``):
    the ``nth`` occurrence of each name, marked by ``torch.cuda.nvtx.range`` or
    ``kpair.mark``, as one range snapshot ``out/<name>/``. ``store_bytes``: every region's
    pre-state as bytes (no regenerable chains; ``kpair.capture.chains``).
    ``post_digest_over``: a written region larger than this many bytes keeps its post-state
    as digests only, no bytes (``Region.post_digest``; None: bytes)."""
    command = list(command)
    argv = child_command(command)
    if max is not None and max < 0:
        raise UsageError(f"--max must be 0 (no limit) or more, got {max}")
    if nth < 1:
        raise UsageError(f"--nth must be 1 or more, got {nth}")
    if top is not None:
        if top < 1:
            raise UsageError(f"--top must be 1 or more, got {top}")
        if nth != 1 or max != 1 or distinct:
            raise UsageError("--top takes the first dispatch of each chosen kernel: it "
                             "does not combine with --nth, --max or --distinct")
    if ranges is not None:
        ranges = list(ranges)
        if not ranges or any(not isinstance(r, str) or not r for r in ranges):
            raise UsageError("--range needs a non-empty range name")
        if kernel is not None or top is not None or distinct or max != 1:
            raise UsageError("--range captures whole ranges: it does not combine with "
                             "--kernel, --top, --max or --distinct (--nth picks the "
                             "occurrence)")
    if timeout_s is not None and not 0 < timeout_s < float("inf"):
        raise UsageError(f"timeout_s must be a positive number of seconds, not {timeout_s!r}")
    out = check_output_dir(out, empty=True)  # a new or empty directory, writable
    find_cupti()  # fail here, with the install hint, rather than inside the child
    settings = {"out": str(out.resolve()), "kernel": kernel, "nth": nth, "max": max,
                "distinct": distinct, "max_region_bytes": max_region_bytes,
                "command": command}
    if ranges:
        settings["ranges"] = ranges
    if store_bytes:
        settings["store_bytes"] = True
    if post_digest_over is not None:
        settings["post_digest_over"] = int(post_digest_over)
    runner = _Runner(argv, env, module_loading, stdout, stderr, cwd, timeout_s)
    if top is None:
        progress.stage("the program runs, capturing")
        ended = runner.capture(settings)
        return CaptureOutcome(out, ended.status, report(out / SUMMARY, ended.status, log),
                              timed_out=ended.timed_out)
    return _capture_top(runner, out, settings, top, kernel, log)


@dataclass
class _Runner:
    """The capture child's fixed arguments, and the time left of ``timeout_s``."""

    argv: list[str]
    env: dict | None
    module_loading: str | None
    stdout: object
    stderr: object
    cwd: str | os.PathLike | None
    timeout_s: float | None

    def __post_init__(self) -> None:
        self.deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s

    def left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def capture(self, settings: dict) -> ChildRun:
        env = child_environment(ENV, settings, self.module_loading, base=self.env)
        return run_child(self.argv, env, stdout=self.stdout, stderr=self.stderr,
                         cwd=self.cwd, timeout_s=self.left())


def _capture_top(runner: _Runner, out: Path, settings: dict, k: int, kernel: str | None,
                 log: Log) -> CaptureOutcome:
    """The profiling run, then the capture run with the chosen names as the filter."""
    with tempfile.TemporaryDirectory(prefix="kpair-profile-") as tmp:
        progress.stage("the program runs, profiling")
        status, profile = run_profile(settings["command"], Path(tmp) / PROFILE,
                                      stdout=runner.stdout, stderr=runner.stderr,
                                      cwd=runner.cwd, timeout_s=runner.left())
        data = (Path(tmp) / PROFILE).read_bytes() if profile is not None else b""
    timed_out = runner.deadline is not None and runner.left() <= 0
    if profile is None:
        log(f"kpair capture: the profiling run ended with status {status} and wrote no "
            "profile: nothing captured")
        return CaptureOutcome(out, status, None, note="the profiling run wrote no profile",
                              timed_out=timed_out, no_profile=True)
    chosen = top_of(profile, k, kernel)
    if status:
        log(f"kpair capture: note: the program ended with status {status} in the "
            "profiling run")
    if not chosen:
        what = f" matched --kernel {kernel!r}" if kernel else " ran"
        log(f"kpair capture: no kernel{what} in the profiling run "
            f"({len(profile.kernels)} kernels timed): nothing captured")
        return CaptureOutcome(out, status, None, note=f"no kernel{what} in the profiling run",
                              timed_out=timed_out)
    share = sum(t.share for t in chosen)
    log(f"kpair capture: profiling run: the {len(chosen)} most expensive kernels take "
        f"{share:.1%} of {profile.kernel_time_ns / 1e6:.2f} ms of kernel time; capturing "
        "the first dispatch of each")
    settings.update(
        kernel=None, nth=1, max=len(chosen), distinct=True,
        names=[t.name for t in chosen],
        profile={"file": PROFILE, "sha256": hashlib.sha256(data).hexdigest(),
                 "top": k, "kernel": kernel,
                 "exit_status": profile.exit_status,
                 "kernel_time_ns": profile.kernel_time_ns,
                 "chosen": [{"rank": i, "name": t.name, "demangled": t.demangled,
                             "launches": t.launches, "total_ns": t.total_ns,
                             "share": t.share} for i, t in enumerate(chosen, 1)]})
    progress.stage("the program runs again, capturing")
    ended = runner.capture(settings)
    if out.is_dir():
        write_bytes_atomic(out / PROFILE, data, replace=False)
    return CaptureOutcome(out, ended.status, report(out / SUMMARY, ended.status, log),
                          timed_out=ended.timed_out)


def report(path: Path, status: int, log: Log = _stderr) -> dict | None:
    """Say what was captured (through ``log``); the summary read back (None when the
    program left none)."""
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        log(f"kpair capture: the program ended with status {status} and left no "
            f"{path.name}: capture did not start")
        return None
    dispatches = summary.get("dispatches", [])
    captured = [d for d in dispatches if d.get("status") == "captured"]
    failed = [d for d in dispatches if d.get("status") != "captured"]
    if "ranges" in summary:
        done = sum(r.get("status") == "captured" for r in summary["ranges"])
        log(f"kpair capture: {done} of {len(summary['ranges'])} ranges captured into "
            f"{path.parent} ({summary.get('launches_seen', 0)} launches seen; program exit "
            f"status {status})")
    elif "launches_seen" in summary:
        log(f"kpair capture: {len(captured)} dispatches captured into {path.parent} "
            f"({summary['launches_seen']} launches of {summary['distinct_kernels_seen']} "
            f"distinct kernels seen; program exit status {status})")
    for d in captured:
        log(f"  {d['snapshot']}  grid {d['grid']} block {d['block']}  {d['regions']} "
            f"regions, {d['region_bytes']} bytes (segments {d['segment_bytes']})")
    for d in failed:
        log(f"  not captured: {d.get('kernel')}: {d.get('reason', d.get('status'))}")
    for r in summary.get("ranges", []):
        if r.get("status") == "captured":
            log(f"  range {r['name']!r}: {r['snapshot']}  {r['ops']} operations "
                f"({r['kernels']} kernels), {r['regions']} regions, {r['region_bytes']} "
                f"bytes, {r.get('scratch', 0)} scratch; roles {r.get('roles', {})}")
        else:
            log(f"  range {r['name']!r} not captured: {r.get('reason', r.get('status'))}")
    for note in summary.get("notes", []):
        log(f"kpair capture: {note}")
    return summary


__all__ = ["CaptureOutcome", "capture_program", "report"]
