import numpy as np, glob, re, json, sys
from collections import defaultdict
runs = defaultdict(dict)
for f in glob.glob(sys.argv[1] + "/*.samples.npz"):
    m = re.search(r"(\d+)_(\d+)\.samples", f); n, i = int(m[1]), int(m[2])
    runs[n][i] = np.load(f, allow_pickle=False)
def est(z, kind, q=0.1):
    d = z["direction"]; s1 = z["t_slot1_s"]; s2 = z["t_slot2_s"]
    F = d == b"F"; R = ~F
    if kind == "abba":
        fwd = np.mean(np.log(s1[F]/s2[F])); rev = np.mean(np.log(s1[R]/s2[R])); return (fwd-rev)/2
    ref = np.concatenate([s1[F], s2[R]]); opt = np.concatenate([s2[F], s1[R]])
    if kind == "q": return np.log(np.quantile(ref, q)/np.quantile(opt, q))
    if kind == "min": return np.log(ref.min()/opt.min())
    if kind == "med": return np.log(np.median(ref)/np.median(opt))
for n in sorted(runs):
    print("n", n, "runs", len(runs[n]))
    for kind in ("abba", "med", "q", "min"):
        pts = []; within = []
        for i in sorted(runs[n]):
            z = runs[n][i]; rep = z["replicate"]
            ys = [est({k: z[k][rep == r] for k in ("direction","t_slot1_s","t_slot2_s")}, kind) for r in np.unique(rep)]
            pts.append(np.mean(ys)); within.append(np.std(ys, ddof=1))
        pts = np.array(pts)
        print(f"  {kind:5s} mean {np.exp(pts.mean()):.3f} sd_between {pts.std(ddof=1):.4f} sd_within_rep {np.median(within):.4f} pred_between {np.median(within)*np.sqrt(1/6):.4f}  pts " + " ".join(f"{np.exp(p):.3f}" for p in pts))
