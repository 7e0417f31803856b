"""delta, the run-level timing offset (kpair.measure.GPU_RUN_OFFSET_S), from the replicate
structure of sessions' GPU releases: per operator, the variance of its 7 run means (publication
+ 6 re-verifications) beyond what its replicates predict (mean within-run variance / R), and
g = 1/t_ref^2 + 1/t_opt^2; delta^2 = sum(excess) / sum(g). Run from the repository root."""
import json
import math

import numpy as np

PAIRS = {"h100_session14": "reproduce_h100_session14_r6", "h100_session16": "reproduce_h100_session16",
         "h100_session17": "reproduce_h100_session17", "h200_session10": "reproduce_h200_session10_r6",
         "h200_session11": "reproduce_h200_session11_r6"}
est = {}
for k, v in PAIRS.items():
    s = json.load(open(f"benchmarks/results/replicate_structure_{k}.json"))
    r = json.load(open(f"benchmarks/results/{v}.json"))
    ref_us = {o["name"]: o.get("ref_median_us") for o in r["per_operator"]}
    speedup = {o["name"]: o["speedup"] for o in r["per_operator"]}
    for op in s["per_operator"]:
        t = ref_us.get(op["name"])
        if not t:
            continue
        y = [np.array(x) for x in op["log_speedups"]]
        means = np.array([x.mean() for x in y])
        within = np.mean([x.var(ddof=1) for x in y]) / np.mean([len(x) for x in y])
        excess = means.var(ddof=1) - within
        t_opt = t / speedup[op["name"]]
        est.setdefault(k, []).append((excess, 1 / t ** 2 + 1 / t_opt ** 2))


def delta_ns(rows):
    return math.sqrt(max(sum(a for a, _ in rows) / sum(g for _, g in rows), 0)) * 1000


print("sessions 10, 11, 14, 16 (what GPU_RUN_OFFSET_S is set from): %.1f ns" %
      delta_ns([x for k, v in est.items() if k != "h100_session17" for x in v]))
print("all five: %.1f ns" % delta_ns([x for v in est.values() for x in v]))
for k, v in est.items():
    print(f"{k}: {delta_ns(v):.1f} ns over {len(v)} operators")
