"""Host timing under load: honest pairs and the thread-handoff cheat, idle and beside CPU hogs.

Runs harnesses on kp_matmul (tests/csrc/matmul.c; tests/csrc/adversarial.c for the cheat)
in their isolated worker, as ``kpair run`` does, first on an otherwise idle machine, then
while ``--hogs`` busy-loop processes (``python -c "while True: pass"``) compete for the CPUs,
and prints one JSON line per run: the speedup and its CI, and timing_integrity's verdict and
figures (``hidden_s`` against ``threshold_s``).

    python benchmarks/host_load.py [--hogs 4] [--repeat 3] [--time-cap 2]

Pairs: ``aa`` (naive n=128 against itself, ``--aa``), ``fast`` (naive against loop-reordered,
n=256: must be faster, CI above 1), ``deferred`` (hands the work to a detached thread and
returns: timing_integrity must fail).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from kpair.harness import create_harness
from kpair.isolation import run_isolated
from kpair.pipeline import RunOptions
from kpair.record import record_call
from kpair.toolchain import compile_shared

CSRC = Path(__file__).resolve().parents[1] / "tests" / "csrc"


def _snapshot(lib: Path, out: Path, n: int) -> Path:
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    c = np.zeros((n, n), np.float32)
    record_call(lib, "kp_matmul", [a, b, c, np.int32(n)], out, names=["a", "b", "c", "n"])
    return out


def _hogs(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hogs", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--time-cap", type=float, default=2.0)
    args = ap.parse_args(argv)
    d = Path(tempfile.mkdtemp(prefix="kpair-load-"))
    naive = compile_shared(CSRC / "matmul.c", d / "naive.so", defines={"KP_VARIANT": 0})
    fast = compile_shared(CSRC / "matmul.c", d / "fast.so", defines={"KP_VARIANT": 1})
    deferred = compile_shared(CSRC / "adversarial.c", d / "deferred.so",
                              flags=("-O2", "-pthread"), defines={"KP_CHEAT": 9})
    s128, s256 = _snapshot(naive, d / "s128", 128), _snapshot(naive, d / "s256", 256)
    s64 = _snapshot(naive, d / "s64", 64)
    pairs = {"aa": (s128, naive, True), "fast": (s256, fast, False),
             "deferred": (s64, deferred, False)}
    count = 0
    for hogs in (0, args.hogs):
        procs = _hogs(hogs)
        try:
            for _ in range(args.repeat):
                for name, (snap, opt, aa) in pairs.items():
                    count += 1
                    h = create_harness(snap, d / f"h{count}", opt=opt)
                    r = run_isolated(h.root, RunOptions(aa=aa, time_cap_s=args.time_cap,
                                                        timeout_s=300)).to_json()
                    s = r.get("speed") or {}
                    s = s.get("aa_control", s) if aa else s
                    ti = (r.get("trust") or {}).get("timing_integrity") or {}
                    f = ti.get("finding") or {}
                    print(json.dumps({
                        "pair": name, "hogs": hogs, "status": r["status"],
                        "speedup": s.get("speedup"), "ci95": s.get("ci95"),
                        "timing_integrity": ti.get("passed"),
                        "hidden_us": round(f.get("hidden_s", float("nan")) * 1e6, 1),
                        "threshold_us": round(f.get("threshold_s", float("nan")) * 1e6, 1),
                        "opt_timer_us": round(f.get("opt_timer_s", float("nan")) * 1e6, 1)}),
                        flush=True)
        finally:
            for p in procs:
                p.kill()
                p.wait()


if __name__ == "__main__":
    main()
