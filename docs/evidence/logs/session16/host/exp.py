import sys, time, subprocess, json, tempfile
from pathlib import Path
import numpy as np
sys.path.insert(0, "/work/main/benchmarks")
from _bench import hogs
from kpair.harness import create_harness
from kpair.record import record_call
from kpair.toolchain import compile_shared
ROOT = Path("/work/main")
tmp = Path("/tmp/hx/h"); tmp.mkdir(exist_ok=True)
libs = {name: compile_shared(ROOT/"tests/csrc/matmul.c", tmp/f"{name}.so", defines={"KP_VARIANT": v}) for name, v in (("naive",0),("fast",1))}
rng = np.random.default_rng(0)
hs = {}
for n in (96, 128, 224, 256):
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    snap = record_call(libs["naive"], "kp_matmul", [a, b, np.zeros((n, n), np.float32), np.int32(n)], tmp/f"s{n}", names=["a","b","c","n"]).root
    hs[n] = create_harness(snap, tmp/f"h{n}", opt=libs["fast"]).root
out = Path("/tmp/hx/out"); out.mkdir(exist_ok=True)
T = float(sys.argv[1]) if len(sys.argv) > 1 else 300
t0 = time.time(); i = 0
with hogs(2):
    while time.time() - t0 < T:
        for n, h in hs.items():
            r = subprocess.run([sys.executable, "-m", "kpair", "run", str(h), "-o", str(out/f"{n}_{i}.json"), "--no-control", "--no-checks", "-q"], capture_output=True, text=True)
            print(f"{time.time()-t0:6.1f} n={n} i={i} rc={r.returncode}", flush=True)
        i += 1
