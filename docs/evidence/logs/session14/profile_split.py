"""Where the checks' time goes on axpbyz_3x16M, in-process: per stage (stage_s), per driver
function (wall, calls) and per Python function (tottime), checked minus unchecked, medians of 3
alternating pairs after one warm-up pair. Prints JSON-ish text."""
import cProfile, pstats, sys, tempfile, time, statistics, collections, json
from pathlib import Path
sys.path.insert(0, "benchmarks")
from trust_overhead import cuda_cases
from kpair.pipeline import RunOptions, Facts, execute
from kpair.backends import _cuda_driver as cd

acc = collections.defaultdict(lambda: [0, 0.0])
orig_call, orig_quiet = cd.Driver.__call__, cd.Driver.quiet
def call(self, name, *a, **k):
    t = time.perf_counter()
    try:
        return orig_call(self, name, *a, **k)
    finally:
        e = acc[name]; e[0] += 1; e[1] += time.perf_counter() - t
def quiet(self, name, *a):
    t = time.perf_counter()
    try:
        return orig_quiet(self, name, *a)
    finally:
        e = acc["q:" + name]; e[0] += 1; e[1] += time.perf_counter() - t
cd.Driver.__call__, cd.Driver.quiet = call, quiet

tmp = Path(tempfile.mkdtemp())
case = sys.argv[1] if len(sys.argv) > 1 else "axpbyz_3x16M"
h = dict(cuda_cases(tmp))[case]
rows = {True: [], False: []}
for rep in range(4):
    for checks in (True, False):
        acc.clear()
        pr = cProfile.Profile()
        o = RunOptions(min_blocks=32, max_blocks=32, seed=1 + rep, checks=checks)
        t = time.perf_counter(); pr.enable()
        r, _ = execute(h, o, facts=Facts(harness=str(h), started="x"))
        pr.disable(); wall = time.perf_counter() - t
        st = pstats.Stats(pr).stats
        py = collections.defaultdict(float)
        for (f, line, fn), (cc, nc, tt, ct, callers) in st.items():
            py[f"{Path(f).name}:{line}({fn})"] += tt
        if rep:
            rows[checks].append((wall, dict(r.stage_s), {k: tuple(v) for k, v in acc.items()}, dict(py)))
        print(case, "checks" if checks else "plain", round(wall, 3), r.summary()[:60] if checks else "", flush=True)

def med(xs): return statistics.median(xs) if xs else 0.0
def table(idx, key=lambda v: v):
    names = set().union(*(r[idx] for r in rows[True] + rows[False]))
    out = []
    for n in names:
        c = med([key(r[idx].get(n, 0)) for r in rows[True]])
        u = med([key(r[idx].get(n, 0)) for r in rows[False]])
        out.append((round(c - u, 4), round(c, 4), round(u, 4), n))
    return sorted(out, reverse=True)
print("wall checked", med([r[0] for r in rows[True]]), "plain", med([r[0] for r in rows[False]]))
print("== stages (diff, checked, plain)")
for row in table(1): print(row)
print("== driver wall (diff, checked, plain)")
for row in table(2, key=lambda v: v[1] if v else 0)[:25]: print(row)
print("== driver calls")
for row in table(2, key=lambda v: v[0] if v else 0)[:15]: print(row)
print("== python tottime (diff, checked, plain)")
for row in table(3)[:45]: print(row)
