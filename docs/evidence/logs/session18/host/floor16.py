import json, math, numpy as np
from kpair.measure import t975
d = json.load(open("/work/main/docs/evidence/logs/session16/host/series.json"))["series"]
for cond, rows in d.items():
    by = {}
    for r in rows: by.setdefault(r["n"], []).append(np.log(r["replicates"]))
    for floor in (0, 0.01, 0.015, 0.02, 0.025, 0.03):
        inside = tot = 0; hws = []
        for n, ys in by.items():
            for a, y in enumerate(ys):
                R = y.size; s = max(y.std(ddof=1), floor); h = t975(R-1) * math.sqrt(2*s*s/R); hws.append(math.expm1(h))
                for b, z in enumerate(ys):
                    if b != a: tot += 1; inside += abs(z.mean() - y.mean()) <= h
        print(f"{cond} ({len(rows)} runs) floor {floor}: {inside}/{tot} = {inside/tot:.3f}, median half-width {np.median(hws):.4f}")
