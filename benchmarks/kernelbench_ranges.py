"""KernelBench Level 2 as range harnesses: each problem's eager forward (ref) against the
``torch.compile`` forward of the same model on the same tensors (opt), judged by kpair.

    python benchmarks/kernelbench_ranges.py run --kernelbench PATH -o OUT [--level 2]
        [--start N] [--count N] [--budget-mib 64] [--deadline S] [--runs 3]
        [--atol 1e-2] [--rtol 1e-2] [--sizes SIZES.json]

``PATH`` is a copy of the public KernelBench repository (never committed; nothing of it reaches
OUT). Problems are taken in order; each is scaled (``kernelbench.scale_source``: ``batch_size``,
``M``, ``N``, ``K`` divided by a power of two) until the bytes it holds, by the CPU sizes
probe (``benchmarks/results/kernelbench_sizes_cpu.json``), fit ``--budget-mib``.

One ``kpair capture --range ...`` runs this file's ``child`` over the whole batch in one
process: per problem the model and inputs are made on the GPU (seeded), the eager forward and
the compiled forward run once uncaptured (compile, autotune), then each once inside a range
marked with ``kpair.mark`` (``<n>.eager``, ``<n>.compiled``). Then per problem:

- ``kpair replay`` of both ranges (byte-exact, nondeterministic, mismatch);
- ``kpair pair EAGER --opt-capture COMPILED --policy P``: the compiled range bound to the eager
  one (same inputs and weights by identity, the one output by declaration), under a policy
  of ``allclose`` with KernelBench's own tolerances (atol = rtol = 1e-2) on the output;
- ``kpair run`` twice: the verdict, the speedup and its re-run interval, and whether the second
  run's speedup lands inside the first's interval.

Every problem's record is appended to ``OUT/results.jsonl`` as it is decided (a call resumes
from it) and ``OUT/summary.json`` is rewritten after each: counts, geomean, byte-exact share of
the deterministic ranges. Snapshots and harnesses live in ``--work`` and are deleted per batch.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
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
    once inside its range. Writes ``marks.json`` as it goes (ok, error, output shape)."""
    import gc

    import torch

    import kpair

    plan = json.loads(plan_path.read_text())
    marks, marks_path = [], Path(plan["marks"])
    for p in plan["problems"]:
        mark = {"number": p["number"], "ok": False}
        model = inputs = compiled = out = ref_out = None
        try:
            module = kb.module_from_source(p["source"], f"kb_{p['module']}", p["file"])
            model, inputs = kb.instantiate(module, torch, "cuda")
            compiled = torch.compile(model)
            eager_name, compiled_name = range_names(p["number"])
            with torch.no_grad():
                for fn in (model, compiled, compiled):
                    fn(*inputs)
                torch.cuda.synchronize()
                with kpair.mark(eager_name) as m:
                    ref_out = model(*inputs)
                    m.outputs(ref_out)
                    torch.cuda.synchronize()
                with kpair.mark(compiled_name) as m:
                    out = compiled(*inputs)
                    m.outputs(out)
                    torch.cuda.synchronize()
            mark.update(ok=True, output_shape=list(out.shape), output_dtype=str(out.dtype))
        except Exception as e:  # noqa: BLE001 - one problem failing must not end the batch
            mark["error"] = f"{type(e).__name__}: {e}"[:2000]
        finally:
            del model, inputs, compiled, out, ref_out
            torch._dynamo.reset()
            gc.collect()
            torch.cuda.empty_cache()
        marks.append(mark)
        tmp = marks_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(marks, indent=1))
        os.replace(tmp, marks_path)
    return 0


# --------------------------------------------------------------------------- the driver

def kpair_cmd(*args: str, timeout: float) -> dict:
    """``kpair ARGS`` with its exit code, stdout, stderr and seconds (never raises)."""
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-m", "kpair", *args], capture_output=True,
                           text=True, timeout=max(1.0, timeout))
        code, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        code, out, err = 124, e.stdout or "", f"timed out after {timeout:.0f} s"
        out = out.decode() if isinstance(out, bytes) else out
    return {"exit_code": code, "stdout": out, "stderr": err[-4000:],
            "s": round(time.monotonic() - t0, 3)}


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


def judge_problem(p: dict, cap: Path, work: Path, args, deadline: float) -> dict:
    eager, compiled = (cap / n for n in range_names(p["number"]))
    row: dict = {}
    for label, snap in (("eager", eager), ("compiled", compiled)):
        if not (snap / "snapshot.json").exists():
            row[f"{label}_replay"] = {"verdict": "not captured"}
            continue
        manifest = json.loads((snap / "snapshot.json").read_text())
        rep = kpair_cmd("replay", str(snap), "--runs", str(args.runs), "--json", "-q",
                        timeout=deadline - time.monotonic())
        verdict, detail = kb.verdict_of(rep)
        row[f"{label}_replay"] = {
            "verdict": verdict, "detail": detail, "s": rep["s"],
            "ops": len(manifest.get("ops") or []) or 1,
            "region_bytes": sum(r["size"] for r in manifest["regions"]),
            "roles": sorted({r.get("role", "inout") for r in manifest["regions"]})}
    if "not captured" in (row["eager_replay"]["verdict"], row["compiled_replay"]["verdict"]):
        row["outcome"] = "not captured"
        return row
    policy = work / f"p{p['number']}.policy.json"
    policy.write_text(json.dumps(output_policy(
        eager, args.atol, args.rtol, f"KernelBench's tolerance: atol={args.atol}, "
        f"rtol={args.rtol} on the forward's output")))
    harness = work / f"p{p['number']}.harness"
    pair = kpair_cmd("pair", str(eager), "--opt-capture", str(compiled), "--policy",
                     str(policy), "-o", str(harness), "--json", "-q",
                     timeout=deadline - time.monotonic())
    row["pair"] = {"exit_code": pair["exit_code"], "s": pair["s"]}
    if pair["exit_code"] != 0:
        doc = json_of(pair) or {}
        row["pair"]["error"] = doc.get("error") or pair["stderr"].strip()[-600:]
        row["outcome"] = "pair refused"
        return row
    runs = []
    for i in (1, 2):
        out = work / f"p{p['number']}.r{i}.json"   # beside the harness: it holds only its own files
        run = kpair_cmd("run", str(harness), "-o", str(out), "--json", "-q",
                        timeout=deadline - time.monotonic())
        result = json.loads(out.read_text()) if out.exists() else None
        runs.append({"exit_code": run["exit_code"], "s": run["s"], **speed_of(result),
                     **({} if result else {"error": run["stderr"].strip()[-600:]})})
    row["runs"] = runs
    first, second = runs
    ci = first.get("ci95")
    if ci and second.get("speedup"):
        row["rerun_inside"] = ci[0] <= second["speedup"] <= ci[1]
    row["outcome"] = first.get("status") or f"run exit {first['exit_code']}"
    return row


def run(args) -> int:
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    sizes = {p["key"]: p for p in json.loads(Path(args.sizes).read_text())["problems"]} \
        if Path(args.sizes).exists() else {}
    problems = [p for p in kb.discover(Path(args.kernelbench), [args.level])
                if p.number >= args.start][:args.count]
    results_path = out / "results.jsonl"
    done = set()
    if results_path.exists():
        for line in results_path.read_text().splitlines():
            with contextlib.suppress(ValueError, KeyError):
                done.add(json.loads(line)["key"])
    todo = [p for p in problems if p.key not in done]
    deadline = time.monotonic() + args.deadline
    budget = args.budget_mib << 20
    print(f"kernelbench_ranges: {len(todo)} of {len(problems)} problems to do", flush=True)
    while todo and time.monotonic() < deadline - 60:
        batch, todo = todo[:args.batch], todo[args.batch:]
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        entries = []
        for p in batch:
            k = choose_scale(sizes.get(p.key), budget)
            source, scaled = kb.scale_source(p.path.read_text(), k)
            entries.append({"number": p.number, "key": p.key, "file": str(p.path),
                            "module": p.name, "source": source, "scale": k, "scaled": scaled})
        plan = work / "plan.json"
        plan.write_text(json.dumps({"marks": str(work / "marks.json"), "problems": entries}))
        ranges = [a for e in entries for n in range_names(e["number"]) for a in ("--range", n)]
        t0 = time.monotonic()
        cap = kpair_cmd("capture", *ranges, "-o", str(work / "cap"), "-q", "--",
                        sys.executable, str(Path(__file__).resolve()), "child", str(plan),
                        timeout=min(args.capture_timeout, deadline - time.monotonic()))
        capture_s = round(time.monotonic() - t0, 3)
        marks = {m["number"]: m for m in json.loads((work / "marks.json").read_text())} \
            if (work / "marks.json").exists() else {}
        print(f"kernelbench_ranges: batch of {len(batch)} captured in {capture_s} s "
              f"(exit {cap['exit_code']})", flush=True)
        for e in entries:
            if time.monotonic() > deadline - 20:
                break
            mark = marks.get(e["number"], {})
            row = {"key": e["key"], "scale": e["scale"], "scaled": e["scaled"],
                   "batch_capture_s": capture_s, "program": mark}
            if not mark.get("ok"):
                row["outcome"] = "program failed" if mark else "program died"
                if not mark:
                    row["capture_stderr"] = cap["stderr"].strip()[-1500:]
            else:
                row.update(judge_problem(e, work / "cap", work, args, deadline))
            with open(results_path, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"kernelbench_ranges: {e['key']}: {row['outcome']} "
                  f"{(row.get('runs') or [{}])[0].get('speedup')}", flush=True)
            write_summary(results_path, out / "summary.json")
        shutil.rmtree(work, ignore_errors=True)
    write_summary(results_path, out / "summary.json")
    return 0


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
        "rows": [{"key": r["key"], "scale": r["scale"], "outcome": r.get("outcome"),
                  "speedup": (r.get("runs") or [{}])[0].get("speedup"),
                  "ci95": (r.get("runs") or [{}])[0].get("ci95"),
                  "rerun": (r.get("runs") or [{}, {}])[-1].get("speedup"),
                  "eager_ops": r.get("eager_replay", {}).get("ops"),
                  "compiled_ops": r.get("compiled_replay", {}).get("ops")} for r in rows]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=1))
    os.replace(tmp, path)
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kernelbench_ranges.py", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    c = sub.add_parser("child", help="(internal) the captured program")
    c.add_argument("plan")
    r = sub.add_parser("run", help="capture, replay, pair and run KernelBench problems")
    r.add_argument("--kernelbench", required=True)
    r.add_argument("-o", "--out", required=True)
    r.add_argument("--work", default="/tmp/kb_ranges_work")
    r.add_argument("--sizes", default=str(SIZES))
    r.add_argument("--level", type=int, default=2)
    r.add_argument("--start", type=int, default=1)
    r.add_argument("--count", type=int, default=30)
    r.add_argument("--batch", type=int, default=10)
    r.add_argument("--budget-mib", type=int, default=64)
    r.add_argument("--deadline", type=float, default=540)
    r.add_argument("--capture-timeout", type=float, default=300)
    r.add_argument("--runs", type=int, default=3)
    r.add_argument("--atol", type=float, default=1e-2)
    r.add_argument("--rtol", type=float, default=1e-2)
    args = ap.parse_args(argv)
    if args.verb == "child":
        return child(Path(args.plan))
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
