import sys, math, numpy as np
sys.argv = ["ana.py", "out"]
exec(open("ana.py").read().split("for key in")[0])
for floor in (0, 0.01, 0.015, 0.02, 0.025, 0.03):
    inside = tot = 0; hws = []
    for op, rr in runs.items():
        for a in rr:
            y = np.log(rr[a]["mean"]); R = y.size; s = max(y.std(ddof=1), floor)
            h = t975(R - 1) * math.sqrt(2 * s * s / R); hws.append(math.expm1(h))
            for b in rr:
                if b != a:
                    tot += 1; inside += abs(np.log(rr[b]["mean"]).mean() - y.mean()) <= h
    print(f"sd floor {floor}: coverage {inside}/{tot} = {inside/tot:.2f} median half-width {np.median(hws):.4f}")
