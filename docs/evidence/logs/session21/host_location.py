"""Session 21: per-placement ABBA geometric mean against lower-quartile ratio of a host
kp_matmul pair (naive ref, loop-reordered opt), one harness, several fresh placements (new
executors and pages, as a replicate gets), each 30 blocks; run idle and beside two busy loops.

    python docs/evidence/logs/session21/host_location.py HARNESS PLACEMENTS BLOCKS
"""
import sys
from pathlib import Path

import numpy as np

from kpair.pipeline import Candidate, Facts, RunOptions, _load_opt, _reload, close, prepare

h, places, blocks = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
run, _ = prepare(h, RunOptions(checks=False, control=False, seed=1),
                 facts=Facts(harness=str(h), started=""))
hh = run.harness
run.begin(Candidate(hh.binary(hh.opt), hh.opt.kernel, hh.opt.format, hh.opt.launch_override))
_load_opt(run)
for p in range(places):
    if p:
        _reload(run)
        run.device.renew_memory()
    t = np.array([(run.time_one("ref"), run.time_one("opt")) for _ in range(blocks)])
    gm = float(np.exp(np.mean(np.log(t[:, 0] / t[:, 1]))))
    q1 = float(np.quantile(t[:, 0], 0.25) / np.quantile(t[:, 1], 0.25))
    print(f"placement {p}: geomean {gm:.3f}  lower-quartile ratio {q1:.3f}", flush=True)
close(run)
