"""``kpair verify``, ``kpair release add``, ``kpair report`` and ``kpair demo``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .. import progress
from .._util import check_output, check_output_dir
from ..errors import InputError, UsageError
from ..formats import encode
from ..release import INDEX, add_operator, verify_release
from ..release.index import latest
from ..release.store import check_empty_release_dir, release_backend
from ..report import HTML_NAME, JSON_NAME, MD_NAME, operator_label, write_report
from .base import LEVEL, SECONDS, Command, check_device
from .run import (
    add_pool_arguments,
    add_run_arguments,
    check_harness_dir,
    harness_backend,
    options_from_args,
    pool_devices,
)

if TYPE_CHECKING:
    from ..release import Index, Row
    from ..release.index import Verification, VerifyRun


class ProgressLine:
    """Batch progress: one kept line per finished operator, through ``kpair.progress``
    (whose live display or plain lines show the harnesses in flight)."""

    def __init__(self):
        self.started = time.monotonic()

    def __call__(self, done: int, total: int, key: str, row: Row | None) -> None:
        if row is None:
            self.started = time.monotonic()
            return
        # Since the previous line: one harness's time in a serial run; in a pool, the gap
        # between completions.
        took, self.started = time.monotonic() - self.started, time.monotonic()
        progress.note(f"[{done}/{total}] {key}: {describe_row(row)} ({took:.1f} s)")


def _what(key: str, row: Row) -> str:
    """``level<N>/<op>``, with the range and plan it pairs (``report.operator_label``)."""
    label = operator_label(row)
    return key + label[len(row.name):]


def describe_row(row: Row) -> str:
    h = row.harness
    if row.status == "pass" and h:
        lo, hi = h.ci95
        line = (f"PASS {row.correctness.label}, {h.speedup:.3f}x "
                f"[{lo:.3f}, {hi:.3f}], slot_bias {h.slot_bias:.4f}")
        return f"{line}; {row.reason}" if row.reason else line  # a refused pass says why
    head, reason = row.status.upper(), row.reason or ""
    # A fail's reason is its correctness summary, which already starts "FAIL ...".
    return reason if reason.startswith(head) else f"{head}: {reason}"


def describe_summary(index: Index) -> list[str]:
    s, c = index.summary, index.summary.counts
    g, d = s.harness_geomean_speedup, s.director_geomean_speedup
    rng = s.slot_bias_range
    lines = [f"{c.passed} pass ({c.byte_exact} byte-exact, {c.tolerance} tolerance), "
             f"{c.excluded} excluded",
             f"Harness geomean {g:.4f}x over {s.harness_geomean_over} (recommended)"
             if g else "Harness geomean: no passing operator",
             f"Director geomean {d:.4f}x over {s.director_geomean_over} (reference only)"
             if d else "Director geomean: no director_validation.json in provenance"]
    if rng:
        lines.append(f"slot_bias {rng[0]:.4f} .. {rng[1]:.4f}")
    lines += [f"excluded: level{e.level}/{e.name} ({e.status}, {e.where}"
              + (f", {e.exclusion}" if e.exclusion else "") + f"): {e.reason}"
              for e in s.excluded]
    return lines


def _interval(ci: tuple[float, float] | None) -> str:
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "[—]"


def describe_verification(v: Verification) -> str:
    """One verification, as ``kpair verify`` prints it: the outcome, then the numbers."""
    published = f"published {_interval(v.published_ci95)}"
    if v.outcome == "different operator":
        return ("different operator: the ref differs from the published one ("
                + "; ".join(v.differs or []) + "); not compared with the published speedup")
    if v.outcome == "error":
        return f"error: the re-run could not be judged: {v.reason}"
    if v.outcome == "no published figure":
        return f"{v.verdict}: no published figure to compare with (published without a pass)"
    if v.verdict != "pass":
        return f"NOT reproduced: the re-run fails correctness: {v.reason}"
    where = "inside" if v.inside else "outside"
    compat = "intervals compatible" if v.compatible else "intervals do not overlap"
    head = "reproduced" if v.outcome == "reproduced" else "NOT reproduced"
    return (f"{head}: re-run {v.speedup:.3f}x {_interval(v.ci95)}, {where} {published}; "
            f"{compat}")


def describe_run(run: VerifyRun) -> str:
    """The release-level line of one verify run."""
    rate = f" ({run.rate:.0%})" if run.rate is not None else ""
    extra = [f"{n} {what}" for n, what in (
        (run.different_operator, "different operator(s), not compared"),
        (run.no_published_figure, "without a published figure"),
        (run.first_published, "published by this verify")) if n]
    return (f"reproduced {run.reproduced} of {run.compared}{rate} (verification {run.run}: "
            f"{run.not_reproduced} not reproduced, {run.error} error)"
            + ("; " + ", ".join(extra) if extra else ""))


def describe_reproduction(index: Index) -> list[str]:
    """Per operator, what the last verify found; then the release-level rate."""
    if not index.verifications:
        return []

    run = index.verifications[-1]
    if not any(latest(r, run.run) for r in index.operators):
        return []  # this verify published every operator: nothing was compared
    lines = []
    for r in index.operators:
        v = latest(r, run.run)
        what = describe_verification(v) if v else "published by this verify: " \
            + describe_row(r)
        lines.append(f"level{r.level}/{r.name}: {what}")
    return [*lines, describe_run(run)]


def _verify_exit(index: Index) -> int:
    """As before verification records: from the re-runs' verdicts (5 some could not be run,
    1 some fail correctness). Reproduction itself does not change the exit status."""

    run = index.verifications[-1].run if index.verifications else None
    statuses = set()
    for r in index.operators:
        v = latest(r, run) if run is not None else None
        statuses.add(v.verdict if v else r.status)
    return 5 if "error" in statuses else 1 if "fail" in statuses else 0


class Verify(Command):
    """Re-run every harness of a release, each in its own process, and record the re-runs.

    The published figures in index.json stay as they were: every re-run is appended to its
    operator's row as a verification, and the command prints, per operator, whether the
    published number reproduced (the re-run's speedup inside the published interval),
    "NOT reproduced", "different operator" (the ref code object or launch differs from the
    published one: not compared) or "error", then the release's reproduction rate.

    With --gpus (or --workers on the host backend) the harnesses are spread over a pool of
    devices, one in flight per device; --each runs every harness on every device and puts
    the devices' verdicts side by side; --ray runs them as tasks of a Ray cluster. A run that
    was interrupted is resumed (finished results are kept; --fresh runs everything again).
    Exit status (from the re-runs' verdicts, not from reproduction): 0 every operator passes,
    1 some fail correctness, 5 some could not be run.
    """

    name = "verify"
    help = "re-run every harness of a release; record whether its numbers reproduce"

    @classmethod
    def add_arguments(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("root", type=Path, help="release directory")
        add_run_arguments(p)
        add_pool_arguments(p)
        p.add_argument("--each", action="store_true",
                       help="run every harness on every device of the pool: per-device "
                       "verdicts and speedups side by side (a verdict that differs is an error)")
        p.add_argument("--fresh", action="store_true",
                       help="run every harness, even if an interrupted run finished it")
        p.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                       help="run the harnesses as Ray tasks (one GPU, or one CPU for host, "
                       "each) on the cluster at ADDRESS (default: RAY_ADDRESS, a running "
                       "local cluster, or a new one); needs pip install 'kpair[ray]'")
        p.add_argument("--no-ship", action="store_true",
                       help="with --ray: the release is on storage every node shares; do not "
                       "ship harness copies with the tasks")

    def run(self, args: argparse.Namespace) -> int:
        options = options_from_args(args)
        if not args.root.exists():  # a missing path is a bad input in every verb (exit 3)
            raise InputError("no such release directory", path=args.root)
        if not args.root.is_dir():
            raise InputError("not a release directory", path=args.root)
        check_device(release_backend(args.root), args.device)
        runner = None
        if args.ray is not None:
            if args.gpus is not None or args.workers is not None or args.each:
                raise UsageError("--ray takes its devices from the cluster: no --gpus, "
                                 "--workers or --each")
            from ..scale.ray import RayRunner  # lazy: Ray (vendor)

            runner = RayRunner(args.ray or None, ship=not args.no_ship)
        devices = pool_devices(args, release_backend(args.root))
        if args.each and (devices is None or len(devices) < 2):
            raise UsageError("--each needs a pool of two or more devices (--gpus, --workers)")
        index = verify_release(args.root, options, progress=ProgressLine(), devices=devices,
                               each=args.each, fresh=args.fresh, runner=runner)
        if args.json:
            print(encode(index), end="")
        else:
            print("\n".join(describe_summary(index)))
            print("\n".join(describe_reproduction(index)))
            print(f"index: {args.root / INDEX}")
            print(f"report: kpair report {args.root}")
        return _verify_exit(index)


class ReleaseCmd(Command):
    """Grow a release: ``kpair release add ROOT HARNESS --level N --name OP``.

    add verifies the harness first (in its own process) and publishes it only on a
    correctness pass whose speedup CI lies above 1.0 (--allow-slower: any pass); anything else
    is refused and recorded as excluded. Exit status: 0 added, 1 refused (incorrect, or not
    faster), 2 usage (e.g. it exists and --replace is missing), 5 refused (the run itself
    failed).
    """

    name = "release"
    help = "add a harness to a release (verified first)"

    @classmethod
    def add_arguments(cls, p: argparse.ArgumentParser) -> None:
        sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
        add = sub.add_parser("add", help="verify a harness and add it to a release",
                             description=cls.__doc__)
        add.add_argument("root", type=Path, help="release directory (created if absent)")
        add.add_argument("harness", type=Path, help="pair harness directory")
        add.add_argument("--level", type=LEVEL, required=True, help="1 to 99")
        add.add_argument("--name", required=True, help="operator name, e.g. 37_FrobeniusNorm_")
        add.add_argument("--replace", action="store_true",
                         help="replace an operator already in the release")
        add.add_argument("--provenance", type=Path,
                         help="directory of optimizer records (director_validation.json, ...)")
        add.add_argument("--allow-slower", action="store_true",
                         help="publish a correct opt even if its speedup CI does not lie "
                              "above 1.0")
        add_run_arguments(add)

    def run(self, args: argparse.Namespace) -> int:
        if args.action != "add":  # argparse already refuses others; kept for new actions
            raise UsageError(f"unknown action {args.action!r}")

        options = options_from_args(args)  # usage errors before anything is touched
        check_harness_dir(args.harness)
        check_device(harness_backend(args.harness), args.device)
        key = f"level{args.level}/{args.name}"
        print(f"verifying {args.harness} as {key} ...", file=sys.stderr)
        out = add_operator(args.root, args.harness, level=args.level, name=args.name,
                           replace=args.replace, provenance=args.provenance,
                           options=options, allow_slower=args.allow_slower)
        if args.json:
            print(encode(out.row), end="")
        elif out.added:
            print(f"added {_what(key, out.row)}: {describe_row(out.row)}")
        else:
            print(f"refused {_what(key, out.row)} (recorded as excluded): "
                  f"{describe_row(out.row)}")
        if not args.json:
            print(f"index: {args.root / INDEX}")
        return out.exit_code


class Report(Command):
    """Write report.html (self-contained; needs the report extra), report.md and report.json
    (the summary, and a tournament's producers side by side) for a release."""

    name = "report"
    help = "write an HTML, markdown and JSON report of a release"

    @classmethod
    def add_arguments(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("root", type=Path, help="release directory (with index.json)")
        p.add_argument("-o", "--out", type=Path, help="output directory (default: ROOT)")
        p.add_argument("--force", action="store_true",
                       help="replace report.md / .json / .html already in --out (the release's "
                       "own report in ROOT is its latest and is replaced by each run)")
        p.add_argument("--markdown-only", action="store_true",
                       help="skip the HTML page (no matplotlib needed)")
        p.add_argument("--json", action="store_true",
                       help='print {"markdown": PATH, "json": PATH, "html": PATH} as one JSON '
                       'document')

    def run(self, args: argparse.Namespace) -> int:
        import json


        if not (args.root / INDEX).is_file():
            raise InputError(f"no {INDEX} here: not a release (make one with `kpair release "
                             "add` or `kpair demo`)", path=args.root)
        out = args.out if args.out is not None else args.root
        check_output_dir(out)
        # The release's own report (in ROOT) is its latest, rewritten each time; a report
        # written elsewhere is replaced only with --force, as every verb's outputs are.
        replace = args.out is None or args.force
        for name in (MD_NAME, JSON_NAME, HTML_NAME):
            check_output(out / name, replace=replace)
        written = write_report(args.root, args.out, html_page=not args.markdown_only)
        if args.json:
            print(json.dumps({kind: str(path) for kind, path in written.items()}, indent=1))
        else:
            for kind, path in written.items():
                print(f"{kind}: {path}")
        return 0


class Demo(Command):
    """Build, verify and report a small release from C kernels shipped with kpair.

    Records real calls of naive C kernels, pairs each with an optimized build (one of them
    deliberately wrong, to show an exclusion), adds them to a release, and writes the report.
    """

    name = "demo"
    help = "build a small demo release end to end (host: any CPU, under a minute; or cuda)"

    @classmethod
    def add_arguments(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("--out", type=Path, default=Path("kpair-demo"),
                       help="release directory to create; must be absent or empty "
                            "(default: ./kpair-demo)")
        p.add_argument("--backend", choices=("host", "cuda"), default="host",
                       help="where the demo's kernels run: host (any CPU) or cuda")
        p.add_argument("--time-cap", type=SECONDS, default=None,
                       help="seconds of ABBA measurement per operator (default: demo's own)")
        p.add_argument("--json", action="store_true",
                       help="progress to stderr; stdout: one JSON document (root, index, "
                       "report, operators, as_expected)")

    def run(self, args: argparse.Namespace) -> int:
        import json

        from ..demo import run_demo  # looked up per call: tests replace run_demo

        # Refused before anything is built; a folder holding only the lock an interrupted
        # demo left behind counts as empty.
        check_empty_release_dir(args.out)
        log = (lambda s: print(s, file=sys.stderr, flush=True)) if args.json else \
            (lambda s: print(s, flush=True))
        result = run_demo(args.out, backend=args.backend, time_cap_s=args.time_cap, log=log)
        if args.json:
            print(json.dumps({
                "root": str(result.root), "index": str(result.index),
                "report": {k: str(v) for k, v in result.report.items()},
                "operators": [{"key": f"level{row.level}/{row.name}", "status": row.status,
                               "reason": row.reason} for row in result.rows],
                "wall_s": round(result.wall_s, 3), "as_expected": result.as_expected},
                indent=1))
        return 0 if result.as_expected else 1
