"""Where the checks' time goes when every run is a fresh process, as an isolated worker is.

Session 14's in-process profile (logs/session12/profile_split.py, runs repeated in one process)
put the checks' cost on axpbyz at 0.27 s; trust_overhead.py, one isolated worker per run, at
0.40-0.49 s, with trust:mutate and trust:poison 2-5x their in-process cost. This runs each
checked and each plain run in its own fresh Python process (first imports, first allocations,
first loads included) and prints, checked minus plain (medians of --pairs alternating pairs):
per stage, per driver function (wall, calls) and per Python function (tottime).

    python profile_fresh.py [CASE] [--pairs 3]          # from the tree's root, on the GPU
"""
import argparse
import collections
import cProfile
import json
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one(harness: str, checks: bool, seed: int) -> None:
    from kpair.backends import _cuda_driver as cd
    from kpair.pipeline import Facts, RunOptions, execute

    acc = collections.defaultdict(lambda: [0, 0.0])
    orig_call, orig_quiet = cd.Driver.__call__, cd.Driver.quiet

    def call(self, name, *a, **k):
        t = time.perf_counter()
        try:
            return orig_call(self, name, *a, **k)
        finally:
            e = acc[name]
            e[0] += 1
            e[1] += time.perf_counter() - t

    def quiet(self, name, *a):
        t = time.perf_counter()
        try:
            return orig_quiet(self, name, *a)
        finally:
            e = acc["q:" + name]
            e[0] += 1
            e[1] += time.perf_counter() - t

    cd.Driver.__call__, cd.Driver.quiet = call, quiet
    pr = cProfile.Profile()
    o = RunOptions(min_blocks=32, max_blocks=32, seed=seed, checks=checks)
    t = time.perf_counter()
    pr.enable()
    r, _ = execute(Path(harness), o, facts=Facts(harness=harness, started="x"))
    pr.disable()
    wall = time.perf_counter() - t
    py = collections.defaultdict(float)
    for (f, line, fn), (_, _, tt, _, _) in pstats.Stats(pr).stats.items():
        py[f"{Path(f).name}:{line}({fn})"] += tt
    top = dict(sorted(py.items(), key=lambda kv: -kv[1])[:60])
    print(json.dumps({"wall": wall, "status": r.status, "stage_s": dict(r.stage_s),
                      "driver": {k: list(v) for k, v in acc.items()}, "py": top}))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("case", nargs="?", default="axpbyz_3x16M")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--one", nargs=3, metavar=("HARNESS", "CHECKS", "SEED"))
    args = p.parse_args()
    if args.one:
        one(args.one[0], args.one[1] == "1", int(args.one[2]))
        return
    sys.path.insert(0, "benchmarks")
    from trust_overhead import cuda_cases

    h = str(dict(cuda_cases(Path(tempfile.mkdtemp())))[args.case])
    rows = {True: [], False: []}
    for rep in range(args.pairs + 1):          # the first pair warms the disk and the driver
        for checks in (True, False):
            out = subprocess.run([sys.executable, __file__, "--one", h, str(int(checks)),
                                  str(rep + 1)], capture_output=True, text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            print(args.case, "checks" if checks else "plain", round(row["wall"], 3),
                  row["status"], flush=True)
            if rep:
                rows[checks].append(row)

    def med(xs):
        return statistics.median(xs) if xs else 0.0

    def table(key, value=lambda v: v):
        names = set().union(*(r[key] for r in rows[True] + rows[False]))
        out = []
        for n in names:
            c = med([value(r[key].get(n, 0)) for r in rows[True]])
            u = med([value(r[key].get(n, 0)) for r in rows[False]])
            out.append((round(c - u, 4), round(c, 4), round(u, 4), n))
        return sorted(out, reverse=True)

    print("wall checked", med([r["wall"] for r in rows[True]]),
          "plain", med([r["wall"] for r in rows[False]]))
    print("== stages (diff, checked, plain)")
    for row in table("stage_s"):
        print(row)
    print("== driver wall (diff, checked, plain)")
    for row in table("driver", lambda v: v[1] if v else 0)[:25]:
        print(row)
    print("== driver calls (diff, checked, plain)")
    for row in table("driver", lambda v: v[0] if v else 0)[:15]:
        print(row)
    print("== python tottime (diff, checked, plain)")
    for row in table("py")[:40]:
        print(row)


if __name__ == "__main__":
    main()
