import numpy as np, glob, re, json, sys
from collections import defaultdict
pts = {}
for f in glob.glob(sys.argv[1] + "/*.json"):
    m = re.search(r"/(\d+)_(\d+)\.json$", f)
    if not m: continue
    d = json.load(open(f)); s = d["speed"]
    reps = s.get("replicates") or []
    pts[(int(m[1]), int(m[2]))] = [np.log(r["speedup"]) for r in reps] if reps else None
ns = sorted({k[0] for k in pts}); I = max(k[1] for k in pts)
# residuals of run means per op
res = {}
for n in ns:
    ms = {i: np.mean(pts[(n,i)]) for i in range(I+1) if (n,i) in pts}
    mu = np.mean(list(ms.values())); sd = np.std(list(ms.values()))
    for i, v in ms.items(): res[(n,i)] = (v-mu)/sd
same, lag1 = [], []
for i in range(I+1):
    for a in ns:
        for b in ns:
            if a < b and (a,i) in res and (b,i) in res: same.append((res[(a,i)], res[(b,i)]))
            if (a,i) in res and (a,i+1) in res and a==b: lag1.append((res[(a,i)], res[(a,i+1)]))
for name, xs in (("different ops, same round (5-15 s apart)", same), ("same op, next round (~20 s)", lag1)):
    x = np.array(xs); print(name, len(x), np.corrcoef(x[:,0], x[:,1])[0,1].round(3))
# within-run: replicate lag1 correlation
c=[]
for k,v in pts.items():
    v=np.array(v); v=v-v.mean(); c.append(np.sum(v[:-1]*v[1:])/np.sum(v*v))
print("replicate lag1 within run (indep ~ -0.17):", np.median(c).round(3))
