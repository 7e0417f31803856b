"""Profile one checked run of the axpbyz 3x16M case in-process (device-side driver only)."""
import cProfile, pstats, sys, tempfile, io
from pathlib import Path
sys.path.insert(0, "benchmarks")
from trust_overhead import cuda_cases
from kpair.pipeline import RunOptions, Facts, execute
tmp = Path(tempfile.mkdtemp())
cases = dict(cuda_cases(tmp))
h = cases["axpbyz_3x16M"]
opts = RunOptions(min_blocks=32, max_blocks=32, seed=1)
execute(h, opts, facts=Facts(harness=str(h), started="x"))  # warm
pr = cProfile.Profile()
pr.enable()
r, _ = execute(h, opts, facts=Facts(harness=str(h), started="x"))
pr.disable()
print(r.summary()); print(r.stage_s)
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(45); print(s.getvalue()[:9000])
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25); print(s.getvalue()[:6000])
