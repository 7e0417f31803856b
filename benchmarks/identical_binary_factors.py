"""Where does a timing offset between two loads of the same code come from? One factor at a
time, on one harness, in one process:

    python benchmarks/identical_binary_factors.py [HARNESS ...] [--blocks 400] [--repeat 4]
                                                  [--json out.json]

With no HARNESS it makes two from tests/cuda (axpy over 1M floats, ~8 us; a tiled 256^3
GEMM). Per harness it places the dispatch once (``kpair.pipeline.prepare``, checks off, so
nothing but restore, flush and the launch runs between timings) and loads ref's code object
three times (modules M1 = ref, M2, M3). Then it measures, each ``--repeat`` times in a
shuffled order, with exactly ``--blocks`` randomized ABBA blocks:

  aa_same_handle     M1 against M1 (the A/A control)
  m1_vs_m2           M1 against M2 (the identical-binary control)
  m2_vs_m1           the same two modules, slots swapped: an offset that belongs to a module
                     flips (x -> 1/x), one that belongs to the slot order stays
  m1_vs_m3           M1 against a module loaded later
  m1_vs_m2_warm      M1 against M2 with no cache flush between launches

For each it prints every repeat's speedup and CI, the repeats' spread (their standard
deviation) and the median CI half-width: a spread well above the half-width is run-to-run
variation that one bootstrap CI does not contain. JSON on stdout (and --json).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
from _bench import cuda_test_kernels, emit, record_axpy, record_gemm

FACTORS = ("aa_same_handle", "m1_vs_m2", "m2_vs_m1", "m1_vs_m3", "m1_vs_m2_warm")


def made_harnesses(tmp: Path) -> list[Path]:
    from kpair.harness import create_harness

    _, axpy, gemm = cuda_test_kernels(tmp)
    rng = np.random.default_rng(0)
    n = 1 << 20
    snap = record_axpy(axpy, tmp / "axpy", n, rng)
    out = [create_harness(snap.root, tmp / "axpy_1M", opt=axpy).root]
    m = 256
    snap = record_gemm(gemm, tmp / "gemm", m, rng)
    out.append(create_harness(snap.root, tmp / "gemm_tiled_256", opt=gemm).root)
    return out


def one_harness(root: Path, blocks: int, repeat: int, seed: int) -> dict:
    from kpair.measure import StoppingRule, measure
    from kpair.pipeline import Facts, RunOptions, close, prepare

    run, failed = prepare(root, RunOptions(checks=False, control=False),
                          facts=Facts(harness=str(root), started=""))
    try:
        if failed is not None:
            return {"harness": root.name, "error": failed.reason}
        h, replay = run.harness, run.replay
        ref, launch = run.ref
        image = h.binary(h.ref)
        m2 = run.device.load(image, h.ref.kernel, fmt=h.ref.format)
        m3 = run.device.load(image, h.ref.kernel, fmt=h.ref.format)
        pairs = {"aa_same_handle": (ref, ref), "m1_vs_m2": (ref, m2), "m2_vs_m1": (m2, ref),
                 "m1_vs_m3": (ref, m3), "m1_vs_m2_warm": (ref, m2)}
        rule = StoppingRule(min_blocks=blocks, max_blocks=blocks, rel_ci_halfwidth=1e-9,
                            time_cap_s=1e9)
        rng = np.random.default_rng(seed)
        order = [f for _ in range(repeat) for f in FACTORS]
        rng.shuffle(order)
        got: dict[str, list] = {f: [] for f in FACTORS}
        for i, factor in enumerate(order):
            a, b = pairs[factor]
            replay.cache = "warm" if factor.endswith("_warm") else "cold"
            r, _ = measure(lambda w, a=a, b=b: replay.time_one(a if w == "ref" else b, launch),
                           rule=rule, seed=seed + i)
            got[factor].append({"speedup": r.speedup, "ci95": list(r.ci95),
                                "slot_bias": r.slot_bias, "ref_median_us":
                                r.ref_median_s * 1e6})
        replay.cache = "cold"
        out = {"harness": root.name, "kernel": h.ref.kernel, "blocks": blocks,
               "repeat": repeat, "factors": {}}
        for f, rows in got.items():
            s = [x["speedup"] for x in rows]
            half = [(x["ci95"][1] - x["ci95"][0]) / 2 for x in rows]
            out["factors"][f] = {
                "speedups": [round(v, 5) for v in s],
                "mean": round(statistics.fmean(s), 5),
                "spread_sd": round(statistics.stdev(s), 5) if len(s) > 1 else None,
                "median_ci_halfwidth": round(statistics.median(half), 5),
                "cis_holding_1": sum(x["ci95"][0] <= 1.0 <= x["ci95"][1] for x in rows),
                "ref_median_us": round(statistics.median(x["ref_median_us"] for x in rows), 3)}
        return out
    finally:
        close(run)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("harness", type=Path, nargs="*")
    p.add_argument("--blocks", type=int, default=400)
    p.add_argument("--repeat", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    if args.harness:
        rows = [one_harness(r, args.blocks, args.repeat, args.seed) for r in args.harness]
    else:
        with tempfile.TemporaryDirectory(prefix="kpair-ibf-") as tmp:
            rows = [one_harness(r, args.blocks, args.repeat, args.seed)
                    for r in made_harnesses(Path(tmp))]
    emit({"benchmark": "identical_binary_factors", "rows": rows}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
