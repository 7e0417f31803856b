"""KernelBench Level 2 as range harnesses: each problem's eager forward (ref) against the
``torch.compile`` forward of the same model on the same tensors (opt), judged by kpair.

    python benchmarks/kernelbench_ranges.py run --kernelbench PATH -o OUT [--level 2]
        [--start N] [--count N] [--budget-mib 64] [--deadline S] [--runs 3]
        [--atol 1e-2] [--rtol 1e-2] [--sizes SIZES.json] [--jobs N] [--time-cap 2]
        [--timed-batch N] [--work DIR] [--inductor-cache DIR] [--keep]

``PATH`` is a copy of the public KernelBench repository (never committed; nothing of it reaches
OUT). Problems are taken in order; each is scaled (``kernelbench.scale_source``: ``batch_size``,
``M``, ``N``, ``K`` divided by a power of two) until the bytes it holds, by the CPU sizes
probe (``benchmarks/results/kernelbench_sizes_cpu.json``), fit ``--budget-mib``.

Per problem, five stages (``kb_pipeline``: the scheduler):

- capture: one ``kpair capture --range p<n>.eager --range p<n>.compiled`` of this file's
  ``child`` in a fresh process: the model and inputs made on the GPU (seeded), the eager
  forward and the compiled forward run uncaptured (compile, autotune), then each once inside
  a range marked with ``kpair.mark``, its output declared. Every capture shares one
  ``TORCHINDUCTOR_CACHE_DIR`` (``--inductor-cache``);
- replay: ``kpair replay`` of both ranges (byte-exact, nondeterministic, mismatch);
- pair: ``kpair pair EAGER --opt-capture COMPILED --policy P``: the compiled range bound to
  the eager one (same inputs and weights by identity, the one output by declaration), under a
  policy of ``allclose`` with KernelBench's own tolerances (atol = rtol = 1e-2) on the output;
- run and rerun: two full ``kpair run`` calls (every trust check; ``--time-cap`` seconds of
  timing for the A/B measurement and as much for the identical-binary control): the verdict,
  the speedup and its re-run interval, and whether the second run's speedup lands inside the
  first's interval. A first run that does not pass is not run again.

Capture, replay and pair run ``--jobs`` at a time (default: half the CPUs, bounded by
``--gpu-mem-gib`` at a CUDA context plus three times the problem's bytes a job); the two
timed runs run one at a time with the GPU to themselves: a readers-writer gate
(``kb_pipeline.Gate``) that a capture's program holds shared from its first CUDA call to its
exit, replay and pair while they run, a timed run exclusive. Timed runs wait in a queue and
go in phases of ``--timed-batch`` (default ``--jobs``). No stage starts that is not expected
to end before ``--deadline`` (estimates follow the stages' measured seconds); each stage's
record is kept in ``WORK/p<n>/state.json``, so a second call finishes a half-done problem
from its first missing stage and skips decided ones.

Every problem's record is appended to ``OUT/results.jsonl`` as it is decided, with
``breakdown``: capture_s (and inside it the program's import_s, gate_wait_s, setup_s,
compile_s, ranges_s), replay_s, pair_s, run_s, rerun_s; each run's own ``stage_s``,
``stopped_by`` and ``blocks``. ``OUT/summary.json`` is rewritten after each: counts, geomean,
byte-exact share of the deterministic ranges; ``OUT/schedule.json`` at the end: every stage's
start and end, the estimates, the problems left. Exit status 0: every problem decided; 3:
some left for the next call.
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
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kb_pipeline  # noqa: E402  (the scheduler: jobs pool, timed stages alone, resume)
import kernelbench as kb  # noqa: E402  (the problem loader, scaler and sizes probe)

ROOT = Path(__file__).resolve().parents[1]
SIZES = ROOT / "benchmarks" / "results" / "kernelbench_sizes_cpu.json"
SCHEMA = "kpair.kernelbench-ranges"


def range_names(number: int) -> tuple[str, str]:
    return f"p{number}.eager", f"p{number}.compiled"


def choose_scale(entry: dict | None, budget: int) -> int:
    """The smallest power of two ``k`` that brings the problem's bytes (parameters, inputs,
    outputs and every op's intermediate, by the meta-device probe) under ``budget``."""
    if not entry:
        return 1
    state = entry.get("state_bytes") or 0
    k = 1
    while state / k > budget and k < (1 << 20):
        k *= 2
    return k


# --------------------------------------------------------------------------- the child

def child(plan_path: Path) -> int:
    """Run every problem of the plan: eager and compiled forwards, each once uncaptured and
    once inside its range. Writes ``marks.json`` as it goes (ok, error, output shape, and the
    seconds of the torch import, the wait for the GPU gate, the model's setup, the compile
    with its first calls, and the two ranges)."""
    t0 = time.monotonic()
    import torch

    import kpair

    import_s = round(time.monotonic() - t0, 3)
    gate_wait_s = kb_pipeline.hold_gate_from_env()   # no CUDA call before this
    plan = json.loads(plan_path.read_text())

    def start(i: int, p: dict) -> dict:   # the import and the gate: paid once per process
        return {"number": p["number"], "ok": False, "import_s": 0.0 if i else import_s,
                "gate_wait_s": 0.0 if i else gate_wait_s}

    def one(p: dict, mark: dict) -> None:
        t1 = time.monotonic()
        module = kb.module_from_source(p["source"], f"kb_{p['module']}", p["file"])
        model, inputs = kb.instantiate(module, torch, "cuda")
        compiled = torch.compile(model)
        eager_name, compiled_name = range_names(p["number"])
        with torch.no_grad():
            model(*inputs)
            torch.cuda.synchronize()
            t2 = time.monotonic()
            for fn in (compiled, compiled):
                fn(*inputs)
            torch.cuda.synchronize()
            t3 = time.monotonic()
            mark.update(setup_s=round(t2 - t1, 3), compile_s=round(t3 - t2, 3))
            with kpair.mark(eager_name) as m:
                ref_out = model(*inputs)
                m.outputs(ref_out)
                torch.cuda.synchronize()
            with kpair.mark(compiled_name) as m:
                out = compiled(*inputs)
                m.outputs(out)
                torch.cuda.synchronize()
        mark.update(ok=True, output_shape=list(out.shape), output_dtype=str(out.dtype),
                    ranges_s=round(time.monotonic() - t3, 3))

    kb.each_problem(plan["problems"], Path(plan["marks"]), start, one, torch=torch)
    return 0


# --------------------------------------------------------------------------- the driver

def kpair_cmd(*args: str, timeout: float, env: dict[str, str] | None = None) -> dict:
    """``kpair ARGS`` (with ``env`` added) in its own process group, killed whole on a
    timeout (exit code 124); its exit code, stdout, stderr (the last 4000 characters) and
    seconds. Never raises."""
    got = kb.kpair(*args, timeout=timeout, env=env)
    return {**got, "stderr": got["stderr"][-4000:]}


def json_of(run: dict) -> dict | None:
    try:
        doc = json.loads(run["stdout"])
    except (TypeError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def output_policy(snapshot: Path, atol: float, rtol: float, note: str) -> dict:
    """``allclose`` over every live-out region of the range (role out or inout), read as
    float32 (KernelBench's problems compute in float32); byte-exact everywhere else."""
    manifest = json.loads((snapshot / "snapshot.json").read_text())
    tolerances = [{"region": r["name"], "range": [0, r["size"]], "dtype": "float32",
                   "criterion": "allclose", "atol": atol, "rtol": rtol}
                  for r in manifest["regions"]
                  if r.get("role") in ("out", "inout") and r["size"] % 4 == 0]
    return {"schema": "kpair.validation_policy", "schema_version": 1,
            "tolerances": tolerances, "allow_loose": True, "note": note}


def speed_of(result: dict | None) -> dict:
    if not result:
        return {}
    speed = result.get("speed") or {}
    correctness = result.get("correctness") or {}
    return {"status": result.get("status"), "correct": result.get("correct"),
            "correctness": correctness.get("summary") or correctness.get("mode"),
            "error": (result.get("error") or {}).get("message"),
            "speedup": speed.get("speedup"),
            "ci95": speed.get("combined_ci95") or speed.get("ci95"),
            "slot_bias": speed.get("slot_bias")}


# ---------------------------------------------------------------------------- the stages
#
# Per problem (``kb_pipeline.Job``, its folder ``WORK/p<n>``): capture (its own ``kpair
# capture`` process: torch import, the model, ``torch.compile``, both ranges; the program takes
# the GPU gate itself after its imports), replay (both ranges), pair, then the timed ``run``
# and ``rerun`` with the GPU to themselves. Each stage's record is saved as it ends
# (``state.json``), so a call cut short finishes a half-done problem next time.

def child_env(args) -> dict[str, str]:
    return {kb_pipeline.GATE_ENV: str(Path(args.work) / "gate"),
            "TORCHINDUCTOR_CACHE_DIR": str(Path(args.inductor_cache))}


def capture_child(job, timeout: float, args, *, script: Path, ranges: list[str], plan: dict,
                  records: str, cmd=None) -> tuple[dict, dict, bool]:
    """One ``kpair capture`` (a ``--range`` each of ``ranges``, into ``<job>/cap``, made
    afresh) of ``script``'s ``child`` over ``plan`` (``<job>/plan.json``) in a fresh process,
    within ``--capture-timeout`` and ``timeout``; ``cmd``: the ``kpair_cmd`` to call. The
    capture's run, the child's record of the problem (``<job>/<records>``' first; {} where it
    wrote none) and whether the call's time cut it (captured again next call).
    ``kb_pipeline.Abort`` where kpair capture did not start."""
    folder, cap = job.folder, job.folder / "cap"
    shutil.rmtree(cap, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / records).unlink(missing_ok=True)
    (folder / "plan.json").write_text(json.dumps(plan))
    limit = min(args.capture_timeout, timeout)
    cap_run = (cmd or kpair_cmd)(
        "capture", *[a for n in ranges for a in ("--range", n)], "-o", str(cap), "-q", "--",
        sys.executable, str(script), "child", str(folder / "plan.json"), timeout=limit,
        env=child_env(args))
    recs = json.loads((folder / records).read_text()) if (folder / records).exists() else []
    if not recs and not (cap / "capture.json").exists() and cap_run["exit_code"] != 124:
        said = (cap_run["stderr"].strip().splitlines() or ["no message"])[-1]
        raise kb_pipeline.Abort(f"kpair capture did not start (exit {cap_run['exit_code']}): "
                                f"{said}")
    cut = cap_run["exit_code"] == 124 and limit < args.capture_timeout
    return cap_run, (recs[0] if recs else {}), cut


def program_stop(rec: dict, program: dict, cap_run: dict) -> dict:
    """``rec``, stopped where the captured program failed (its record says why) or died (it
    wrote none: the capture's stderr kept)."""
    if not program.get("ok"):
        rec["stop"] = "program failed" if program else "program died"
        if not program:
            rec["capture_stderr"] = cap_run["stderr"].strip()[-1500:]
    return rec


def stage_capture(job, timeout: float, args) -> dict:
    """One ``kpair capture`` of the problem's two ranges in a fresh process."""
    e = job.data
    cap_run, mark, cut = capture_child(
        job, timeout, args, script=Path(__file__).resolve(), ranges=list(range_names(
            e["number"])), plan={"marks": str(job.folder / "marks.json"), "problems": [e]},
        records="marks.json")
    rec = {"capture_s": cap_run["s"], "exit_code": cap_run["exit_code"], "program": mark,
           "scale": e["scale"]}
    if cut:
        return {**rec, "cut": True}   # the call's time ran out: captured again next call
    return program_stop(rec, mark, cap_run)


def stage_replay(job, timeout: float, args) -> dict:
    """``kpair replay`` of both ranges: byte-exact, nondeterministic or mismatch."""
    rec: dict = {}
    t0 = time.monotonic()
    for label, name in zip(("eager", "compiled"), range_names(job.data["number"]),
                           strict=True):
        snap = job.folder / "cap" / name
        if not (snap / "snapshot.json").exists():
            rec[f"{label}_replay"] = {"verdict": "not captured"}
            continue
        manifest = json.loads((snap / "snapshot.json").read_text())
        rep = kpair_cmd("replay", str(snap), "--runs", str(args.runs), "--json", "-q",
                        timeout=max(1.0, timeout - (time.monotonic() - t0)))
        if rep["exit_code"] == 124:
            return {"cut": True}
        verdict, detail = kb.verdict_of(rep)
        rec[f"{label}_replay"] = {
            "verdict": verdict, "detail": detail, "s": rep["s"],
            "ops": len(manifest.get("ops") or []) or 1,
            "region_bytes": sum(r["size"] for r in manifest["regions"]),
            "stored_bytes": _stored_bytes(snap),
            "roles": sorted({r.get("role", "inout") for r in manifest["regions"]})}
    if "not captured" in (rec["eager_replay"]["verdict"], rec["compiled_replay"]["verdict"]):
        rec["stop"] = "not captured"
    rec["replay_s"] = round(time.monotonic() - t0, 3)
    return rec


def _stored_bytes(snap: Path) -> int:
    return sum(f.stat().st_size for f in snap.rglob("*") if f.is_file())


def stage_pair(job, timeout: float, args) -> dict:
    """``kpair pair EAGER --opt-capture COMPILED --policy P``: the harness."""
    eager, compiled = (job.folder / "cap" / n for n in range_names(job.data["number"]))
    policy = job.folder / "policy.json"
    policy.write_text(json.dumps(output_policy(
        eager, args.atol, args.rtol, f"KernelBench's tolerance: atol={args.atol}, "
        f"rtol={args.rtol} on the forward's output")))
    harness = job.folder / "harness"
    shutil.rmtree(harness, ignore_errors=True)
    pair = kpair_cmd("pair", str(eager), "--opt-capture", str(compiled), "--policy",
                     str(policy), "-o", str(harness), "--json", "-q", timeout=timeout)
    rec = {"exit_code": pair["exit_code"], "pair_s": pair["s"]}
    if pair["exit_code"] == 124:
        return {"cut": True}
    if pair["exit_code"] != 0:
        doc = json_of(pair) or {}
        rec.update(error=doc.get("error") or pair["stderr"].strip()[-600:],
                   stop="pair refused")
    return rec


def run_args(args) -> list[str]:
    """The ``kpair run`` options every timed run takes: the time cap of each measurement
    (the A/B one, shared by its replicates, and the identical-binary control), every trust
    check on."""
    return ["--time-cap", str(args.time_cap)]


def timed_run(harness: Path, out: Path, timeout: float, args, cmd=None) -> dict:
    """One full ``kpair run`` of the harness (through ``cmd``, default ``kpair_cmd``); its
    verdict, speedup, interval and where its seconds went (the run's own ``stage_s``; the
    rest is the worker's start)."""
    out.unlink(missing_ok=True)
    run = (cmd or kpair_cmd)("run", str(harness), "-o", str(out), "--json", "-q", *run_args(args),
                    timeout=timeout)
    if run["exit_code"] == 124:
        return {"cut": True}
    result = json.loads(out.read_text()) if out.exists() else None
    rec = {"exit_code": run["exit_code"], "s": run["s"], **speed_of(result),
           **({} if result else {"error": run["stderr"].strip()[-600:]})}
    if result:
        speed = result.get("speed") or {}
        rec["stage_s"] = result.get("stage_s")
        rec["stopped_by"] = speed.get("stopped_by")
        rec["blocks"] = speed.get("blocks")
    return rec


def stage_run(job, timeout: float, args) -> dict:
    rec = timed_run(job.folder / "harness", job.folder / "r1.json", timeout, args)
    if not rec.get("cut") and rec.get("status") != "pass":
        rec["stop"] = rec.get("status") or f"run exit {rec['exit_code']}"
    return rec


def stage_rerun(job, timeout: float, args) -> dict:
    return timed_run(job.folder / "harness", job.folder / "r2.json", timeout, args)


#: (name, function, expected seconds before any is measured, timed); the estimates are the
#: first call's guesses from the H100 run of 17:37 (capture with compile 25-50 s a problem;
#: a kpair run 9-50 s at the default 30 s time cap, about 8 s expected at --time-cap 2).
STAGES = (("capture", stage_capture, 60.0, False), ("replay", stage_replay, 12.0, False),
          ("pair", stage_pair, 10.0, False), ("run", stage_run, 10.0, True),
          ("rerun", stage_rerun, 10.0, True))


def make_stages(args, table=STAGES) -> list:
    return [kb_pipeline.Stage(name, (lambda job, t, fn=fn: fn(job, t, args)), est, timed,
                              gate_inside=name == "capture")
            for name, fn, est, timed in table]


def breakdown(state: dict) -> dict:
    """Where a problem's seconds went: capture (and inside it the program's torch import,
    compile and ranges), replay, pair, run and rerun."""
    cap, prog = state.get("capture", {}), state.get("capture", {}).get("program", {})
    return {"capture_s": cap.get("capture_s"), "import_s": prog.get("import_s"),
            "gate_wait_s": prog.get("gate_wait_s"), "setup_s": prog.get("setup_s"),
            "compile_s": prog.get("compile_s"), "ranges_s": prog.get("ranges_s"),
            "replay_s": state.get("replay", {}).get("replay_s"),
            "pair_s": state.get("pair", {}).get("pair_s"),
            "run_s": state.get("run", {}).get("s"),
            "rerun_s": state.get("rerun", {}).get("s")}


def row_of(job) -> dict:
    """The problem's line of results.jsonl, from its stage records."""
    e, st = job.data, job.state
    row = {"key": e["key"], "scale": e["scale"], "scaled": e["scaled"],
           "program": st.get("capture", {}).get("program", {}),
           "breakdown": breakdown(st)}
    if "capture_stderr" in st.get("capture", {}):
        row["capture_stderr"] = st["capture"]["capture_stderr"]
    for label in ("eager", "compiled"):
        if f"{label}_replay" in st.get("replay", {}):
            row[f"{label}_replay"] = st["replay"][f"{label}_replay"]
    if "pair" in st:
        row["pair"] = {k: st["pair"][k] for k in ("exit_code", "pair_s", "error")
                       if k in st["pair"]}
    runs = [st[n] for n in ("run", "rerun") if n in st]
    if runs:
        row["runs"] = runs
        ci = runs[0].get("ci95")
        if ci and len(runs) == 2 and runs[1].get("speedup"):
            row["rerun_inside"] = ci[0] <= runs[1]["speedup"] <= ci[1]
    row["outcome"] = job.stopped or (runs[0].get("status") if runs else None) or "?"
    errors = {n: r["error"] for n, r in st.items()
              if isinstance(r, dict) and r.get("stop") == "driver error" and r.get("error")}
    if errors:
        row["driver_error"] = errors
    return row


def entry_of(p, k: int) -> dict:
    source, scaled = kb.scale_source(p.path.read_text(), k)
    return {"number": p.number, "key": p.key, "file": str(p.path), "module": p.name,
            "source": source, "scale": k, "scaled": scaled}


def done_keys(results_path: Path) -> set[str]:
    done = set()
    if results_path.exists():
        for line in results_path.read_text().splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                done.add(json.loads(line)["key"])
    return done


def pick_jobs(args, todo_bytes: list[int]) -> int:
    """``--jobs``, else half the CPUs bounded by ``--gpu-mem-gib`` at a CUDA context and
    three times the largest problem's bytes a job."""
    if args.jobs:
        return args.jobs
    return kb_pipeline.default_jobs(os.cpu_count(), gpu_bytes=int(args.gpu_mem_gib * 2**30),
                                    per_job_bytes=3 * max(todo_bytes, default=0))


def open_call(args) -> tuple[Path, Path, dict[str, dict]]:
    """``--out`` and ``--work`` made, ``--inductor-cache`` defaulted under ``--work``, and the
    sizes probe's entries by key (none without ``--sizes``' file): (out, work, sizes)."""
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    args.inductor_cache = args.inductor_cache or str(work / "inductor-cache")
    sizes = {p["key"]: p for p in json.loads(Path(args.sizes).read_text())["problems"]} \
        if Path(args.sizes).exists() else {}
    return out, work, sizes


def scaled_job(key: str, folder: Path, data: dict, k: int,
               sizes: dict[str, dict]) -> tuple[kb_pipeline.Job, int]:
    """The problem's job at scale ``k`` (what an earlier call did at another scale dropped)
    and its bytes at that scale by the sizes probe (0 where unknown)."""
    job = kb_pipeline.Job(key, folder, data).load()
    if job.state.get("capture", {}).get("scale") not in (None, k):   # another scale
        shutil.rmtree(job.folder, ignore_errors=True)
        job.state = {}
    return job, ((sizes.get(key) or {}).get("state_bytes") or 0) // k


def append(path: Path, row: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


#: The largest file ``keep_diagnosis`` copies.
DIAG_MAX = 512 << 10


def keep_diagnosis(folder: Path, dest: Path) -> None:
    """A problem that did not pass: every JSON file of its folder (the snapshots' manifests
    and capture.json, the policy, the bound plan, the harness's files, each run's result)
    up to ``DIAG_MAX`` bytes, no blob, copied under ``dest`` with its relative path, so a
    call's results say why without keeping the snapshots."""
    for f in sorted(folder.rglob("*.json")):
        if "blobs" in f.relative_to(folder).parts or f.stat().st_size > DIAG_MAX:
            continue
        target = dest / f.relative_to(folder)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, target)


def schedule(args, prog: str, jobs: list, nbytes: list[int], stages: list, *, out: Path,
             work: Path, row_of, write_summary, seconds: tuple[str, ...],
             of: int | None = None) -> int:
    """The driver's call: ``jobs`` through ``stages`` until ``--deadline``, ``pick_jobs`` of
    them at a time. Each decided problem's ``row_of`` goes into ``out/results.jsonl`` and is
    printed with the breakdown's ``seconds`` (``capture`` for ``capture_s``, ...), the summary
    is rewritten, a problem that did not pass has its JSON files kept under ``out/diag``
    (``keep_diagnosis``), and the problem's folder is removed (unless ``--keep``); then
    schedule.json.
    0 when every job was decided, 3 when some are left for the next call; SystemExit with
    the reason where the scheduler aborted. ``of``: the problems the call looked at, printed."""
    results_path = out / "results.jsonl"
    n_jobs = pick_jobs(args, nbytes)
    t0 = time.monotonic()

    def say(s: str) -> None:
        print(f"{prog}: [{time.monotonic() - t0:.0f} s] {s}", flush=True)

    print(f"{prog}: {len(jobs)}{'' if of is None else f' of {of}'} problems to do "
          f"({sum(j.started for j in jobs)} half done), {n_jobs} jobs, deadline "
          f"{args.deadline:g} s", flush=True)

    def finish(job) -> None:
        row = row_of(job)
        append(results_path, row)
        b = row["breakdown"]
        say(f"{job.key}: {row['outcome']} {(row.get('runs') or [{}])[0].get('speedup')} ("
            + ", ".join(f"{s} {b[f'{s}_s']} s" for s in seconds) + ")")
        write_summary(results_path, out / "summary.json")
        if row["outcome"] != "pass":
            keep_diagnosis(job.folder, out / "diag" / job.folder.name)
        if not args.keep:
            shutil.rmtree(job.folder, ignore_errors=True)

    sched = kb_pipeline.Scheduler(
        stages, jobs=n_jobs, deadline=t0 + args.deadline, gate=kb_pipeline.Gate(work / "gate"),
        finish=finish, timed_batch=args.timed_batch, say=say)
    sched.run(jobs)
    write_schedule(out / "schedule.json", sched, t0, n_jobs)
    if results_path.exists():
        write_summary(results_path, out / "summary.json")
    if sched.aborted:
        raise SystemExit(f"{prog}: {sched.aborted}")
    left = len(sched.left)
    print(f"{prog}: {len(jobs) - left} decided, {left} left for the next call, "
          f"{time.monotonic() - t0:.0f} s", flush=True)
    return 0 if not left else 3


def run(args) -> int:
    out, work, sizes = open_call(args)
    only = {int(n) for n in args.only.split(",") if n.strip()} if args.only else None
    problems = [p for p in kb.discover(Path(args.kernelbench), [args.level])
                if p.number >= args.start and (only is None or p.number in only)][:args.count]
    done = done_keys(out / "results.jsonl")
    budget = args.budget_mib << 20
    jobs, nbytes = [], []
    for p in problems:
        if p.key in done:
            continue
        k = choose_scale(sizes.get(p.key), budget)
        job, n = scaled_job(p.key, work / f"p{p.number}", entry_of(p, k), k, sizes)
        jobs.append(job)
        nbytes.append(n)
    return schedule(args, "kernelbench_ranges", jobs, nbytes, make_stages(args), out=out,
                    work=work, row_of=row_of, write_summary=write_summary,
                    seconds=("capture", "compile", "replay", "pair", "run", "rerun"),
                    of=len(problems))


def write_schedule(path: Path, sched, t0: float, n_jobs: int) -> None:
    """The call's stage log (seconds from its start) and the estimates it ended with."""
    doc = {"jobs": n_jobs, "timed_batch": sched.timed_batch, "aborted": sched.aborted,
           "estimates_s": {s.name: round(sched.est(s), 3) for s in sched.stages},
           "left": [j.key for j in sched.left],
           "log": [{**e, "start": round(e["start"] - t0, 3), "end": round(e["end"] - t0, 3)}
                   for e in sched.log]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)


def write_summary(results_path: Path, path: Path) -> dict:
    rows = [json.loads(line) for line in results_path.read_text().splitlines() if line]
    passed = [r for r in rows if r.get("outcome") == "pass"]
    speedups = [r["runs"][0]["speedup"] for r in passed if r["runs"][0].get("speedup")]
    replays = [r.get(f"{m}_replay", {}).get("verdict") for r in rows
               for m in ("eager", "compiled")]
    deterministic = [v for v in replays if v in ("byte-exact", "mismatch")]
    outcomes: dict[str, int] = {}
    for r in rows:
        outcomes[r.get("outcome", "?")] = outcomes.get(r.get("outcome", "?"), 0) + 1
    summary = {
        "schema": SCHEMA, "problems": len(rows), "outcomes": outcomes,
        "passed": len(passed),
        "geomean_speedup_passed": round(math.exp(sum(map(math.log, speedups))
                                                 / len(speedups)), 4) if speedups else None,
        "rerun_inside": sum(bool(r.get("rerun_inside")) for r in passed),
        "replay_verdicts": {v: replays.count(v) for v in set(replays) if v},
        "byte_exact_of_deterministic": round(deterministic.count("byte-exact")
                                             / len(deterministic), 4) if deterministic else None,
        # where the problems' seconds went, summed (capture holds import, compile, ranges)
        "breakdown_total_s": {k: round(sum((r.get("breakdown") or {}).get(k) or 0
                                           for r in rows), 3)
                              for k in ("capture_s", "import_s", "gate_wait_s", "compile_s",
                                        "replay_s", "pair_s", "run_s", "rerun_s")},
        "rows": [{"key": r["key"], "scale": r["scale"], "outcome": r.get("outcome"),
                  "speedup": (r.get("runs") or [{}])[0].get("speedup"),
                  "ci95": (r.get("runs") or [{}])[0].get("ci95"),
                  "rerun": r["runs"][1].get("speedup") if len(r.get("runs") or []) >= 2
                  else None,
                  "eager_ops": r.get("eager_replay", {}).get("ops"),
                  "compiled_ops": r.get("compiled_replay", {}).get("ops"),
                  "breakdown": r.get("breakdown")} for r in rows]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=1))
    os.replace(tmp, path)
    return summary


def add_job_arguments(r: argparse.ArgumentParser) -> None:
    """How many untimed stages run at once and how timed runs queue: every scheduled driver's
    (kernelbench_plans.py, kernelbench_release.py)."""
    r.add_argument("--jobs", type=int, default=0, metavar="N",
                   help="untimed stages (capture, replay, pair) at a time (default: half the "
                        "CPUs, bounded by --gpu-mem-gib)")
    r.add_argument("--gpu-mem-gib", type=float, default=80.0,
                   help="GPU memory the untimed jobs share (default 80: an H100)")
    r.add_argument("--timed-batch", type=int, default=0, metavar="N",
                   help="timed runs queued before the GPU is taken for them (default: --jobs)")


def add_schedule_arguments(r: argparse.ArgumentParser, *, time_cap: float) -> None:
    """The scheduler's options, shared with kernelbench_plans.py."""
    add_job_arguments(r)
    r.add_argument("--time-cap", type=float, default=time_cap, metavar="S",
                   help=f"kpair run --time-cap of each timed run (default {time_cap:g})")
    r.add_argument("--inductor-cache", default="",
                   help="TORCHINDUCTOR_CACHE_DIR of every capture (default WORK/inductor-cache)")
    r.add_argument("--keep", action="store_true", help="keep each problem's folder in --work")


def plan(args, table=STAGES) -> int:
    """``plan``: the call ``kb_pipeline.simulate`` expects for ``--count`` problems, from the
    stages' seconds (the defaults of ``STAGES``, or ``--stage-s`` JSON: a previous call's
    measured seconds per stage, e.g. its summary's breakdown averaged); one JSON document."""
    try:
        given = json.loads(args.stage_s) if args.stage_s else {}
        if not isinstance(given, dict):
            raise ValueError("not a JSON object")
        est = {name: float(given.get(name, s)) for name, _, s, _ in table}
    except (TypeError, ValueError) as e:
        raise SystemExit(f"kernelbench plan: --stage-s takes a JSON object of "
                         f"{', '.join(n for n, *_ in table)} seconds: {e}") from None
    pool = sum(est[n] for n, _, _, timed in table if not timed)
    timed = sum(est[n] for n, _, _, t in table if t)
    doc = kb_pipeline.simulate(args.count, jobs=args.jobs, pool_s=pool, timed_s=timed,
                               timed_batch=args.timed_batch or None, deadline=args.deadline)
    print(json.dumps({**doc, "jobs": args.jobs,
                      "deadline": args.deadline if math.isfinite(args.deadline) else None,
                      "stage_s": est}))
    return 0


def add_plan_parser(sub, *, count: int) -> None:
    q = sub.add_parser("plan", help="the call's expected seconds (a model, no GPU)")
    q.add_argument("--count", type=int, default=count)
    q.add_argument("--jobs", type=int, default=8)
    q.add_argument("--timed-batch", type=int, default=0)
    q.add_argument("--deadline", type=float, default=float("inf"))
    q.add_argument("--stage-s", default="", metavar="JSON",
                   help="seconds of some stages, e.g. '{\"capture\": 45, \"run\": 7}'")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kernelbench_ranges.py", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    c = sub.add_parser("child", help="(internal) the captured program")
    c.add_argument("plan")
    add_plan_parser(sub, count=30)
    r = sub.add_parser("run", help="capture, replay, pair and run KernelBench problems")
    r.add_argument("--kernelbench", required=True)
    r.add_argument("-o", "--out", required=True)
    r.add_argument("--work", default="/tmp/kb_ranges_work",
                   help="per problem folders (kept across calls until decided: resume)")
    r.add_argument("--sizes", default=str(SIZES))
    r.add_argument("--level", type=int, default=2)
    r.add_argument("--start", type=int, default=1)
    r.add_argument("--count", type=int, default=30)
    r.add_argument("--only", default="", help="comma-separated problem numbers (of --level)")
    r.add_argument("--budget-mib", type=int, default=64)
    r.add_argument("--deadline", type=float, default=540)
    r.add_argument("--capture-timeout", type=float, default=300)
    r.add_argument("--runs", type=int, default=3, help="kpair replay --runs")
    r.add_argument("--atol", type=float, default=1e-2)
    r.add_argument("--rtol", type=float, default=1e-2)
    add_schedule_arguments(r, time_cap=2.0)
    args = ap.parse_args(argv)
    if args.verb == "child":
        return child(Path(args.plan))
    if args.verb == "plan":
        return plan(args)
    previous = signal.signal(signal.SIGTERM, kb._terminated)
    try:
        return run(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
