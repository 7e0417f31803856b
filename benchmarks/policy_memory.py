"""Peak memory of ``kpair policy suggest --runs N`` on a 4 MiB host harness, against N.

A host kernel whose output varies from call to call (a counter in the kernel's own static
state nudges one element per call, as an unordered reduction would): every run differs from
the first, so every run is decoded and folded into the spread, the slow path. The command
runs as a child process; its peak resident set (``wait4``'s ``ru_maxrss``, which takes in
the host executor it reaps) is read at each run count. The growth per run is the slope
between the two largest counts, and the peak at ``--target`` runs is extrapolated from it
unless ``--target`` itself was measured.

    python benchmarks/policy_memory.py [--runs 200 2000] [--target 100000] [--out FILE]

Prints one JSON document: ``peak_rss_bytes`` (at the largest measured run count),
``runs`` (that count), ``per_run_growth_bytes``, ``extrapolated_peak_rss_bytes`` at
``target_runs``, ``points`` (runs, peak RSS, seconds) and ``machine``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

KERNEL = r"""
#include <stddef.h>
/* y = x, but one element nudged by a call counter: a ref whose answer varies by run. */
void kp_noisy_copy(const float *x, float *y, int n) {
    static unsigned calls;
    for (int i = 0; i < n; i++) y[i] = x[i];
    calls++;
    y[(calls * 2654435761u) % (unsigned)n] += 1e-6f * (float)(calls % 7);
}
"""

#: Two float32 arrays of this many elements: 4 MiB of regions.
N = 512 * 1024


def build(tmp: Path) -> Path:
    from kpair.harness import create_harness
    from kpair.record import record_call
    from kpair.toolchain import compile_shared

    (tmp / "noisy.c").write_text(KERNEL)
    lib = compile_shared(tmp / "noisy.c", tmp / "noisy.so")
    x = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    record_call(lib, "kp_noisy_copy", [x, np.zeros(N, np.float32), np.int32(N)],
                tmp / "snap", names=["x", "y", "n"])
    return create_harness(tmp / "snap", tmp / "H", opt=lib).root


def peak_rss(harness: Path, runs: int, out: Path) -> tuple[int, float]:
    """(peak RSS in bytes, seconds) of one ``kpair policy suggest --runs runs``."""
    argv = [sys.executable, "-m", "kpair", "policy", "suggest", str(harness), "--runs",
            str(runs), "-o", str(out), "--force"]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.monotonic() - t0
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"policy suggest --runs {runs} failed: {err[-2000:]}")
    return usage.ru_maxrss * 1024, seconds  # Linux: kilobytes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, nargs="+", default=[200, 2000])
    p.add_argument("--target", type=int, default=100_000)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    counts = sorted(set(args.runs))
    if len(counts) < 2:
        p.error("--runs needs two counts at least (the growth is their slope)")
    with tempfile.TemporaryDirectory(prefix="kpair-policy-memory-") as tmp:
        harness = build(Path(tmp))
        size = sum(p.stat().st_size for p in (harness / "capture" / "blobs").iterdir())
        points = []
        for runs in counts:
            rss, seconds = peak_rss(harness, runs, Path(tmp) / "policy.json")
            points.append({"runs": runs, "peak_rss_bytes": rss, "seconds": round(seconds, 2)})
            print(f"{runs} runs: peak RSS {rss / 2**20:.1f} MiB in {seconds:.1f} s",
                  file=sys.stderr)
    (a, b) = points[-2], points[-1]
    growth = (b["peak_rss_bytes"] - a["peak_rss_bytes"]) / (b["runs"] - a["runs"])
    top = points[-1]
    extrapolated = top["peak_rss_bytes"] + max(growth, 0.0) * max(args.target - top["runs"], 0)
    doc = {"benchmark": "policy_memory", "harness_region_bytes": 2 * 4 * N,
           "snapshot_blob_bytes": size, "peak_rss_bytes": top["peak_rss_bytes"],
           "runs": top["runs"], "per_run_growth_bytes": round(growth, 1),
           "target_runs": args.target, "extrapolated_peak_rss_bytes": int(extrapolated),
           "under_1_gib": extrapolated < 2**30, "points": points,
           "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                       "platform": platform.platform()}}
    text = json.dumps(doc, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
