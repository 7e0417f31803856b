import cProfile, pstats, sys, time, tempfile
from pathlib import Path
import numpy as np
from kpair.toolchain import compile_shared
from kpair.record import record_call
from kpair.harness import create_harness
from kpair.pipeline import execute, RunOptions, Facts
tmp = Path('/tmp/prof/w'); 
n = int(sys.argv[1]) if len(sys.argv) > 1 else (16 << 20)
if not (tmp / 'h').exists():
    tmp.mkdir(exist_ok=True)
    so = compile_shared(Path('/tmp/prof/k.c'), tmp / 'k.so')
    rng = np.random.default_rng(0)
    x, y, w = (rng.standard_normal(n, np.float32) for _ in range(3))
    z = np.zeros(n, np.float32); v = np.zeros(n, np.float32)
    snap = record_call(so, 'kp_axpbyz', [x, y, w, z, v, np.int32(n)], tmp / 'snap', names=['x','y','w','z','v','n'])
    create_harness(snap.root, tmp / 'h', opt=so)
facts = Facts(harness=str(tmp/'h'), started='x')
opts = RunOptions(min_blocks=16, max_blocks=16, rel_ci=1e-9, time_cap_s=600, seed=1, timeout_s=600)
pr = cProfile.Profile(); t0=time.time(); pr.enable()
res, _ = execute(tmp / 'h', opts, facts=facts)
pr.disable(); print('wall', time.time()-t0, res.status if hasattr(res,'status') else '')
print({k: round(v,3) for k,v in facts.stage_s.items()})
pstats.Stats(pr).sort_stats('cumulative').print_stats(45)
