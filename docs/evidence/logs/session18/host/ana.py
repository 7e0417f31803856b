import json, sys, glob, re, math, numpy as np
from pathlib import Path
from kpair.measure import load_samples, analyze, t975
out = Path(sys.argv[1])
def qest(p, q):
    t1, t2, f = p.t_slot1_s, p.t_slot2_s, p.forward
    fwd = np.percentile(t1[f], q) / np.percentile(t2[f], q)
    rev = np.percentile(t1[~f], q) / np.percentile(t2[~f], q)
    return math.sqrt(fwd / rev)
runs = {}
for f in sorted(out.glob("*_*.samples.npz")):
    m = re.match(r"(.+)_(\d+)\.samples\.npz", f.name)
    s = load_samples(f)
    parts = [s.part(i) for i in range(s.replicates)]
    est = {"mean": [analyze(p, n_boot=200).speedup for p in parts]}
    for q in (5, 10, 25, 50):
        est[f"q{q}"] = [qest(p, q) for p in parts]
    runs.setdefault(m[1], {})[int(m[2])] = est
for key in ("mean", "q5", "q10", "q25", "q50"):
    inside = tot = 0; hws = []
    for op, rr in runs.items():
        idx = sorted(rr)
        for a in idx:
            y = np.log(rr[a][key]); R = y.size; mu = y.mean(); s = y.std(ddof=1)
            h = t975(R - 1) * math.sqrt(2 * s * s / R); hws.append(math.expm1(h))
            for b in idx:
                if b != a:
                    tot += 1; inside += abs(np.log(rr[b][key]).mean() - mu) <= h
    print(f"{key}: coverage {inside}/{tot} = {inside/tot:.2f}  median half-width {np.median(hws):.4f}")
for op, rr in runs.items():
    print(op, {k: [round(float(np.exp(np.log(rr[i][k]).mean())), 3) for i in sorted(rr)] for k in ("mean", "q10")})
print("between-run var of run means / mean(s^2/R):")
for op, rr in runs.items():
    ys = [np.log(rr[i]["mean"]) for i in sorted(rr)]
    means = np.array([y.mean() for y in ys]); w = np.mean([y.var(ddof=1) / y.size for y in ys])
    print(op, round(float(means.var(ddof=1) / w), 2), "within-run sd", [round(float(y.std(ddof=1)), 4) for y in ys])
