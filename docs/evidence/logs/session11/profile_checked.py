"""Profile one checked run of the axpbyz 3x16M case in-process (and time an unchecked one)."""
import cProfile, pstats, sys, tempfile, io, time
from pathlib import Path
sys.path.insert(0, "benchmarks")
from trust_overhead import cuda_cases
from kpair.pipeline import RunOptions, Facts, execute
tmp = Path(tempfile.mkdtemp())
cases = dict(cuda_cases(tmp))
h = cases["axpbyz_3x16M"]
for checks in (True, False, True, False):
    o = RunOptions(min_blocks=32, max_blocks=32, seed=1, checks=checks)
    t = time.perf_counter(); r, _ = execute(h, o, facts=Facts(harness=str(h), started="x"))
    print("checks" if checks else "no checks", round(time.perf_counter() - t, 3), {k: round(v, 4) for k, v in r.stage_s.items()})
opts = RunOptions(min_blocks=32, max_blocks=32, seed=1)
pr = cProfile.Profile()
pr.enable()
r, _ = execute(h, opts, facts=Facts(harness=str(h), started="x"))
pr.disable()
print(r.summary()); print(r.stage_s)
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(60); print(s.getvalue()[:12000])
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30); print(s.getvalue()[:7000])
