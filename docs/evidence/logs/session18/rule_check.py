"""Session 18: the H100 publication's re-runs judged by the published (run-level) rule and by
the same interval without the run-level term u, from the published result.json files.

    python docs/evidence/logs/session18/rule_check.py REPRODUCE.json META_DIR
(META_DIR: the release's json files, rel_meta_now.tar.gz of the device run, unpacked.)"""
import glob
import json
import math
import sys

import numpy as np

from kpair.measure import t975

rep = json.load(open(sys.argv[1]))
pts = {o["name"]: o for o in rep["per_operator"]}
tally = {"published (quadrature, with u)": 0, "quadrature without u": 0,
         "linear without u (before session 17)": 0}
n, halves = 0, {k: [] for k in tally}
for f in sorted(glob.glob(f"{sys.argv[2]}/level2/*/harness/result.json")):
    name = f.split("/")[-3]
    if name not in pts:
        continue
    s = json.load(open(f))["speed"]
    r, sd, u = len(s["replicates"]), s["replicate_sd_log"], s.get("run_sd_log", 0.0)
    b = math.log(s["systematic"]["bound"])
    t, m = t975(r - 1), math.log(s["speedup"])
    w_u, w = t * math.sqrt(2 * (sd ** 2 / r + u ** 2)), t * math.sqrt(2 * sd ** 2 / r)
    d = np.abs(np.log(pts[name]["reruns"]) - m)
    got = [int(np.sum(d <= math.hypot(w_u, b))), int(np.sum(d <= math.hypot(w, b))),
           int(np.sum(d <= w + b))]
    for k, g, h in zip(tally, got, (math.hypot(w_u, b), math.hypot(w, b), w + b)):
        tally[k] += g
        halves[k].append(math.expm1(h))
    n += d.size
    print(f"{name[:40]:40} R={r} ref {s['debug_only']['ref_median_us']:6.1f} us  sd {sd:.4f}  "
          f"u {u:.4f}  b {b:.4f}  inside {got}")
for k, v in tally.items():
    print(f"{k}: {v}/{n} inside, median half-width {np.median(halves[k]):.4f}")
