import subprocess, sys, time, json
from pathlib import Path
sys.path.insert(0, "/work/main/benchmarks")
from _bench import hogs
rel = Path(sys.argv[1]); out = Path(sys.argv[2]); rounds = int(sys.argv[3]); n_hogs = int(sys.argv[4])
out.mkdir(parents=True, exist_ok=True)
ops = sorted(p.parent for p in rel.glob("level1/*/harness/harness.json"))
with hogs(n_hogs):
    for i in range(rounds):
        for h in ops:
            name = h.parent.name
            t0 = time.time()
            subprocess.run(["/work/main/.venv/bin/kpair", "run", str(h), "-o", str(out / f"{name}_{i}.json"), "--force", "-q", "--no-control"], check=False, stdout=subprocess.DEVNULL)
            print(i, name, round(time.time() - t0, 1), flush=True)
