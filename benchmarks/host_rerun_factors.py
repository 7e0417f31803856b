"""What does a re-run of a host harness re-roll that a measurement replicate does not?

Beside ``--hogs`` busy loops, one kp_matmul pair per size (naive against loop-reordered,
tests/csrc/matmul.c) is measured in replicates of the size ``kpair run`` uses (the default
rule split six ways), under four conditions, interleaved round by round in a shuffled order
so that a load that drifts over the minutes of the experiment reaches each of them alike:

    same      one process, the same executors and pages for every replicate
    reload    one process, fresh executors (ref and opt loaded again) per replicate
    renew     one process, fresh executors and fresh pages (``Device.renew_memory``)
    process   a fresh process per replicate (a re-run: place, load, measure)
    pinned    as renew, each executor bound to one CPU (the next one each replicate)

and, per size, ``--burst`` replicates back to back in the ``renew`` process at the end (as a
publication takes them). Each condition's spread is the standard deviation of the log
speedups of its replicates: a condition that re-rolls what a re-run re-rolls shows the
``process`` spread; one spread in time alike for every condition is the load itself.

    python benchmarks/host_rerun_factors.py [--sizes 224 256] [--rounds 8] [--hogs 2]
        [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CONDITIONS = ("same", "reload", "renew", "process", "pinned")


def _harness(tmp: Path, n: int) -> Path:
    from kpair.harness import create_harness
    from kpair.record import record_call
    from kpair.toolchain import compile_shared

    tmp.mkdir(parents=True, exist_ok=True)
    src = ROOT / "tests" / "csrc" / "matmul.c"
    naive = compile_shared(src, tmp / "naive.so", defines={"KP_VARIANT": 0})
    fast = compile_shared(src, tmp / "fast.so", defines={"KP_VARIANT": 1})
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    snap = record_call(naive, "kp_matmul", [a, b, np.zeros((n, n), np.float32), np.int32(n)],
                       tmp / f"s{n}", names=["a", "b", "c", "n"]).root
    return create_harness(snap, tmp / f"h{n}", opt=fast).root


class Meter:
    """One prepared, unchecked run of a harness whose replicates ``replicate`` measures."""

    def __init__(self, root: Path, replicates: int = 6):
        from kpair.pipeline import Candidate, Facts, RunOptions, _load_opt, _rule, prepare

        self.run, failed = prepare(root, RunOptions(checks=False, control=False),
                                   facts=Facts(harness=str(root), started=""))
        if failed is not None:
            raise SystemExit(f"{root}: the baseline failed")
        h = self.run.harness
        self.run.begin(Candidate(h.binary(h.opt), h.opt.kernel, h.opt.format, None, "opt"))
        _load_opt(self.run)
        self.rule = _rule(self.run).split(replicates)

    def replicate(self, how: str) -> dict:
        from kpair.measure import measure
        from kpair.pipeline import _reload

        if how in ("reload", "renew", "pinned"):
            _reload(self.run)
        if how in ("renew", "pinned"):
            self.run.device.renew_memory()
        if how == "pinned":
            self.cpu = (getattr(self, "cpu", -1) + 1) % os.cpu_count()
            for ex in self.run.device._executors:
                os.sched_setaffinity(ex.pid, {self.cpu})
        t0 = time.monotonic()
        before = _sched(self.run.device)
        r, _ = measure(self.run.time_one, rule=self.rule, seed=random.getrandbits(32))
        moved = {k: v - before.get(k, 0) for k, v in _sched(self.run.device).items()}
        return {"speedup": r.speedup, "ci95": list(r.ci95), "blocks": r.blocks, **moved,
                "ref_us": r.ref_median_s * 1e6, "opt_us": r.opt_median_s * 1e6,
                "wall_s": round(time.monotonic() - t0, 2), "at": round(time.time(), 1)}


def _sched(device) -> dict:
    """Migrations between CPUs and involuntary switches of the executors, summed."""
    out = {"migrations": 0, "preempted": 0}
    for ex in device._executors:
        try:
            text = Path(f"/proc/{ex.pid}/sched").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key = line.split(":")[0].strip()
            if key in ("se.nr_migrations", "nr_involuntary_switches"):
                name = "migrations" if key == "se.nr_migrations" else "preempted"
                out[name] += int(float(line.split(":")[1]))
    return out


def _one(root: Path) -> None:
    """The ``process`` condition: one replicate in this fresh process, as JSON on stdout."""
    print(json.dumps(Meter(root).replicate("same")))


def _spread(points: list[dict]) -> dict | None:
    if not points:
        return None
    y = [math.log(p["speedup"]) for p in points]
    return {"n": len(y), "geomean": math.exp(statistics.fmean(y)),
            "sd_log": statistics.stdev(y) if len(y) > 1 else None,
            "min": min(p["speedup"] for p in points), "max": max(p["speedup"] for p in points),
            "ref_us_median": statistics.median(p["ref_us"] for p in points)}


def experiment(n: int, rounds: int, burst: int, tmp: Path, conditions: list[str]) -> dict:
    root = _harness(tmp, n)
    meters = {how: Meter(root) for how in conditions if how != "process"}
    points: dict[str, list[dict]] = {how: [] for how in conditions}
    for r in range(rounds):
        order = list(conditions)
        random.shuffle(order)
        for how in order:
            if how == "process":
                out = subprocess.run([sys.executable, __file__, "--one", str(root)],
                                     capture_output=True, text=True, check=True).stdout
                points[how].append(json.loads(out))
            else:
                points[how].append(meters[how].replicate(how))
        print(f"n={n} round {r + 1}/{rounds}: " + ", ".join(
            f"{how} {points[how][-1]['speedup']:.3f}" for how in conditions), file=sys.stderr,
            flush=True)
    last = [how for how in conditions if how != "process"][-1]
    bursts = [meters[last].replicate(last) for _ in range(burst)]
    return {"n": n, "rule": meters[last].rule.__dict__, "burst_condition": last,
            "spread": {how: _spread(p) for how, p in points.items()},
            "burst": _spread(bursts), "points": points, "burst_points": bursts}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[224, 256])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--burst", type=int, default=6)
    p.add_argument("--hogs", type=int, default=2)
    p.add_argument("--conditions", nargs="+", choices=CONDITIONS, default=list(CONDITIONS[:4]))
    p.add_argument("--out", type=Path)
    p.add_argument("--one", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        _one(args.one)
        return
    from reproduce import _device_line

    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.hogs)]
    try:
        with tempfile.TemporaryDirectory(prefix="kpair-factors-") as tmp:
            runs = [experiment(n, args.rounds, args.burst, Path(tmp) / str(n), args.conditions)
                    for n in args.sizes]
    finally:
        for h in hogs:
            h.kill()
    doc = {"device": _device_line(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "hogs": args.hogs, "rounds": args.rounds, "sizes": runs}
    text = json.dumps(doc, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(json.dumps({"sizes": [{"n": r["n"], "spread": r["spread"], "burst": r["burst"]}
                                for r in runs]}, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
