"""The KernelBench Level 1 + 2 release: per problem the eager forward as ref, and as entrants
Inductor's default, max-autotune and coordinate-descent captures of the same range (and
kpair's own search when ``kpair.optimize.optimize_range`` is there), every one judged the
same way by the release tournament (``kpair.release.tournament``), the best correct one
published.

    python benchmarks/kernelbench.py release --kernelbench PATH -o REL [--levels 1,2]
        [--start N] [--count N] [--deadline 540] [--work DIR] [--batch 4] [--scale]
        [--budget-mib 64] [--max-gib 60] [--producers inductor-default,max-autotune,...]
        [--no-search] [--time-cap 1.0] [--runs 2] [--atol 1e-2] [--rtol 1e-2]

(also ``python benchmarks/kernelbench_release.py ...`` with the same arguments).

``PATH`` is a copy of the public KernelBench repository (never committed; nothing of it
reaches REL). Problems go in order (level, then number) in batches: one ``kpair capture
--range ...`` runs this file's ``child`` over a batch in one process (torch and CUDA start
once a batch). Per problem the child makes the model and inputs on the GPU (seeded; the
problem file's own sizes, or with ``--scale`` ``kernelbench_ranges.choose_scale``'s power of
two under ``--budget-mib``), runs the eager forward uncaptured, then once inside the range
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

``orchestrate`` is the call with its capture step passed in: the CPU test
(``tests/test_kernelbench_release_cpu.py``) gives it a stand-in that records host ranges (no
torch, no GPU) and checks the tournament's release and the resume. The GPU path (``child``,
``capture_batch``, ``kpair_search``) has NOT been run yet.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernelbench as kb  # noqa: E402  (problems, scaling, the problem's module and inputs)
import kernelbench_ranges as kr  # noqa: E402  (scale choice, output policy, kpair commands)

from kpair._util import utc_now  # noqa: E402
from kpair.errors import BackendUnavailable  # noqa: E402
from kpair.options import RunOptions  # noqa: E402
from kpair.release.index import INDUCTOR_PRODUCERS  # noqa: E402
from kpair.release.tournament import (  # noqa: E402
    Contest,
    Entrant,
    decided,
    record_call,
    run_contests,
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
                           env={"TORCHINDUCTOR_CACHE_DIR": str(Path(args.inductor_cache))})
        marks = {m["key"]: m for m in json.loads((work / "marks.json").read_text())} \
            if (work / "marks.json").is_file() else {}
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
                                                              "eager")), notes=scale)
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
    got, detail = verdict(cap.ref)
    if got == "nondeterministic":
        return Contest(p.level, p.name, None, notes=notes, excluded=(
            "nondeterministic-ref", f"the eager range replays nondeterministically: {detail}"))
    if got != "byte-exact":
        return Contest(p.level, p.name, None, notes=notes, excluded=(
            "capture-failed", f"the eager range's replay: {got}" + (f": {detail}"
                                                                    if detail else "")))
    policy = work / "policy.json"
    policy.write_text(json.dumps(kr.output_policy(
        cap.ref, atol, rtol, f"KernelBench's tolerance: atol={atol}, rtol={rtol} on the "
        "forward's output")))
    entrants = [Entrant(k, cap.candidates[k]) for k in INDUCTOR_PRODUCERS
                if k in cap.candidates]
    if search is None:
        notes.append("kpair-search: not entered (no kpair.optimize.optimize_range in this "
                     "kpair, or --no-search)")
    else:
        found, why = search(p, cap.ref, dict(cap.candidates), work, seconds())
        if found is not None:
            entrants.append(found)
        if why:
            notes.append(why)
    notes.append("plan, retune: not made by this driver")
    return Contest(p.level, p.name, cap.ref, entrants, policy=policy, notes=notes)


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kernelbench.py release",
                                 description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="verb")
    c = sub.add_parser("child", help="(internal) the captured program")
    c.add_argument("plan")
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "child":
        return child(Path(ap.parse_args(argv).plan))
    r = argparse.ArgumentParser(prog="kernelbench.py release",
                                description=__doc__.split("\n\n")[0])
    r.add_argument("--kernelbench", required=True, help="a copy of KernelBench")
    r.add_argument("-o", "--out", required=True, help="the release directory")
    r.add_argument("--work", default="/tmp/kb_release_work")
    r.add_argument("--sizes", default=str(SIZES))
    r.add_argument("--levels", default="1,2")
    r.add_argument("--start", type=int, default=1, help="first problem number of each level")
    r.add_argument("--count", type=int, default=None, help="problems per level")
    r.add_argument("--batch", type=int, default=4, help="problems per capture process")
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

    search = None if args.no_search else kpair_search(args, log)
    got = orchestrate(problems, Path(args.out), Path(args.work), capture_batch(args),
                      options=RunOptions(time_cap_s=args.time_cap,
                                         timeout_s=max(180.0, args.time_cap * 60)),
                      deadline=deadline, batch=args.batch, margin=args.margin,
                      verdict=None, search=search, atol=args.atol, rtol=args.rtol,
                      replay_runs=args.runs, retries=args.retries, log=log)
    return 0 if got["left"] == 0 else 3


if __name__ == "__main__":
    sys.exit(main())
