import numpy as np, glob, re, json

pts = {}
for f in glob.glob("/tmp/hx/out/*.json"):
    m = re.search(r"/(\d+)_(\d+)\.json$", f)
    if not m: continue
    s = json.load(open(f))["speed"]
    pts[(int(m[1]), int(m[2]))] = [np.log(r["speedup"]) for r in s["replicates"]]
ns = sorted({k[0] for k in pts}); I = max(k[1] for k in pts)+1
t = 2.5706
for per_round in (6, 3, 2, 1):   # replicates taken per round (6: today's single run)
    rounds = 6 // per_round
    inside = tot = 0; hw = []
    for n in ns:
        series = [pts[(n,i)] for i in range(I) if (n,i) in pts]
        def design(k):  # 6 replicates from `rounds` consecutive rounds from k
            return np.array([series[k+r][j] for r in range(rounds) for j in range(per_round)])
        starts = range(0, len(series) - rounds + 1, rounds)
        designs = [design(k) for k in starts]
        for a, pub in enumerate(designs):
            m, s = pub.mean(), pub.std(ddof=1); h = t * s * np.sqrt(2/6); hw.append(np.expm1(h))
            for b, rr in enumerate(designs):
                if b > a:
                    tot += 1; inside += abs(rr.mean() - m) <= h
    print(("one run (replicates ~3 s apart)" if rounds == 1 else f"{rounds} rounds, ~{rounds*20}s") + f" ({per_round}/round): coverage {inside}/{tot} = {inside/tot:.2f}, median half-width {np.median(hw):.3f}")
