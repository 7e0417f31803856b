"""Replay captured snapshots on the GPU and judge them against their captured post-state.

    python benchmarks/replay_check.py DIR [DIR...] [--jobs 8] [--json out.json]

Every snapshot under the DIRs (a directory holding snapshot.json) is replayed in its own
fresh process (a faulting kernel poisons its context; sm90 cluster kernels launched wrong
die with a sticky error), through kpair's public pipeline: ``open_device("cuda")``,
``Replay`` (regions placed at their captured addresses, pre-state restored before each
launch), ``device.load`` of the captured code object. The kernel runs twice:

- ``byte-exact``: both runs equal the captured post-state, byte for byte, in every region;
- ``nondeterministic``: the two replays differ from each other (atomics, races);
- ``mismatch``: the replays agree with each other but not with the capture;
- ``error``: no verdict (load, placement, launch failure, crash or timeout).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def replay_one(path: Path) -> dict:
    from kpair.backends import open_device
    from kpair.replay import Replay
    from kpair.snapshot import Snapshot

    snap = Snapshot.open(path)
    m = snap.manifest
    out: dict = {"snapshot": str(path), "kernel": m.code.kernel_name,
                 "demangled": m.provenance.get("kernel_demangled", m.code.kernel_name),
                 "regions": len(m.regions), "complete": m.complete,
                 "attributes": [a.name for a in m.launch.attributes]}
    t0 = time.perf_counter()
    with open_device("cuda") as dev:
        replay = Replay(dev, snap)
        kernel = dev.load(snap.code_object(), m.code.kernel_name, fmt=m.code.format)
        first = replay.run(kernel)
        second = replay.run(kernel)
        out["replay"] = replay.info.to_json()
    expected = replay.expected
    differs = [r.name for r in m.regions if first[r.name] != expected[r.name]]
    unstable = [r.name for r in m.regions if first[r.name] != second[r.name]]
    out["status"] = ("nondeterministic" if unstable else "mismatch" if differs
                     else "byte-exact")
    out["differing_regions"] = {
        name: sum(a != b for a, b in zip(first[name], expected[name], strict=True))
        for name in differs}
    out["unstable_regions"] = unstable
    out["replay_s"] = round(time.perf_counter() - t0, 3)
    return out


def snapshots_under(roots: list[Path]) -> list[Path]:
    found = []
    for root in roots:
        found += sorted(p.parent for p in root.rglob("snapshot.json"))
    return found


def run_isolated(path: Path, timeout: float) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_MODULE_LOADING"}
    cmd = [sys.executable, __file__, "--one", str(path)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"snapshot": str(path), "status": "error", "error": f"timeout after {timeout} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"snapshot": str(path), "status": "error",
            "error": f"replay process exited {proc.returncode}: {proc.stderr[-800:]}"}


def check(roots: list[Path], jobs: int = 8, timeout: float = 120.0) -> dict:
    paths = snapshots_under(roots)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(lambda p: run_isolated(p, timeout), paths))
    counts: dict[str, int] = {}
    for r in results:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return {"snapshots": len(results), "counts": counts,
            "wall_s": round(time.perf_counter() - t0, 2), "results": results}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="*", type=Path)
    p.add_argument("--one", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--jobs", type=int, default=8)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--json", type=Path, help="write the full report here")
    args = p.parse_args()
    if args.one:
        try:
            result = replay_one(args.one)
        except Exception as e:  # one JSON line per snapshot, whatever happened
            result = {"snapshot": str(args.one), "status": "error",
                      "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(result))
        return 0
    report = check(args.dirs, args.jobs, args.timeout)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    for r in report["results"]:
        extra = r.get("error") or r.get("differing_regions") or ""
        print(f"{r['status']:16s} {Path(r['snapshot']).name:48s} {extra}")
    print(json.dumps({k: report[k] for k in ("snapshots", "counts", "wall_s")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
