"""Identical-binary pairs on real captured kernels: does the reported interval contain 1.0?

    python benchmarks/identical_binary.py CAPTURE_DIR [--max 14] [--json out.json]

For every snapshot under CAPTURE_DIR (``kpair capture -o CAPTURE_DIR --distinct ...``) whose
kernel takes 5-300 us, the snapshot's own code object is paired with itself (opt = a second
load of ref's binary) and run through ``kpair run``'s pipeline (isolated worker, trust checks
on, the identical-binary control on, an A/A control with ``--aa``). Per kernel it prints the
raw speedup and CI, the A/A result (same function handle in both slots), the identical-binary
control (a second module), the combined interval and whether it holds 1.0 — as one JSON
document; ratios only, plus the kernel's median time for the 5-300 us window.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from _bench import emit


def one(snapshot: Path, work: Path, rel_ci: float) -> dict:
    from kpair.harness import create_harness
    from kpair.isolation import run_isolated
    from kpair.pipeline import RunOptions
    from kpair.snapshot import Snapshot

    snap = Snapshot.open(snapshot)
    m = snap.manifest
    opt = work / f"{snapshot.name}.{m.code.format}"
    opt.write_bytes(snap.code_object())
    row: dict = {"snapshot": snapshot.name,
                 "kernel": m.provenance.get("kernel_demangled", m.code.kernel_name)[:120]}
    try:
        h = create_harness(snapshot, work / f"h-{snapshot.name}", opt=opt)
    except Exception as e:  # noqa: BLE001 - one kernel's trouble is a row, not the end
        return {**row, "error": f"pair: {type(e).__name__}: {e}"}
    t0 = time.perf_counter()
    r = run_isolated(h.root, RunOptions(aa=True, rel_ci=rel_ci, timeout_s=300))
    row["wall_s"] = round(time.perf_counter() - t0, 2)
    if r.status != "pass":
        return {**row, "status": r.status, "reason": r.reason}
    s = r.speed
    lo, hi = s.combined_ci95
    return {**row, "status": "pass", "median_us": s.debug_only["ref_median_us"],
            "speedup": s.speedup, "ci95": s.ci95, "slot_bias": s.slot_bias,
            "aa": {"speedup": s.aa_control.speedup, "ci95": s.aa_control.ci95},
            "identical_binary": {"speedup": s.systematic.speedup, "ci95": s.systematic.ci95,
                                 "bound": s.systematic.bound},
            "combined_ci95": [lo, hi], "holds_1": lo <= 1.0 <= hi,
            "raw_ci_holds_1": s.ci95[0] <= 1.0 <= s.ci95[1], "difference": s.difference}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("capture", type=Path)
    p.add_argument("--max", type=int, default=14)
    p.add_argument("--rel-ci", type=float, default=0.005)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    snaps = sorted(d.parent for d in args.capture.rglob("snapshot.json"))
    rows = []
    with tempfile.TemporaryDirectory(prefix="kpair-ib-") as tmp:
        for s in snaps:
            if len([r for r in rows if r.get("status") == "pass" and
                    5 <= r["median_us"] <= 300]) >= args.max:
                break
            row = one(s, Path(tmp), args.rel_ci)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    judged = [r for r in rows if r.get("status") == "pass" and 5 <= r["median_us"] <= 300]
    out = {"kernels": len(judged), "holds_1": sum(r["holds_1"] for r in judged),
           "raw_ci_holds_1": sum(r["raw_ci_holds_1"] for r in judged), "rows": rows}
    emit(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
