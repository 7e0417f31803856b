import json, math, sys, numpy as np
from kpair.measure import t975
def series16(cond):
    d = json.load(open("/work/main/docs/evidence/logs/session16/host/series.json"))["series"][cond]
    by = {}
    for r in d: by.setdefault(r["n"], []).append(np.log(r["replicates"]))
    return by
def today():
    exec(open("ana.py").read().split("for key in")[0], g := {"__name__": "x", "sys": sys})
    return {op: [np.log(rr[i]["mean"]) for i in sorted(rr)] for op, rr in g["runs"].items()}
sys.argv = ["ana.py", sys.argv[1] if len(sys.argv) > 1 else "out"]
sets = {"s16 hogs2": series16("hogs2"), "s16 idle": series16("idle"), "s18 hogs2": today()}
for name, by in sets.items():
    # excess between-run variance over within-run prediction, pooled
    ex = []
    for n, ys in by.items():
        means = np.array([y.mean() for y in ys]); w = np.mean([y.var(ddof=1) / y.size for y in ys])
        ex.append(means.var(ddof=1) - w)
    print(name, "excess between-run sd (log):", [round(math.sqrt(max(e, 0)), 4) for e in ex])
    for u in (0, 0.01, 0.015, 0.02, 0.03, 0.04):
        inside = tot = 0; hws = []
        for n, ys in by.items():
            for a, y in enumerate(ys):
                R = y.size; s = y.std(ddof=1); h = t975(R-1) * math.sqrt(2*(s*s/R + u*u)); hws.append(math.expm1(h))
                for b, z in enumerate(ys):
                    if b != a: tot += 1; inside += abs(z.mean() - y.mean()) <= h
        print(f"   u {u}: {inside}/{tot} = {inside/tot:.3f}, median half-width {np.median(hws):.4f}")
