"""``kpair optimize``: from a program (or snapshots, or harnesses) to a release.

The flow is a list of stages per operator, each leaving its product in a work directory so
that an interrupted run resumes where it stopped:

    capture      ``capture_program(top=K)`` on the program (capture children) WORK/capture/
    operators    one ``Operator`` per captured snapshot (``workbench``: level 2 for fused
                 kernels)
    base         ``workbench.base_harness``: an A/A harness per operator, ref = the
                 captured code object                                      WORK/ops/<op>/base
    search       the applicable strategies' candidates through
                 ``kpair.optimize.search`` (prune, confirm)                WORK/ops/<op>/search
    provenance   attempts.jsonl of every stage, director_validation.json .../provenance
    publish      the winner paired (``workbench.pair_harness``) and handed to
                 ``release add``; no winner: a refusal with
                 the search's reason (``release.refuse_operator``)
    report       report.md / report.html of the release

Each operator's log line says how near ref (and opt) come to the dispatch's speed of light
where a run measured it (``kpair.sol``), and when ref is already near its limit
(``NEAR_LIMIT``); at the end the operators whose speed of light is known are ranked by
headroom, most first.

Operators already in the release's index (published or refused) are skipped; a base harness
or a finished search (``search.json``) in the work directory is reused.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import progress
from ..candidate import Candidate
from ..capture.workflow import capture_program as run_capture
from ..errors import BackendUnavailable, KpairError, UsageError
from ..formats import Record, read, to_builtins, write
from ..options import RunOptions
from ..release import add_operator, load_index, refuse_operator
from ..release.index import PRODUCERS
from ..report import write_report
from ..result import Result, error_result
from ..session import ATTEMPTS, Attempt, read_attempts
from ..snapshot import sha256
from .baseline import FILE as BASELINE_FILE
from .baseline import BaselineRecord
from .director import FILE as DIRECTOR_FILE
from .director import METHOD, DirectorValidation
from .ranges import FILE as RANGE_FILE
from .ranges import range_record
from .search import KEEP, PRUNE, RUNG, SearchOutcome, search
from .strategies import STRATEGIES, HostC, TritonRetune
from .strategies.captured import NAME as CAPTURED_NAME
from .strategies.captured import CapturedRange, RangeCandidate, passed_speedups, producer_of
from .strategy import Context, KernelSource, first_repeat
from .workbench import Operator, base_harness, finished_capture, pair_harness

Log = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class OptimizeOptions:
    """How to optimize: strategies, their inputs, and the three measurements (prune,
    confirm, and ``release add``'s publish run)."""

    strategies: tuple[str, ...] = tuple(STRATEGIES)
    source: KernelSource | None = None
    variants: tuple[dict[str, Any], ...] = ()
    flag_sets: tuple[tuple[str, ...], ...] | None = None
    native: bool = False
    policy: Path | None = None
    keep: int = KEEP
    triton_limit: int = 48
    prune: RunOptions = PRUNE
    rungs: tuple[RunOptions, ...] = (RUNG,)
    confirm: RunOptions = field(default_factory=RunOptions)
    publish: RunOptions = field(default_factory=RunOptions)
    #: Inductor's tuned configs by mode (``kpair.optimize.baseline.tuned_configs``): each
    #: operator's is measured beside the search, as the baseline to beat.
    inductor: dict[str, dict[str, dict]] | None = None
    #: A range's captured candidates (``kpair optimize --range``): bound and judged first,
    #: then kpair's retunes of their Triton launches (``strategies.captured``; at most
    #: ``triton_limit`` configs a launch).
    captures: tuple[RangeCandidate, ...] = ()

    def __post_init__(self) -> None:
        unknown = [s for s in self.strategies if s not in STRATEGIES]
        if unknown:
            raise UsageError(f"unknown strategy {unknown[0]!r} (one of "
                             f"{', '.join(STRATEGIES)})")

    def make(self, name: str):
        if name == CAPTURED_NAME:
            return CapturedRange(self.captures, self.triton_limit)
        if name == "host-c":
            return HostC(self.flag_sets, native=self.native)
        if name == "triton":
            return TritonRetune(self.triton_limit)
        return STRATEGIES[name](self.flag_sets)


class SearchRecord(Record, kw_only=True, omit_defaults=True):
    """``WORK/ops/<op>/search.json``: a finished search, so a resumed run can publish (or
    refuse) without searching again."""

    winner: dict[str, Any] | None = None
    reason: str | None = None
    best_result: str | None = None
    evaluated: int = 0
    skipped: list[dict[str, Any]] = []


@dataclass(frozen=True)
class OperatorOutcome:
    operator: Operator
    status: str           # "published", "refused", "skipped"
    line: str
    sol: Any = None       # kpair.sol.SpeedOfLight of the run that decided it, when known
    producer: str | None = None   # the published candidate's producer (strategy, or the
                                  # name a range's captured candidate was given)


#: ref at or above this fraction of its speed of light is near its limit: little to gain.
NEAR_LIMIT = 0.85


def headroom_text(sol) -> str | None:
    """The log's words for a ``SpeedOfLight``: "ref at SOL 91% of copy bandwidth, opt 95%:
    already near its limit", or the headroom left; None when ref's fraction is unknown."""
    if sol is None or not sol.ref_fraction:
        return None
    what = "copy bandwidth" if sol.bound == "memory" else "GEMM rate"
    text = f"ref at SOL {sol.ref_fraction:.0%} of {what}"
    if sol.opt_fraction:
        text += f", opt {sol.opt_fraction:.0%}"
    if sol.ref_fraction >= NEAR_LIMIT:
        return text + ": already near its limit, little headroom"
    return text + f" (headroom {1 / sol.ref_fraction:.1f}x)"


def _with_sol(outcome: OperatorOutcome, sol) -> OperatorOutcome:
    """The outcome with its speed of light, said at the end of its line."""
    text = headroom_text(sol)
    return replace(outcome, sol=sol, line=f"{outcome.line}; {text}" if text else outcome.line)


def headroom_ranking(outcomes: Sequence[OperatorOutcome]) -> list[str]:
    """Log lines ranking the operators whose speed of light is known by headroom (floor over
    ref's time, lowest SOL fraction first); the others named as unknown."""
    known = sorted((o for o in outcomes if o.sol is not None and o.sol.ref_fraction),
                   key=lambda o: o.sol.ref_fraction)
    if not known:
        return []
    lines = ["headroom (speed of light known), most first:"]
    lines += [f"  {o.operator.key}: {headroom_text(o.sol)}" for o in known]
    unknown = [o.operator.key for o in outcomes if o not in known and o.status != "skipped"]
    if unknown:
        lines.append(f"  not known: {', '.join(unknown)}")
    return lines


# --------------------------------------------------------------------------- capture


def capture_top(command: Sequence[str], work: Path, *, top: int, kernel: str | None = None,
                log: Log = _stderr) -> Path:
    """``kpair capture -o WORK/capture --top K [--kernel REGEX] -- command`` through
    ``kpair.capture.workflow.capture_program`` (reused when it finished)."""
    out = work / "capture"
    summary = out / "capture.json"
    if finished_capture(out):
        log(f"kpair optimize: reusing the capture in {out}")
        return out
    if out.exists():
        shutil.rmtree(out)  # an interrupted capture: start it again
    work.mkdir(parents=True, exist_ok=True)
    progress.stage("profiling and capturing the program")
    log(f"kpair optimize: profiling and capturing the top {top} kernels"
        f"{f' matching {kernel!r}' if kernel else ''}: "
        f"{' '.join(command)}")
    outcome = run_capture(command, out, top=top, kernel=kernel, log=log)
    if outcome.summary is None and not summary.is_file():
        raise KpairError(f"the capture wrote no capture.json (exit status "
                         f"{outcome.exit_status}); nothing to optimize")
    return out


# --------------------------------------------------------------------------- one operator


def _context(harness, work: Path, opts: OptimizeOptions) -> Context:
    m = harness.snapshot.manifest
    source = opts.source or KernelSource.from_provenance(m.provenance or {}, harness.ref.kernel)
    return Context(work=work, source=source, variants=opts.variants,
                   flag_sets=opts.flag_sets, arch=m.arch)


def _candidates(harness, context: Context, opts: OptimizeOptions, log: Log, made=None):
    """Every applicable strategy's candidates, built in ``WORK/builds/<strategy>``: a range's
    captured candidates first, when given. ``made``: strategies made already, by name."""
    for name in ((CAPTURED_NAME,) if opts.captures else ()) + tuple(opts.strategies):
        strategy = (made or {}).get(name) or opts.make(name)
        why_not = strategy.applies(harness, context)
        if why_not:
            log(f"    {name}: not applicable ({why_not})")
            continue
        log(f"    {name}: building candidates")
        progress.stage(f"{name}: building candidates")
        build = context.work / "builds" / name
        build.mkdir(parents=True, exist_ok=True)
        ctx = Context(work=build, source=context.source, variants=context.variants,
                      flag_sets=context.flag_sets, arch=context.arch)
        try:
            yield from strategy.candidates(harness, ctx)
        except BackendUnavailable as e:
            log(f"    {name}: cannot build ({e})")


def _baselines(harness, context: Context, opts: OptimizeOptions, log: Log):
    """Inductor's tuned configs for this operator, built (``TritonRetune.baselines``)."""
    if not opts.inductor:
        return
    strategy = opts.make("triton")
    why_not = strategy.applies(harness, context)
    if why_not:
        log(f"    baseline: none ({why_not})")
        return
    build = context.work / "builds" / "inductor"
    build.mkdir(parents=True, exist_ok=True)
    try:
        yield from strategy.baselines(harness, replace(context, work=build), opts.inductor)
    except BackendUnavailable as e:
        log(f"    baseline: cannot build ({e})")


def write_provenance(search_dir: Path, prov: Path, outcome: SearchOutcome | None,
                     chosen: dict | None) -> None:
    """attempts.jsonl of every stage (numbered in one sequence; results copied beside) and,
    with a winner, director_validation.json."""

    if prov.exists():
        shutil.rmtree(prov)
    prov.mkdir(parents=True)
    lines, n = [], 0
    rungs = sorted((d.name for d in search_dir.glob("rung*") if d.name[4:].isdigit()),
                   key=lambda name: int(name[4:]))
    for stage in ("prune", *rungs, "confirm", "baseline"):
        path = search_dir / stage / ATTEMPTS
        if not path.is_file():
            continue
        for a in read_attempts(path):
            n += 1
            rel = f"{stage}/{a.result}" if a.result else None
            if rel and (search_dir / rel).is_file():
                (prov / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(search_dir / rel, prov / rel)
            fixed: Attempt = a.replace(n=n, result=rel,
                                       params={**(a.params or {}), "stage": stage})
            lines.append(json.dumps(to_builtins(fixed)) + "\n")
    (prov / ATTEMPTS).write_text("".join(lines))
    if chosen is not None:
        DirectorValidation(**chosen).write(prov / DIRECTOR_FILE)


def _director(outcome: SearchOutcome, opts: OptimizeOptions) -> dict:
    """The chosen candidate's numbers in the stage that chose it (prune or a rung)."""
    e, w = outcome.chosen_by, outcome.winner
    options = opts.rungs[int(e.step[4:]) - 1] if e.step.startswith("rung") else opts.prune
    s, c = e.result.speed, w.result.speed

    return {"speedup": s.speedup, "ci95": s.ci95, "slot_bias": s.slot_bias, "blocks": s.blocks,
            "stopped_by": s.stopped_by, "method": METHOD, "options": options.to_json(),
            "candidate_sha256": sha256(e.code()),
            "label": e.label, "strategy": e.strategy, "params": e.params,
            "attempt": e.attempt, "confirmed_speedup": c.speedup,
            "confirmed_ci95": c.reported_ci95,
            "candidates": len(outcome.pruned)}


def _record(outcome: SearchOutcome, search_dir: Path) -> SearchRecord:
    winner = None
    if outcome.winner is not None:
        w = outcome.winner
        winner = {"binary": str(w.binary), "kernel": w.kernel,
                  "launch_override": w.launch_override, "label": w.label,
                  "strategy": w.strategy, "producer": producer_of(w) or w.strategy,
                  **({"format": "plan"} if w.format == "plan" else {})}
    best = outcome.best
    best_result = None
    if best is not None:
        best_result = str(search_dir / best.step / "results" / f"{best.attempt:04d}"
                          / "result.json")
    return SearchRecord(winner=winner, reason=outcome.reason, best_result=best_result,
                        evaluated=outcome.evaluated,
                        skipped=[{"strategy": p.strategy, "label": p.label, "reason": why}
                                 for p, why in outcome.skipped])


#: The index producer of a winner kpair made itself (its strategies, its retunes of a capture).
KPAIR_SEARCH = "kpair-search"


def index_producer(winner: dict) -> str | None:
    """The published row's ``producer`` (one of ``kpair.release.index.PRODUCERS``, as the
    release tournament names its winner) of a search's ``winner`` (``SearchRecord.winner``):
    a range's captured candidate under its own name when that is one of them (say
    ``inductor-default``); anything kpair made (a strategy's candidate, kpair's retunes of a
    capture and their combination) ``kpair-search``; a capture given another name: None."""
    if winner.get("strategy") == CAPTURED_NAME:
        name = winner.get("producer")
        return name if name in PRODUCERS else None
    return KPAIR_SEARCH


def _winner(record: SearchRecord) -> Candidate:
    """The winner a finished search recorded (``search.json``), as the candidate it was."""
    w = record.winner
    return Candidate(kernel=w["kernel"], launch_override=w["launch_override"] or None,
                     label=w["label"], binary=Path(w["binary"]), strategy=w["strategy"],
                     format=w.get("format", ""))


def optimize_operator(op: Operator, release: Path, work: Path, opts: OptimizeOptions,
                      log: Log = _stderr) -> OperatorOutcome:
    """Search one operator and publish its winner, or record why there is none."""

    work.mkdir(parents=True, exist_ok=True)
    search_dir, prov = work / "search", work / "provenance"
    record_path = work / "search.json"
    made = {}
    if opts.captures and op.snapshot is not None and not record_path.is_file():
        # Retunes that beat their capture on several launches are combined: by the prune
        # step's verdicts so far.
        made[CAPTURED_NAME] = captured = opts.make(CAPTURED_NAME)
        captured.scores = lambda: passed_speedups(search_dir / "prune" / ATTEMPTS)
    base = base_harness(op, work, policy=opts.policy)
    if record_path.is_file():
        record = read(record_path, SearchRecord)
        log("    search: finished earlier, reusing its outcome")
    else:
        if search_dir.exists():
            shutil.rmtree(search_dir)  # an interrupted search: run it again
        context = _context(base, work, opts)
        outcome = search(base.root, _candidates(base, context, opts, log, made), search_dir,
                         prune=opts.prune, rungs=opts.rungs, confirm=opts.confirm,
                         keep=opts.keep, baselines=_baselines(base, context, opts, log),
                         log=log)
        write_provenance(search_dir, prov, outcome,
                         _director(outcome, opts) if outcome.winner else None)
        if outcome.baselines:
            BaselineRecord(entries=outcome.baselines).write(prov / BASELINE_FILE)
        if opts.captures:
            range_record(outcome).write(prov / RANGE_FILE)
        record = _record(outcome, search_dir)
        write(record_path, record)
    if record.winner is None:
        result = Result.read(record.best_result) if record.best_result else error_result(
            base.root, record.reason or "no candidate", kind="NotOptimized", stage="search")
        added = refuse_operator(release, base.root, level=op.level, name=op.name,
                                result=result, reason=record.reason or "no candidate",
                                provenance=prov if prov.is_dir() else None)
        return _with_sol(OperatorOutcome(op, "refused", f"excluded: {added.row.reason}"),
                         result.sol)
    w = _winner(record)
    producer = record.winner.get("producer") or w.strategy
    pair = pair_harness(base, w, work / "pair")
    added = add_operator(release, pair.root, level=op.level, name=op.name, provenance=prov,
                         options=opts.publish, producer=index_producer(record.winner))
    h = added.row.harness
    if added.added:
        lo, hi = h.reported_ci95
        return _with_sol(OperatorOutcome(op, "published", f"published ({w.strategy} "
                                         f"{w.label}): {h.speedup:.3f}x [{lo:.3f}, "
                                         f"{hi:.3f}]", producer=producer), added.row.sol)
    return _with_sol(OperatorOutcome(op, "refused",
                                     f"excluded by release add: {added.row.reason}"),
                     added.result.sol)


# --------------------------------------------------------------------------- many


def optimize(operators: Sequence[Operator], release: str | os.PathLike,
             work: str | os.PathLike, opts: OptimizeOptions | None = None, *,
             log: Log = _stderr, report: bool = True) -> list[OperatorOutcome]:
    """Optimize every operator into ``release`` (resuming; see the module docstring)."""

    release, work = Path(release), Path(work)
    opts = opts or OptimizeOptions()
    if not operators:
        raise UsageError("nothing to optimize: no operators were found")
    dup = first_repeat([op.key for op in operators])
    if dup:
        raise UsageError(f"two operators would both be {dup}")
    release.mkdir(parents=True, exist_ok=True)
    index = load_index(release)
    done = {r.key for r in (index.operators + index.refused)} if index else set()
    outcomes = []
    for i, op in enumerate(operators, 1):
        head = f"[{i}/{len(operators)}] {op.key}"
        if (op.level, op.name) in done:
            outcomes.append(OperatorOutcome(op, "skipped", "already in the release"))
            log(f"{head}: already in the release, skipped")
            continue
        log(f"{head}: searching")
        try:
            with progress.task(op.key, i, len(operators)):
                outcome = optimize_operator(op, release, work / "ops" / f"level{op.level}-"
                                            f"{op.name}", opts, log)
        except KpairError as e:  # one operator's trouble does not end the run
            outcome = OperatorOutcome(op, "failed", f"not optimized: {e}")
        outcomes.append(outcome)
        log(f"{head}: {outcome.line}")
    for line in headroom_ranking(outcomes):
        log(line)
    index = load_index(release)
    for b in index.summary.baselines if index else []:
        log(f"against Inductor's {b.mode} config: geomean {b.geomean_over_baseline:.3f}x "
            f"over {b.operators} operators; at least as fast on {b.at_least}, not slower "
            f"beyond the intervals on {b.not_slower}")
    if report and load_index(release) is not None:
        try:
            written = write_report(release)
        except BackendUnavailable:
            written = write_report(release, html_page=False)
        for path in written.values():
            log(f"report: {path}")
    return outcomes


__all__ = ["KPAIR_SEARCH", "NEAR_LIMIT", "OptimizeOptions", "OperatorOutcome", "SearchRecord",
           "capture_top", "headroom_ranking", "headroom_text", "index_producer", "optimize",
           "optimize_operator", "write_provenance"]
