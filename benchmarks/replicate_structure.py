"""How the replicates of published speedups vary within a run and between runs, as JSON.

Reads a release that `benchmarks/reproduce.py` published and re-verified (every operator's
`harness/result.json` and `verify/<n>/result.json`, each with its replicates) and reports per
operator: the log-speedups of every replicate of every run, the spread of the replicates
inside a run (`sd_replicates`), what that spread predicts for the spread of run means
(`sd_replicates / sqrt(R)`) against the spread actually seen between runs
(`sd_between_runs`), the publication's distance from the re-runs' mean, and the mean
deviation of each replicate *position* (0..R-1) over all runs. A position effect that repeats
from run to run is not noise a re-run re-rolls: replicate i meets the same conditions in
every run (the same order of loads and memory renewals), so the run means vary less than the
replicates predict. And the *alternation*: per run, the mean of the even replicates minus the
mean of the odd ones, against the spread within each parity (`alternation_over_within`; about
0.65 when replicates are independent). A placement that returns every other replicate (a
renewal handed back the pages the one before freed) shows as a ratio far above 1. And the
*stickiness*: the lag-1 correlation of consecutive replicates about their run's own mean,
pooled over runs (`lag1_correlation`; about -1/R when replicates are independent, toward -1
when they alternate, above 0 when a run's replicates stay on one level for several renewals in
a row, as the 4.5 µs llama.0004 did on an H100 in session 14 with a spacer of 1-3 granules).

    python benchmarks/replicate_structure.py RELEASE [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path


def _logs(result: Path) -> list[float] | None:
    speed = json.loads(result.read_text()).get("speed") or {}
    reps = speed.get("replicates") or []
    return [math.log(r["speedup"]) for r in reps] or None


def lag1_correlation(runs: list[list[float]]) -> float:
    """Pooled lag-1 correlation of each run's replicates about that run's mean."""
    num = den = 0.0
    for x in runs:
        m = statistics.fmean(x)
        d = [v - m for v in x]
        num += sum(a * b for a, b in zip(d[:-1], d[1:], strict=True))
        den += sum(v * v for v in d)
    return num / den if den > 0 else math.nan


def operator(root: Path) -> dict | None:
    runs = [_logs(root / "harness" / "result.json")]
    verify = sorted((root / "verify").glob("*/result.json"), key=lambda p: int(p.parent.name))
    runs += [_logs(p) for p in verify]
    runs = [r for r in runs if r]
    if len(runs) < 3 or len({len(r) for r in runs}) != 1:
        return None
    r = len(runs[0])
    means = [statistics.fmean(x) for x in runs]
    within = statistics.fmean(statistics.variance(x) for x in runs)
    grand = statistics.fmean(means)
    position = [statistics.fmean(x[i] for x in runs) - grand for i in range(r)]
    gaps = [abs(statistics.fmean(x[0::2]) - statistics.fmean(x[1::2])) for x in runs]
    parity_sd = math.sqrt(statistics.fmean(
        (statistics.variance(x[0::2]) + statistics.variance(x[1::2])) / 2 for x in runs)) \
        if r >= 4 else math.nan
    return {"name": root.name, "runs": len(runs), "replicates": r,
            "log_speedups": [[round(v, 6) for v in x] for x in runs],
            "sd_replicates": math.sqrt(within),
            "predicted_sd_of_run_means": math.sqrt(within / r),
            "sd_between_runs": statistics.stdev(means),
            "published_minus_reruns": means[0] - statistics.fmean(means[1:]),
            "position_effect": [round(v, 6) for v in position],
            "alternation": statistics.fmean(gaps),
            "alternation_over_within": statistics.fmean(gaps) / parity_sd
            if parity_sd > 0 else math.nan,
            "lag1_correlation": lag1_correlation(runs)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("release", type=Path)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    ops = [o for d in sorted(args.release.glob("level*/*")) if (o := operator(d))]
    if not ops:
        print(f"no operator of {args.release} has a publication and two re-runs with "
              "replicates", file=sys.stderr)
        return 2
    ratio = [o["sd_between_runs"] / o["predicted_sd_of_run_means"] for o in ops]
    out = {"benchmark": "replicate_structure", "release": str(args.release),
           "operators": len(ops),
           "median_between_over_predicted": statistics.median(ratio),
           "median_alternation_over_within": statistics.median(
               o["alternation_over_within"] for o in ops),
           "median_lag1_correlation": statistics.median(o["lag1_correlation"] for o in ops),
           "per_operator": ops}
    text = json.dumps(out, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
