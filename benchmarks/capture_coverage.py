"""Capture coverage over a real model: how many of its kernels kpair captures and replays
byte-exact, what the snapshots cost, and what capture costs the program.

    python benchmarks/capture_coverage.py --out DIR [--max 160] [--jobs 12] [--json R.json]

1. ``kpair capture --distinct --max N`` over benchmarks/capture_workload.py (resnet18 and a
   GPT-2-sized transformer, forward and backward, optimizer steps, a torch.compile'd MLP):
   the first dispatch of each distinct kernel, up to N.
2. Every snapshot replayed twice in a fresh process (benchmarks/replay_check.py).
3. Snapshot bytes per dispatch: the blocks its arguments point to (after narrowing), the
   allocator segments holding them (before narrowing), what was written after dedupe.
4. Overhead: the program's wall time without capture, and with capture of one dispatch
   (eager module loading included), and with lazy loading for comparison.
Prints one JSON document (also written to --json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from replay_check import check  # noqa: E402

WORKLOAD = [sys.executable, str(HERE / "capture_workload.py")]
KPAIR = [sys.executable, "-m", "kpair", "capture"]


def timed(cmd: list[str], log: Path, env: dict | None = None, timeout: float = 400) -> dict:
    t0 = time.perf_counter()
    with open(log, "w") as f:
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=f, text=True,
                                  timeout=timeout, env=env)
            code, out = proc.returncode, proc.stdout
        except subprocess.TimeoutExpired:
            code, out = "timeout", ""
    wall = time.perf_counter() - t0
    inner = {}
    for line in out.splitlines():
        if line.startswith("{"):
            inner = json.loads(line)
    return {"exit": code, "wall_s": round(wall, 2), **inner}


def bytes_report(summary: dict) -> dict:
    rows = [{"kernel": d["demangled"][:120], "snapshot": d["snapshot"],
             "block_bytes": d["region_bytes"], "segment_bytes": d["segment_bytes"],
             "state_bytes": d["state_bytes"], "stored_bytes": d["stored_bytes"],
             "deduped_bytes": d["deduped_bytes"], "code_object_bytes": d["code_object_bytes"]}
            for d in summary["dispatches"] if d["status"] == "captured"]
    if not rows:
        return {"dispatches": 0}

    def med(key):
        return int(statistics.median(r[key] for r in rows))

    total = {k: sum(r[k] for r in rows) for k in ("block_bytes", "segment_bytes",
                                                   "state_bytes", "stored_bytes")}
    return {"dispatches": len(rows), "total": total,
            "median_per_dispatch": {k: med(k) for k in total},
            "narrowing_factor": round(total["segment_bytes"] / max(total["block_bytes"], 1), 2),
            "pool_bytes_on_disk": summary["totals"]["pool_bytes"], "per_dispatch": rows}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--max", type=int, default=160)
    p.add_argument("--jobs", type=int, default=12)
    p.add_argument("--json", type=Path)
    p.add_argument("--phase", choices=("all", "coverage", "overhead"), default="all",
                   help="coverage (capture + replay), overhead (timing runs), or both")
    p.add_argument("--lazy", action="store_true",
                   help="also time a capture under lazy module loading")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict = {"workload": "torchvision resnet18 (batch 8, 224x224) fwd+bwd+SGD; 2-layer "
                    "GPT-2-width transformer (768, 12 heads, vocab 50257, 4x128 tokens, bf16 "
                    "autocast, SDPA) fwd+bwd+AdamW(foreach); torch.compile'd MLP fwd+bwd"}
    if args.phase != "overhead":
        coverage(args, result)
    if args.phase != "coverage":
        result["overhead"] = overhead(args)
    text = json.dumps(result, indent=1)
    if args.json:
        args.json.write_text(text)
    print(text)
    return 0


def coverage(args: argparse.Namespace, result: dict) -> None:
    cap_dir = args.out / "capture"
    run = timed([*KPAIR, "-o", str(cap_dir), "--distinct", "--max", str(args.max), "--",
                 *WORKLOAD], args.out / "capture.log", timeout=200)
    result["capture_run"] = run
    if not (cap_dir / "capture.json").exists():
        result["error"] = "the capture run left no capture.json (see capture.log)"
        return
    summary = json.loads((cap_dir / "capture.json").read_text())
    failed = [{"kernel": d["demangled"][:160], "reason": d.get("reason")}
              for d in summary["dispatches"] if d["status"] != "captured"]
    replay = check([cap_dir], jobs=args.jobs)
    (args.out / "replay.json").write_text(json.dumps(replay, indent=1))
    by_status: dict[str, list] = {}
    for r in replay["results"]:
        by_status.setdefault(r["status"], []).append(r)
    result["kernels"] = {
        "launches_seen": summary["launches_seen"],
        "distinct_seen": summary["distinct_kernels_seen"],
        "captured": summary["captured"], "capture_failed": len(failed),
        "replayed_byte_exact": len(by_status.get("byte-exact", [])),
        "nondeterministic": len(by_status.get("nondeterministic", [])),
        "mismatch": len(by_status.get("mismatch", [])),
        "replay_errors": len(by_status.get("error", [])),
        "with_launch_attributes": sum(bool(r.get("attributes")) for r in replay["results"]),
        "modules_loaded": summary["modules_loaded"], "module_bytes": summary["module_bytes"],
    }
    result["failures"] = {
        "capture": failed,
        "nondeterministic": [{"kernel": r["demangled"][:160], "regions": r["unstable_regions"]}
                             for r in by_status.get("nondeterministic", [])],
        "mismatch": [{"kernel": r["demangled"][:160], "differing": r["differing_regions"]}
                     for r in by_status.get("mismatch", [])],
        "replay_errors": [{"snapshot": Path(r["snapshot"]).name, "error": r.get("error")}
                          for r in by_status.get("error", [])]}
    result["bytes"] = bytes_report(summary)
    result["replay_wall_s"] = replay["wall_s"]


def overhead(args: argparse.Namespace) -> dict:
    """Wall time of the same program without capture and with capture of one dispatch."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_MODULE_LOADING"}
    runs = {"without_capture": timed([*WORKLOAD, "--no-compile"], args.out / "base.log",
                                     env=env, timeout=120),
            "capture_one_dispatch_eager": timed(
                [*KPAIR, "-o", str(args.out / "one"), "--max", "1", "--", *WORKLOAD,
                 "--no-compile"], args.out / "one.log", timeout=150)}
    if args.lazy:
        # Lazy loading never reports cudart's modules: this shows what eager loading costs
        # and that the first (PyTorch) kernel then cannot be captured.
        runs["capture_one_dispatch_lazy"] = timed(
            [*KPAIR, "-o", str(args.out / "one_lazy"), "--max", "1", "--module-loading",
             "lazy", "--", *WORKLOAD, "--no-compile"], args.out / "lazy.log", timeout=120)
    out: dict = {"program": "capture_workload.py --no-compile (same work, warm file caches)",
                 **runs}
    base = runs["without_capture"]["wall_s"]
    for key, run in runs.items():
        out[f"ratio_{key}"] = round(run["wall_s"] / base, 3)
    for name in ("one", "one_lazy"):
        s = args.out / name / "capture.json"
        if s.exists():
            d = json.loads(s.read_text())
            out[f"{name}_modules_loaded"] = d["modules_loaded"]
            out[f"{name}_module_bytes"] = d["module_bytes"]
            out[f"{name}_dispatches"] = [{k: x.get(k) for k in ("kernel", "status", "reason",
                                                                "capture_s")}
                                         for x in d["dispatches"]]
    return out


if __name__ == "__main__":
    sys.exit(main())
