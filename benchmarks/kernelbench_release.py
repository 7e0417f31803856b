"""The KernelBench Level 1 + 2 release: per problem the eager forward as ref, and as entrants
Inductor's default, max-autotune and coordinate-descent captures of the same range (and
kpair's own search when ``kpair.optimize.optimize_range`` is there), every one judged the
same way by the release tournament (``kpair.release.tournament``), the best correct one
published.

    python benchmarks/kernelbench.py release --kernelbench PATH -o REL [--levels 1,2]
        [--start N] [--count N] [--deadline 540] [--work DIR] [--jobs N] [--timed-batch N]
        [--gpu-mem-gib 80] [--sequential [--batch 4]] [--scale]
        [--budget-mib 64] [--max-gib 60] [--producers inductor-default,max-autotune,...]
        [--no-search] [--time-cap 1.0] [--runs 2] [--atol 1e-2] [--rtol 1e-2]
    python benchmarks/kernelbench.py release plan [--count 200] [--jobs 8] [--entrants 4]
        [--timed-batch N] [--deadline S] [--stage-s JSON]

(also ``python benchmarks/kernelbench_release.py ...`` with the same arguments).

Scheduled (the default; ``scheduled``, ``Pipeline``): each problem goes through
``kb_pipeline``'s stages: capture (one ``kpair capture`` of ``child`` over the problem, the
program holding the GPU gate shared from its first CUDA call), replay (the eager range's
verdict, the policy), pair (each Inductor entrant, ``tournament.pair_entrant``), all three
``--jobs`` at a time; then, each holding the gate exclusive, kpair's search (its plan paired
as an entrant) and the run of every paired entrant (``tournament.run_entrant``, one at a
time). The problem is decided (``tournament.decide``) and settled into the release as soon
as its runs are in. Stage records live in ``WORK/l<level>p<n>/state.json`` (each entrant's
result in ``results/`` as it comes), so a call cut by ``--deadline`` resumes a half-done
problem at its first missing stage; ``REL/tournament_breakdown.jsonl`` holds each decided
problem's seconds (capture, eager and each producer's compile, replay, pair and run per
entrant, search) and ``REL/tournament_schedule.json`` the last call's stage log. ``plan``:
the call ``kb_pipeline.simulate`` expects (a model; pair and run seconds per entrant).

``PATH`` is a copy of the public KernelBench repository (never committed; nothing of it
reaches REL). With ``--sequential`` problems go in order (level, then number) in batches:
one ``kpair capture --range ...`` runs this file's ``child`` over a batch in one process
(torch and CUDA start once a batch), judged batch after batch. Per problem the child makes
the model and inputs on the GPU (seeded; the problem file's own sizes, or with ``--scale``
``kernelbench_ranges.choose_scale``'s power of two under ``--budget-mib``), runs the eager
forward uncaptured, then once inside the range
``l<level>p<n>.eager`` with its output declared; then per producer, after
``torch._dynamo.reset()``, ``torch.compile`` (``mode="max-autotune-no-cudagraphs"`` for
max-autotune: its choices, launched one by one as the eager range is,
``torch._inductor.config.coordinate_descent_tuning=True`` for coordinate-descent) run twice
uncaptured (compile, autotune) and once inside ``l<level>p<n>.<producer>``. A producer that
fails to compile is recorded and the others go on. Then per problem:

- ``kpair replay`` of the eager range: ``nondeterministic`` excludes the problem
  (``nondeterministic-ref``), anything else but byte-exact as ``capture-failed``;
- the policy: ``kernelbench_ranges.output_policy`` (allclose with KernelBench's own atol =
  rtol = 1e-2 on the forward's output, byte-exact elsewhere);
- with ``optimize_range`` present (and not ``--no-search``): kpair's search from the captured
  candidates into a scratch release; its winner's plan, when it is not one of the captures,
  enters as ``kpair-search``; otherwise the provenance says why there is none;
- the tournament: every entrant paired (``--opt-capture`` / ``--plan``) and run with the same
  options, the best correct one whose interval lies above 1.0 published as
  ``level<N>/<problem>`` naming its producer, or the problem excluded with its reason.

A problem the sizes probe (``benchmarks/results/kernelbench_sizes_cpu.json``) puts above
``--max-gib`` at its own sizes is excluded as ``did-not-fit`` without a capture (with
``--scale`` it is scaled down instead), and so is one whose capture ran out of GPU memory.

Calls: the release itself is the state. A problem it already holds (published or excluded) is
skipped on the next call; a batch whose capture ran out of the call's time is captured again
next call (the problem it was on counts a timeout: after ``--retries`` it is excluded as
``did-not-fit``). No batch starts within ``--margin`` seconds of ``--deadline``, every capture,
search and run is bounded by what is left. Each call is appended to ``REL/tournament_run.json``
(its wall time: capture, search, judge, publish); ``REL/report.md`` and ``REL/report.json``
(the producers side by side) are rewritten at the end of every call. Progress goes to stdout,
one line per stage.

``orchestrate`` (``--sequential``) and ``scheduled`` are the call with its capture step
passed in: the CPU test (``tests/test_kernelbench_release_cpu.py``) gives both a stand-in that
records host ranges (no torch, no GPU) and checks the tournament's release, the resume, that
no timed stage overlaps a capture and that both publish the same index. The GPU path
(``child``, ``capture_batch``, ``kpair_search``) has NOT been run yet.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kb_pipeline  # noqa: E402  (the scheduler: untimed stages pooled, timed ones alone)
import kernelbench as kb  # noqa: E402  (problems, scaling, the problem's module and inputs)
import kernelbench_ranges as kr  # noqa: E402  (scale choice, output policy, kpair commands)

from kpair._util import utc_now  # noqa: E402
from kpair.errors import BackendUnavailable  # noqa: E402
from kpair.options import RunOptions  # noqa: E402
from kpair.release.index import INDUCTOR_PRODUCERS  # noqa: E402
from kpair.release.tournament import (  # noqa: E402
    Contest,
    Entrant,
    decide,
    decided,
    describe_outcome,
    judged_of,
    pair_entrant,
    record_call,
    run_contests,
    run_entrant,
    settle,
)

ROOT = Path(__file__).resolve().parents[1]
SIZES = ROOT / "benchmarks" / "results" / "kernelbench_sizes_cpu.json"
#: How each Inductor producer compiles: torch.compile's mode, and inductor config patched
#: around the compile and its first calls. max-autotune's choices without its CUDA graphs:
#: the range is captured launch by launch, as the eager one (a graph launch is not a kernel
#: launch the capture could pair region by region).
COMPILE = {"inductor-default": {"mode": None, "config": {}},
           "max-autotune": {"mode": "max-autotune-no-cudagraphs", "config": {}},
           "coordinate-descent": {"mode": None,
                                  "config": {"coordinate_descent_tuning": True}}}
Log = Callable[[str], None]


def slug(level: int, number: int) -> str:
    return f"l{level}p{number}"


def range_name(level: int, number: int, what: str) -> str:
    """``l<level>p<n>.eager`` or ``l<level>p<n>.<producer>``."""
    return f"{slug(level, number)}.{what}"


# --------------------------------------------------------------------------- the child


def child(plan_path: Path) -> int:
    """Run every problem of the plan (in a ``kpair capture --range ...`` process): the eager
    forward once uncaptured and once in its range, then each producer's compiled forward the
    same way. ``marks.json`` is rewritten after each problem: ok, error, per producer ok or
    its error, out_of_memory."""
    import torch
    import torch._inductor.config  # noqa: F401  (patched per producer in _compiled)

    import kpair

    kb_pipeline.hold_gate_from_env()   # scheduled (``scheduled``): no CUDA call before this
    plan = json.loads(plan_path.read_text())

    def one(p: dict, mark: dict) -> None:
        t0 = time.monotonic()
        module = kb.module_from_source(p["source"], f"kb_{p['module']}", p["file"])
        model, inputs = kb.instantiate(module, torch, "cuda")
        with torch.no_grad():
            model(*inputs)
            torch.cuda.synchronize()
            with kpair.mark(range_name(p["level"], p["number"], "eager")) as m:
                ref_out = model(*inputs)
                m.outputs(ref_out)
                torch.cuda.synchronize()
        mark.update(ok=True, eager_s=round(time.monotonic() - t0, 3))
        for producer in p["producers"]:
            mark["producers"][producer] = _compiled(torch, kpair, model, inputs, producer,
                                                    range_name(p["level"], p["number"],
                                                               producer))

    kb.each_problem(plan["problems"], Path(plan["marks"]),
                    lambda i, p: {"key": p["key"], "ok": False, "producers": {}}, one,
                    torch=torch, out_of_memory=True)
    return 0


def _compiled(torch, kpair, model, inputs, producer: str, name: str) -> dict:
    """One producer's compiled forward: compiled afresh under its mode and config, run twice
    uncaptured, then once inside range ``name``."""
    how = COMPILE[producer]
    compiled = out = None
    t0 = time.monotonic()
    try:
        torch._dynamo.reset()
        patched = torch._inductor.config.patch(**how["config"]) if how["config"] \
            else contextlib.nullcontext()
        with patched, torch.no_grad():
            compiled = torch.compile(model, mode=how["mode"])
            for _ in range(2):
                compiled(*inputs)
            torch.cuda.synchronize()
            t1 = time.monotonic()
            with kpair.mark(name) as m:
                out = compiled(*inputs)
                m.outputs(out)
                torch.cuda.synchronize()
        return {"ok": True, "compile_s": round(t1 - t0, 3)}
    except Exception as e:  # noqa: BLE001 - the other producers go on
        return {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000],
                "out_of_memory": isinstance(e, torch.cuda.OutOfMemoryError)}
    finally:
        del compiled, out
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- the capture step


@dataclass
class Captured:
    """What the capture step made of one problem: the eager range (``ref``) and each
    producer's range, or why there is nothing to judge (``failed``: capture-failed;
    ``did_not_fit``), or ``cut``: the call's time ran out, capture it again next call
    (``timed_out``: the problem was being captured when the time ran out)."""

    ref: Path | None = None
    candidates: dict[str, Path] = field(default_factory=dict)
    failed: str | None = None
    did_not_fit: str | None = None
    cut: bool = False
    timed_out: bool = False
    notes: list[str] = field(default_factory=list)
    seconds: dict = field(default_factory=dict)


#: (problems, work folder, seconds it may take) -> {problem key: Captured}
CaptureFn = Callable[[Sequence, Path, float], dict]


def _snap(path: Path) -> Path | None:
    return path if (path / "snapshot.json").is_file() else None


def capture_batch(args) -> CaptureFn:
    """The GPU capture step: one ``kpair capture`` of ``child`` over the batch."""
    sizes = kb.load_sizes(Path(args.sizes)) if Path(args.sizes).is_file() else {}
    producers = list(args.producers)

    def capture(batch: Sequence, work: Path, timeout: float) -> dict:
        out: dict[str, Captured] = {}
        entries = []
        for p in batch:
            entry = sizes.get(p.key)
            state = (entry or {}).get("state_bytes") or 0
            if args.scale:
                k = kr.choose_scale(entry, args.budget_mib << 20)
            elif state > args.max_gib << 30:
                out[p.key] = Captured(did_not_fit=f"{state / 2**30:.1f} GiB at KernelBench's "
                                      f"sizes (sizes probe) > --max-gib {args.max_gib}")
                continue
            else:
                k = 1
            source, scaled = kb.scale_source(p.path.read_text(), k)
            entries.append({"level": p.level, "number": p.number, "key": p.key,
                            "file": str(p.path), "module": p.name, "source": source,
                            "scale": k, "scaled": scaled, "producers": producers})
        if not entries:
            return out
        plan = work / "plan.json"
        plan.write_text(json.dumps({"marks": str(work / "marks.json"), "problems": entries}))
        ranges = [a for e in entries for what in ("eager", *producers)
                  for a in ("--range", range_name(e["level"], e["number"], what))]
        cap = kr.kpair_cmd("capture", *ranges, "-o", str(work / "cap"), "-q", "--",
                           sys.executable, str(Path(__file__).resolve()), "child", str(plan),
                           timeout=min(timeout, args.capture_timeout),
                           env={"TORCHINDUCTOR_CACHE_DIR": str(Path(args.inductor_cache)),
                                **({kb_pipeline.GATE_ENV: str(args.gate)}
                                   if getattr(args, "gate", None) else {})})
        marks = {m["key"]: m for m in json.loads((work / "marks.json").read_text())} \
            if (work / "marks.json").is_file() else {}
        if not marks and not (work / "cap" / "capture.json").is_file() \
                and cap["exit_code"] != 124:   # no problem's fault: the machine's
            said = (cap["stderr"].strip().splitlines() or ["no message"])[-1]
            raise kb_pipeline.Abort(f"kpair capture did not start (exit {cap['exit_code']}): "
                                    f"{said}")
        died = False
        for e in entries:
            mark = marks.get(e["key"])
            if mark is None:
                if cap["exit_code"] == 124 or died:
                    out[e["key"]] = Captured(cut=True, timed_out=not died
                                             and cap["exit_code"] == 124)
                    died = True   # the problems after the one in flight were not tried
                else:   # the first problem without a mark is the one the program died in
                    died = True
                    out[e["key"]] = Captured(failed="the captured program died (exit "
                                             f"{cap['exit_code']}): "
                                             + cap["stderr"].strip()[-600:])
                continue
            scale = [f"scaled by {e['scale']} ({', '.join(e['scaled'])})"] \
                if e["scale"] > 1 else []
            if not mark.get("ok"):
                why = mark.get("error") or "no range"
                out[e["key"]] = Captured(did_not_fit=why) if mark.get("out_of_memory") \
                    else Captured(failed=why)
                continue
            c = Captured(ref=_snap(work / "cap" / range_name(e["level"], e["number"],
                                                              "eager")), notes=scale,
                         seconds={"eager_s": mark.get("eager_s"), "compile_s": {
                             k: v.get("compile_s") for k, v in mark.get("producers", {}).items()
                             if v.get("ok")}})
            for producer, got in mark.get("producers", {}).items():
                snap = _snap(work / "cap" / range_name(e["level"], e["number"], producer))
                if got.get("ok") and snap is not None:
                    c.candidates[producer] = snap
                else:
                    c.notes.append(f"{producer}: not captured: "
                                   f"{got.get('error') or 'no snapshot written'}")
            if c.ref is None:
                c.failed = "the eager range wrote no snapshot: " + cap["stderr"].strip()[-600:]
            out[e["key"]] = c
        return out

    return capture


# --------------------------------------------------------------------------- per problem


def replay_verdict(snapshot: Path, runs: int, timeout: float) -> tuple[str, str | None]:
    """``kpair replay SNAP --runs R --json``: byte-exact, nondeterministic, mismatch, ..."""
    rep = kr.kpair_cmd("replay", str(snapshot), "--runs", str(runs), "--json", "-q",
                       timeout=timeout)
    return kb.verdict_of(rep)


#: (problem, ref, {producer: snapshot}, work folder, seconds) -> (an Entrant or None, note)
SearchFn = Callable[[object, Path, dict, Path, float], tuple]


def kpair_search(args, log: Log) -> SearchFn | None:
    """kpair's own search as an entrant: ``kpair.optimize.optimize_range`` from the captured
    candidates into a scratch release; its winner's plan enters as ``kpair-search`` when it
    is not one of the captures. None when this kpair has no ``optimize_range``."""
    try:
        from kpair.optimize import OptimizeOptions, RangeCandidate, optimize_range
    except ImportError:
        return None

    def search(p, ref: Path, candidates: dict, work: Path, seconds: float) -> tuple:
        if not candidates:
            return None, "kpair-search: no captured candidate to start from"
        if seconds < args.search_min_s:
            return None, f"kpair-search: not run, {seconds:.0f} s left in the call"
        rel = work / "search-release"
        try:
            summary = optimize_range(
                ref, [RangeCandidate(k, v) for k, v in candidates.items()], rel,
                OptimizeOptions(strategies=(), triton_limit=args.triton_limit),
                level=p.level, name=p.name, work=work / "search-work", log=log)
        except Exception as e:  # noqa: BLE001 - the captures still compete without it
            return None, f"kpair-search: failed: {type(e).__name__}: {e}"[:600]
        outcome = summary.outcomes[0] if summary.outcomes else None
        if outcome is None or outcome.status != "published":
            return None, "kpair-search: no winner" + (f" ({outcome.line})" if outcome else "")
        if outcome.producer in candidates:
            return None, (f"kpair-search: its best is {outcome.producer}'s capture itself, "
                          "already an entrant")
        harness = rel / f"level{p.level}" / p.name / "harness"
        spec = json.loads((harness / "harness.json").read_text())
        if not spec.get("plan"):
            return None, "kpair-search: its winner is not a launch plan"
        prov = rel / f"level{p.level}" / p.name / "provenance"
        return Entrant("kpair-search", harness / spec["plan"], kind="plan",
                       provenance=prov if prov.is_dir() else None,
                       note=f"kpair search: {outcome.producer}"), None

    return search


def contest_for(p, cap: Captured, work: Path, *, atol: float, rtol: float,
                verdict: Callable[[Path], tuple[str, str | None]],
                search: SearchFn | None, seconds: Callable[[], float]) -> Contest:
    """The problem's contest from what was captured: excluded before judging (did not fit,
    capture failed, nondeterministic ref), or the eager range with its policy and entrants
    in producer order (Inductor's three, then kpair's search)."""
    notes = list(cap.notes)
    if cap.did_not_fit:
        return Contest(p.level, p.name, None, excluded=("did-not-fit", cap.did_not_fit),
                       notes=notes)
    if cap.failed or cap.ref is None:
        return Contest(p.level, p.name, None,
                       excluded=("capture-failed", cap.failed or "no eager range"), notes=notes)
    excluded = ref_exclusion(*verdict(cap.ref))
    if excluded is not None:
        return Contest(p.level, p.name, None, notes=notes, excluded=excluded)
    policy = write_policy(work / "policy.json", cap.ref, atol, rtol)
    entrants = inductor_entrants(cap.candidates)
    if search is None:
        notes.append(NO_SEARCH)
    else:
        found, why = search(p, cap.ref, dict(cap.candidates), work, seconds())
        if found is not None:
            entrants.append(found)
        if why:
            notes.append(why)
    notes.append(NOT_MADE)
    return Contest(p.level, p.name, cap.ref, entrants, policy=policy, notes=notes)


NO_SEARCH = "kpair-search: not entered (no kpair.optimize.optimize_range in this kpair, or " \
    "--no-search)"
NOT_MADE = "plan, retune: not made by this driver"


def ref_exclusion(got: str, detail: str | None) -> tuple[str, str] | None:
    """Why the eager range's replay verdict excludes the problem (nondeterministic-ref; any
    other verdict but byte-exact: capture-failed); None when it replays byte-exact."""
    if got == "nondeterministic":
        return "nondeterministic-ref", f"the eager range replays nondeterministically: {detail}"
    if got != "byte-exact":
        return "capture-failed", f"the eager range's replay: {got}" + (f": {detail}"
                                                                       if detail else "")
    return None


def write_policy(path: Path, ref: Path, atol: float, rtol: float) -> Path:
    """The judging policy (``kernelbench_ranges.output_policy``) written to ``path``."""
    path.write_text(json.dumps(kr.output_policy(
        ref, atol, rtol, f"KernelBench's tolerance: atol={atol}, rtol={rtol} on the "
        "forward's output")))
    return path


def inductor_entrants(candidates: dict) -> list[Entrant]:
    """Inductor's captures as entrants, in ``INDUCTOR_PRODUCERS`` order."""
    return [Entrant(k, Path(candidates[k])) for k in INDUCTOR_PRODUCERS if k in candidates]


# --------------------------------------------------------------------------- the call


#: ``REL/<this>``: per problem, the calls whose capture ran out of time while on it.
TIMEOUTS = "tournament_timeouts.json"


def orchestrate(problems: Sequence, out: Path, work: Path, capture: CaptureFn, *,
                options: RunOptions, deadline: float, batch: int = 6, margin: float = 60.0,
                verdict: Callable[[Path], tuple[str, str | None]] | None = None,
                search: SearchFn | None = None, atol: float = 1e-2, rtol: float = 1e-2,
                replay_runs: int = 2, allow_slower: bool = False, retries: int = 2,
                log: Log = print) -> dict:
    """One call: the problems the release at ``out`` has not decided, batch by batch,
    captured (``capture``), made contests (``contest_for``), played and settled, until
    ``deadline`` (``time.monotonic()``) less ``margin``. A problem whose capture ran out of
    time ``retries`` times (``TIMEOUTS`` counts them across calls) is excluded as
    ``did-not-fit``. Returns the call's counts; the call's wall time goes into
    ``RUN_FILE``, the report is rewritten."""
    from kpair.report import write_report

    t0, started = time.monotonic(), utc_now()
    out.mkdir(parents=True, exist_ok=True)
    done = decided(out)
    todo = [p for p in problems if (p.level, p.name) not in done]
    skipped = len(problems) - len(todo)
    log(f"kernelbench_release: {len(todo)} of {len(problems)} problems to decide "
        f"({skipped} already in {out})")

    def left() -> float:
        return deadline - time.monotonic()

    verdict = verdict or (lambda snap: replay_verdict(snap, replay_runs,
                                                      max(1.0, min(300.0, left()))))
    settled: list[str] = []
    cut = 0
    timeouts_path = out / TIMEOUTS
    timeouts = json.loads(timeouts_path.read_text()) if timeouts_path.is_file() else {}
    while todo and left() > margin:
        chunk, todo = todo[:batch], todo[batch:]
        folder = work / "batch"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        t1 = time.monotonic()
        caps = capture(chunk, folder, max(1.0, left() - margin / 2))
        log(f"kernelbench_release: batch of {len(chunk)} captured in "
            f"{time.monotonic() - t1:.1f} s")
        contests = []
        for p in chunk:
            cap = caps.get(p.key) or Captured(cut=True)
            if cap.timed_out:
                timeouts[p.key] = timeouts.get(p.key, 0) + 1
                timeouts_path.write_text(json.dumps(timeouts, indent=1, sort_keys=True))
                if timeouts[p.key] >= retries:
                    cap = Captured(did_not_fit=f"its capture did not finish in the time of a "
                                   f"call, {timeouts[p.key]} times")
            if (cap.cut and not cap.did_not_fit) or left() <= margin / 2:
                cut += 1
                log(f"kernelbench_release: {p.key}: left for the next call")
                continue
            pwork = folder / "problems" / p.name
            pwork.mkdir(parents=True, exist_ok=True)
            contests.append(contest_for(p, cap, pwork, atol=atol, rtol=rtol, verdict=verdict,
                                        search=search, seconds=left))
        outcomes = run_contests(out, contests, folder / "judge", options,
                                deadline=deadline - margin / 4, allow_slower=allow_slower,
                                log=log, record=False)
        settled += [o.contest.key for o in outcomes]
        cut += len(contests) - len(outcomes)
        shutil.rmtree(folder, ignore_errors=True)
    cut += len(todo)
    record_call(out, started, time.monotonic() - t0, settled, skipped)
    if (out / "index.json").is_file():
        with contextlib.suppress(BackendUnavailable):   # no matplotlib: markdown, JSON only
            write_report(out)
        log(headline(out))
    log(f"kernelbench_release: {len(settled)} decided this call, {cut} left for the next")
    return {"decided": settled, "skipped": skipped, "left": cut}


# --------------------------------------------------------------------------- the scheduled call
#
# Per problem (a ``kb_pipeline.Job``, its folder ``WORK/l<level>p<n>``): capture (one ``kpair
# capture`` of the child over this problem: the eager range and each producer's; the program
# takes the GPU gate itself after its imports), replay (the eager range's verdict, the
# policy), pair (each Inductor entrant, ``tournament.pair_entrant``), then the timed stages
# with the GPU to themselves: search (kpair's search, its plan paired as an entrant) and run
# (each paired entrant's ``kpair run``, ``tournament.run_entrant``; each result kept as it
# comes, so a cut stage runs only the missing ones next call). Once a problem's stages are
# in (or one stopped it) the scheduler's ``finish`` decides it (``tournament.decide``) and
# settles it into the release (``tournament.settle``): the same code ``play`` and
# ``run_contests`` use.

#: (name, expected seconds before any is measured, timed, per entrant): the first call's
#: guesses, kernelbench_ranges' (capture 60, replay 12, pair 10, a timed run 10), the pair
#: and the run per entrant; kpair's search a guess of its own.
STAGES = (("capture", 60.0, False, False), ("replay", 12.0, False, False),
          ("pair", 10.0, False, True), ("search", 30.0, True, False),
          ("run", 10.0, True, True))
#: ``REL/<this>``: one line per problem decided by ``scheduled``, where its seconds went.
BREAKDOWN = "tournament_breakdown.jsonl"
#: ``REL/<this>``: the last scheduled call's stage log (seconds from its start).
SCHEDULE = "tournament_schedule.json"


def _entrant_doc(j) -> dict:
    e = j.entrant
    return {"producer": e.producer, "candidate": str(e.candidate), "kind": e.kind,
            "opt_kernel": e.opt_kernel, "note": e.note,
            "provenance": str(e.provenance) if e.provenance else None,
            "harness": str(j.harness) if j.harness else None, "pair_s": j.pair_s,
            "row": j.row.to_json()}


def _judged_of_doc(doc: dict):
    from kpair.formats import convert
    from kpair.release.index import EntrantRow
    from kpair.release.tournament import Judged

    e = Entrant(doc["producer"], Path(doc["candidate"]), kind=doc["kind"],
                opt_kernel=doc["opt_kernel"], note=doc["note"],
                provenance=Path(doc["provenance"]) if doc["provenance"] else None)
    return Judged(e, convert(doc["row"], EntrantRow),
                  Path(doc["harness"]) if doc["harness"] else None, pair_s=doc["pair_s"])


class Pipeline:
    """The release's stages over ``kb_pipeline`` (see above) and the decision of each
    problem. ``capture``, ``verdict``, ``search``: as ``orchestrate`` takes them;
    ``capture_holds_gate``: the capture step's program takes the gate itself (the GPU
    child), else the scheduler holds it shared around the step (a stand-in)."""

    def __init__(self, out: Path, work: Path, capture: CaptureFn, *, options: RunOptions,
                 verdict: Callable[[Path], tuple[str, str | None]] | None = None,
                 search: SearchFn | None = None, atol: float = 1e-2, rtol: float = 1e-2,
                 replay_runs: int = 2, allow_slower: bool = False, retries: int = 2,
                 producers: Sequence[str] = INDUCTOR_PRODUCERS,
                 capture_holds_gate: bool = True, stage_s: dict | None = None,
                 log: Log = print):
        self.out, self.work, self.capture, self.options = out, work, capture, options
        self.verdict, self.search, self.atol, self.rtol = verdict, search, atol, rtol
        self.replay_runs, self.allow_slower, self.retries = replay_runs, allow_slower, retries
        self.producers, self.capture_holds_gate = list(producers), capture_holds_gate
        self.stage_s, self.log = dict(stage_s or {}), log
        self.settled: list[str] = []
        self._lock = threading.Lock()
        self.timeouts_path = out / TIMEOUTS

    # ------------------------------------------------------------------ jobs
    def job(self, p) -> kb_pipeline.Job:
        return kb_pipeline.Job(p.key, self.work / slug(p.level, p.number), {
            "level": p.level, "number": p.number, "name": p.name, "path": str(p.path)}).load()

    @staticmethod
    def problem(job) -> kb.Problem:
        d = job.data
        return kb.Problem(d["level"], d["number"], d["name"], Path(d["path"]))

    def contest(self, job, entrants=()) -> Contest:
        p, cap = self.problem(job), job.state["capture"]
        return Contest(p.level, p.name, Path(cap["ref"]), list(entrants),
                       policy=job.folder / "policy.json")

    def stages(self) -> list[kb_pipeline.Stage]:
        entrants = len(self.producers) + (self.search is not None)
        table = {"capture": self.stage_capture, "replay": self.stage_replay,
                 "pair": self.stage_pair, "search": self.stage_search, "run": self.stage_run}
        out = []
        for name, est, timed, per in STAGES:
            est = float(self.stage_s.get(name, est)) * (entrants if per else 1)
            if name == "search" and self.search is None:
                est = 0.0
            out.append(kb_pipeline.Stage(name, table[name], est, timed,
                                         gate_inside=name == "capture"
                                         and self.capture_holds_gate))
        return out

    # ------------------------------------------------------------------ stages
    def stage_capture(self, job, timeout: float) -> dict:
        p = self.problem(job)
        folder = job.folder / "capture"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        t0 = time.monotonic()
        cap = self.capture([p], folder, timeout).get(p.key) or Captured(cut=True)
        rec = {"capture_s": round(time.monotonic() - t0, 3), "notes": list(cap.notes),
               "seconds": cap.seconds}
        if cap.timed_out:
            with self._lock:
                timeouts = json.loads(self.timeouts_path.read_text()) \
                    if self.timeouts_path.is_file() else {}
                timeouts[p.key] = timeouts.get(p.key, 0) + 1
                self.timeouts_path.write_text(json.dumps(timeouts, indent=1, sort_keys=True))
            if timeouts[p.key] >= self.retries:
                cap = Captured(did_not_fit=f"its capture did not finish in the time of a "
                               f"call, {timeouts[p.key]} times")
        if cap.cut and not cap.did_not_fit:
            self.log(f"kernelbench_release: {p.key}: left for the next call")
            return {"cut": True}
        if cap.did_not_fit:
            return {**rec, "stop": "did-not-fit", "detail": cap.did_not_fit}
        if cap.failed or cap.ref is None:
            return {**rec, "stop": "capture-failed", "detail": cap.failed or "no eager range"}
        return {**rec, "ref": str(cap.ref),
                "candidates": {k: str(v) for k, v in cap.candidates.items()}}

    def stage_replay(self, job, timeout: float) -> dict:
        ref = Path(job.state["capture"]["ref"])
        t0 = time.monotonic()
        got, detail = (self.verdict or (lambda snap: replay_verdict(
            snap, self.replay_runs, max(1.0, min(300.0, timeout)))))(ref)
        rec = {"verdict": got, "replay_s": round(time.monotonic() - t0, 3)}
        excluded = ref_exclusion(got, detail)
        if excluded is not None:
            return {**rec, "stop": excluded[0], "detail": excluded[1]}
        write_policy(job.folder / "policy.json", ref, self.atol, self.rtol)
        return rec

    def stage_pair(self, job, timeout: float) -> dict:
        entrants = inductor_entrants(job.state["capture"]["candidates"])
        contest = self.contest(job, entrants)
        docs = [_entrant_doc(pair_entrant(contest, e, job.folder / "h" / f"{i}-{e.producer}"))
                for i, e in enumerate(entrants)]
        return {"entrants": docs, "pair_s": round(sum(d["pair_s"] for d in docs), 3)}

    def stage_search(self, job, timeout: float) -> dict:
        if self.search is None:
            return {"note": NO_SEARCH}
        cap, t0 = job.state["capture"], time.monotonic()
        folder = job.folder / "search"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        found, why = self.search(self.problem(job), Path(cap["ref"]),
                                 {k: Path(v) for k, v in cap["candidates"].items()}, folder,
                                 timeout)
        rec = {"note": why, "search_s": round(time.monotonic() - t0, 3)}
        if found is not None:
            n = len(job.state["pair"]["entrants"])
            rec["entrant"] = _entrant_doc(pair_entrant(
                self.contest(job), found, job.folder / "h" / f"{n}-{found.producer}"))
        return rec

    def entrant_docs(self, job) -> list[dict]:
        found = job.state.get("search", {}).get("entrant")
        return [*job.state["pair"]["entrants"], *([found] if found else [])]

    def stage_run(self, job, timeout: float) -> dict:
        """Each paired entrant's run, one after the other (the gate exclusive); each
        result is kept (``<job>/results/<i>.json``) as it comes."""
        import dataclasses

        from kpair.result import Result

        end = time.monotonic() + timeout
        results = job.folder / "results"
        results.mkdir(exist_ok=True)
        runs = []
        for i, doc in enumerate(self.entrant_docs(job)):
            path = results / f"{i}.json"
            if doc["harness"] is None:
                continue
            if not path.is_file():
                left = end - time.monotonic()
                if left < 1.0:
                    return {"cut": True}   # the results so far stay for the next call
                cap = self.options.timeout_s
                opts = dataclasses.replace(self.options, timeout_s=min(cap or left, left))
                j = run_entrant(_judged_of_doc(doc), opts, allow_slower=self.allow_slower)
                if (cap is None or left < cap) and j.row.status == "error" and \
                        j.run_s >= left - 1.0:
                    return {"cut": True}   # the call's time, not the entrant, ended it
                j.result.write(path)
                (results / f"{i}.s").write_text(json.dumps(j.run_s))
            result = Result.read(path)
            runs.append({"producer": doc["producer"], "status": result.status,
                         "run_s": json.loads((results / f"{i}.s").read_text())})
        return {"runs": runs, "run_s": round(sum(r["run_s"] for r in runs), 3)}

    # ------------------------------------------------------------------ the decision
    def outcome(self, job):
        """The problem's outcome (``tournament.decide``) from its stage records."""
        from kpair.release.index import EXCLUSION_REASONS
        from kpair.result import Result

        p, st = self.problem(job), job.state
        notes = list(st.get("capture", {}).get("notes", []))
        stopped = job.stopped
        if stopped:
            rec = next(r for r in st.values() if isinstance(r, dict) and r.get("stop"))
            reason, detail = (stopped, rec.get("detail") or "") \
                if stopped in EXCLUSION_REASONS else \
                ("capture-failed", f"{stopped}: {rec.get('error') or rec.get('detail')}")
            return decide(Contest(p.level, p.name, None, excluded=(reason, detail),
                                  notes=notes), [], allow_slower=self.allow_slower)
        note = st["search"].get("note")
        notes += [*([note] if note else []), NOT_MADE]
        judged = []
        for i, doc in enumerate(self.entrant_docs(job)):
            j = _judged_of_doc(doc)
            if j.harness is not None:
                results = job.folder / "results"
                j = judged_of(j, Result.read(results / f"{i}.json"),
                              json.loads((results / f"{i}.s").read_text()),
                              allow_slower=self.allow_slower)
            judged.append(j)
        contest = Contest(p.level, p.name, Path(st["capture"]["ref"]),
                          [j.entrant for j in judged], policy=job.folder / "policy.json",
                          notes=notes)
        return decide(contest, judged, allow_slower=self.allow_slower)

    def finish(self, job) -> None:
        """Decide the problem, settle it into the release, record its breakdown, drop its
        folder."""
        try:
            outcome = self.outcome(job)
            settle(self.out, outcome, self.options)
        except Exception as e:  # noqa: BLE001 - the other problems go on; this one is left
            self.log(f"kernelbench_release: {job.key}: not settled: {type(e).__name__}: {e}")
            return
        self.settled.append(outcome.contest.key)
        self.log(describe_outcome(outcome))
        row = {"key": job.key, "published": outcome.winner is not None,
               "producer": outcome.judged[outcome.winner].entrant.producer
               if outcome.winner is not None else None, "exclusion": outcome.exclusion,
               "breakdown": breakdown(job.state)}
        with open(self.out / BREAKDOWN, "a") as f:
            f.write(json.dumps(row) + "\n")
        shutil.rmtree(job.folder, ignore_errors=True)


def breakdown(state: dict) -> dict:
    """Where a problem's seconds went: the capture (inside it the eager forward and each
    producer's compile), the replay, each entrant's pair and run, kpair's search."""
    cap, sec = state.get("capture", {}), state.get("capture", {}).get("seconds") or {}
    pairs = [*state.get("pair", {}).get("entrants", []),
             *([state["search"]["entrant"]] if state.get("search", {}).get("entrant") else [])]
    return {"capture_s": cap.get("capture_s"), "eager_s": sec.get("eager_s"),
            "compile_s": sec.get("compile_s") or {},
            "replay_s": state.get("replay", {}).get("replay_s"),
            "pair_s": {d["producer"]: d["pair_s"] for d in pairs},
            "search_s": state.get("search", {}).get("search_s"),
            "run_s": {r["producer"]: r["run_s"] for r in state.get("run", {}).get("runs", [])}}


def scheduled(problems: Sequence, out: Path, work: Path, capture: CaptureFn, *,
              options: RunOptions, deadline: float, jobs: int = 2,
              timed_batch: int | None = None, log: Log = print, **kw) -> dict:
    """One call through ``kb_pipeline``: the problems the release at ``out`` has not decided,
    ``jobs`` untimed stages at a time, every timed one alone, until ``deadline``
    (``time.monotonic()``); ``kw``: ``Pipeline``'s. A half-done problem (its stage records
    in ``work``) resumes at its first missing stage. Returns the call's counts, as
    ``orchestrate``; ``REL/tournament_schedule.json`` holds the stage log."""
    from kpair.report import write_report

    t0, started = time.monotonic(), utc_now()
    out.mkdir(parents=True, exist_ok=True)
    done = decided(out)
    todo = [p for p in problems if (p.level, p.name) not in done]
    skipped = len(problems) - len(todo)
    pipe = Pipeline(out, work, capture, options=options, log=log, **kw)
    for p in problems:   # a decided problem's folder left by a call cut after settling
        if (p.level, p.name) in done:
            shutil.rmtree(work / slug(p.level, p.number), ignore_errors=True)
    found = [pipe.job(p) for p in todo]
    log(f"kernelbench_release: {len(todo)} of {len(problems)} problems to decide "
        f"({skipped} already in {out}, {sum(j.started for j in found)} half done), "
        f"{jobs} jobs")
    sched = kb_pipeline.Scheduler(pipe.stages(), jobs=jobs, deadline=deadline,
                                  gate=kb_pipeline.Gate(work / "gate"), finish=pipe.finish,
                                  timed_batch=timed_batch,
                                  say=lambda s: log(f"kernelbench_release: {s}"))
    sched.run(found)
    kr.write_schedule(out / SCHEDULE, sched, t0, jobs)
    record_call(out, started, time.monotonic() - t0, pipe.settled, skipped)
    if (out / "index.json").is_file():
        with contextlib.suppress(BackendUnavailable):
            write_report(out)
        log(headline(out))
    left = len(todo) - len(pipe.settled)
    log(f"kernelbench_release: {len(pipe.settled)} decided this call, {left} left for the next")
    if sched.aborted:
        log(f"kernelbench_release: stopped: {sched.aborted}")
    return {"decided": pipe.settled, "skipped": skipped, "left": left,
            "aborted": sched.aborted, "log": sched.log}


def plan(count: int, *, jobs: int, entrants: int = 4, timed_batch: int | None = None,
         deadline: float = float("inf"), stage_s: dict | None = None) -> dict:
    """What ``kb_pipeline.simulate`` expects of a scheduled call over ``count`` problems with
    ``entrants`` entrants each (the pair and the run per entrant; search counted only with a
    kpair-search entrant among them, i.e. ``entrants`` above the Inductor producers), from
    the stages' seconds (``STAGES``' guesses, or ``stage_s``)."""
    est = {name: float((stage_s or {}).get(name, s)) for name, s, _, _ in STAGES}
    if entrants <= len(INDUCTOR_PRODUCERS):
        est["search"] = 0.0
    per = {name: entrants if each else 1 for name, _, _, each in STAGES}
    pool = sum(est[n] * per[n] for n, _, timed, _ in STAGES if not timed)
    timed = sum(est[n] * per[n] for n, _, t, _ in STAGES if t)
    doc = kb_pipeline.simulate(count, jobs=jobs, pool_s=pool, timed_s=timed,
                               timed_batch=timed_batch, deadline=deadline)
    return {**doc, "jobs": jobs, "entrants": entrants, "stage_s": est,
            "calls_of_540_s": math.ceil(doc["expected_s"] / 540) if doc["expected_s"] else 0}


#: The seed release's Harness geomean (26 KernelBench Level 1/2 operators): the bar.
SEED_GEOMEAN = 1.3637


def headline(out: Path) -> str:
    """One line from ``REL/report.json``: published and excluded, the winner and Inductor's
    best against eager, the winner against Inductor's best, the wall time so far."""
    doc = json.loads((out / "report.json").read_text()).get("producers")
    if not doc:
        return "kernelbench_release: no tournament row yet"
    s = doc["summary"]

    def fig(f: dict) -> str:
        if f["geomean"] is None:
            return "-"
        lo, hi = f["interval"]
        return f"{f['geomean']:.4f}x [{lo:.4f}, {hi:.4f}] over {f['operators']}"

    vs = s["winner_vs_inductor_best"]
    return (f"kernelbench_release: {s['published']} published, "
            f"{sum(s['excluded'].values())} excluded {s['excluded']}; winner vs eager "
            f"{fig(s['winner_vs_eager'])} (seed {SEED_GEOMEAN}x); Inductor's best vs eager "
            f"{fig(s['inductor_best_vs_eager'])}; winner vs Inductor's best {fig(vs)}, at "
            f"least as fast within the interval on {vs['at_least_within_interval']}; "
            f"wall {s['wall_s']} s")


def pick_jobs(args, problems: Sequence) -> int:
    """``--jobs``, else half the CPUs bounded by ``--gpu-mem-gib`` at a CUDA context and three
    times the largest problem's bytes (sizes probe; with ``--scale`` at most its budget)."""
    if args.jobs:
        return args.jobs
    sizes = kb.load_sizes(Path(args.sizes)) if Path(args.sizes).is_file() else {}
    most = max(((sizes.get(p.key) or {}).get("state_bytes") or 0 for p in problems), default=0)
    most = min(most, args.budget_mib << 20) if args.scale else min(most, int(args.max_gib
                                                                              * 2**30))
    return kb_pipeline.default_jobs(os.cpu_count(), gpu_bytes=int(args.gpu_mem_gib * 2**30),
                                    per_job_bytes=3 * most)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kernelbench.py release",
                                 description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="verb")
    c = sub.add_parser("child", help="(internal) the captured program")
    c.add_argument("plan")
    q = sub.add_parser("plan", help="the scheduled call's expected seconds (a model)")
    q.add_argument("--count", type=int, default=200, help="problems")
    q.add_argument("--jobs", type=int, default=8)
    q.add_argument("--entrants", type=int, default=4,
                   help="entrants a problem (Inductor's three and kpair's search: 4)")
    q.add_argument("--timed-batch", type=int, default=0)
    q.add_argument("--deadline", type=float, default=float("inf"))
    q.add_argument("--stage-s", default="", metavar="JSON",
                   help="seconds of some stages (pair and run: one entrant's), e.g. "
                   "'{\"capture\": 120, \"run\": 7}'")
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "child":
        return child(Path(ap.parse_args(argv).plan))
    if argv and argv[0] == "plan":
        a = ap.parse_args(argv)
        try:
            given = json.loads(a.stage_s) if a.stage_s else {}
            if not isinstance(given, dict) or not all(
                    isinstance(v, (int, float)) for v in given.values()):
                raise ValueError("not a JSON object of numbers")
        except ValueError as e:
            raise SystemExit(f"kernelbench.py release plan: --stage-s takes a JSON object of "
                             f"{', '.join(n for n, *_ in STAGES)} seconds: {e}") from None
        print(json.dumps(plan(a.count, jobs=a.jobs, entrants=a.entrants,
                              timed_batch=a.timed_batch or None, deadline=a.deadline,
                              stage_s=given)))
        return 0
    r = argparse.ArgumentParser(prog="kernelbench.py release",
                                description=__doc__.split("\n\n")[0])
    r.add_argument("--kernelbench", required=True, help="a copy of KernelBench")
    r.add_argument("-o", "--out", required=True, help="the release directory")
    r.add_argument("--work", default="/tmp/kb_release_work")
    r.add_argument("--sizes", default=str(SIZES))
    r.add_argument("--levels", default="1,2")
    r.add_argument("--start", type=int, default=1, help="first problem number of each level")
    r.add_argument("--count", type=int, default=None, help="problems per level")
    kr.add_job_arguments(r)
    r.add_argument("--sequential", action="store_true",
                   help="batch by batch, one after the other (no scheduler; --batch)")
    r.add_argument("--batch", type=int, default=4,
                   help="with --sequential: problems per capture process")
    r.add_argument("--capture-timeout", type=float, default=420,
                   help="seconds a batch's capture may take")
    r.add_argument("--retries", type=int, default=2,
                   help="captures out of time before a problem did not fit")
    r.add_argument("--deadline", type=float, default=540, help="seconds this call may take")
    r.add_argument("--margin", type=float, default=45)
    r.add_argument("--scale", action="store_true",
                   help="scale problems down to --budget-mib (kernelbench_ranges' scaling) "
                   "instead of KernelBench's own sizes")
    r.add_argument("--budget-mib", type=int, default=64)
    r.add_argument("--max-gib", type=float, default=60,
                   help="without --scale: a problem above this (sizes probe) did not fit")
    r.add_argument("--producers", default=",".join(INDUCTOR_PRODUCERS))
    r.add_argument("--no-search", action="store_true", help="no kpair-search entrant")
    r.add_argument("--search-min-s", type=float, default=120)
    r.add_argument("--triton-limit", type=int, default=12)
    r.add_argument("--inductor-cache", default="/tmp/kb_release_inductor")
    r.add_argument("--time-cap", type=float, default=1.0, help="seconds of timing a run")
    r.add_argument("--runs", type=int, default=2, help="replays of the eager range")
    r.add_argument("--atol", type=float, default=1e-2)
    r.add_argument("--rtol", type=float, default=1e-2)
    args = r.parse_args(argv)
    args.producers = [x for x in args.producers.split(",") if x]
    unknown = [x for x in args.producers if x not in COMPILE]
    if unknown:
        r.error(f"--producers: {unknown[0]!r} is not one of {', '.join(COMPILE)}")
    levels = [int(x) for x in args.levels.split(",") if x]
    problems = [p for p in kb.discover(Path(args.kernelbench), levels)
                if p.number >= args.start]
    if args.count:
        problems = [p for level in levels
                    for p in [q for q in problems if q.level == level][:args.count]]
    deadline = time.monotonic() + args.deadline

    def log(line: str) -> None:
        print(line, flush=True)

    previous = signal.signal(signal.SIGTERM, kb._terminated)   # kill the captures too
    try:
        return _call(args, problems, deadline, log)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _call(args, problems, deadline: float, log: Log) -> int:
    search = None if args.no_search else kpair_search(args, log)
    options = RunOptions(time_cap_s=args.time_cap, timeout_s=max(180.0, args.time_cap * 60))
    if not args.sequential:
        args.gate = Path(args.work) / "gate"
        got = scheduled(problems, Path(args.out), Path(args.work), capture_batch(args),
                        options=options, deadline=deadline, jobs=pick_jobs(args, problems),
                        timed_batch=args.timed_batch or None, search=search, atol=args.atol,
                        rtol=args.rtol, replay_runs=args.runs, retries=args.retries,
                        producers=args.producers, log=log)
        if got["aborted"]:
            raise SystemExit(f"kernelbench.py release: {got['aborted']}")
        return 0 if got["left"] == 0 else 3
    try:
        got = _sequential(args, problems, options, deadline, search, log)
    except kb_pipeline.Abort as e:
        raise SystemExit(f"kernelbench.py release: {e}") from None
    return 0 if got["left"] == 0 else 3


def _sequential(args, problems, options, deadline, search, log) -> dict:
    return orchestrate(problems, Path(args.out), Path(args.work), capture_batch(args),
                       options=options, deadline=deadline, batch=args.batch,
                       margin=args.margin, verdict=None, search=search, atol=args.atol,
                       rtol=args.rtol, replay_runs=args.runs, retries=args.retries, log=log)


if __name__ == "__main__":
    sys.exit(main())
