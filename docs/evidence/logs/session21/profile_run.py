"""cProfile of one checked run of a harness, in this process (what a verify's worker does)."""
import cProfile, pstats, sys, time
from pathlib import Path
from kpair.pipeline import Facts, RunOptions, execute
h = Path(sys.argv[1]); facts = Facts(harness=str(h), started="")
pr = cProfile.Profile(); t0 = time.time(); pr.enable()
res, _ = execute(h, RunOptions(seed=1), facts=facts)
pr.disable()
print("wall", round(time.time() - t0, 2), res.status, {k: round(v, 3) for k, v in facts.stage_s.items()})
st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(35); st.sort_stats("cumulative").print_stats(45)
