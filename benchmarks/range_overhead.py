"""What judging a range costs over judging one dispatch, on the host backend, as JSON.

One kernel (``kp_matmul`` of tests/csrc/range_ops.c, n x n) is recorded twice: as a single
dispatch (``record_call``) and as a one-operation range (``record_range``). The first is paired
with a same-layout opt (the same code object), the second with a one-launch plan of the same
function; both harnesses are then run with ``kpair run`` under the same fixed block budget
(``--min-blocks = --max-blocks``, so both time the same number of ABBA blocks), alternately,
``--rounds`` times each. The ratio is the median wall time of the range harness's run over
the single dispatch harness's (goal: <= 1.2).

    python benchmarks/range_overhead.py [--n 64] [--blocks 64] [--rounds 5] [--out FILE]

Needs a C compiler (builds in a temporary directory).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _bench import emit

from kpair import __version__
from kpair.harness import create_harness
from kpair.record import record_call, record_range
from kpair.toolchain import compile_shared

CSRC = Path(__file__).resolve().parents[1] / "tests" / "csrc"


def _inputs(n: int):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((n, n), dtype=np.float32),
            rng.standard_normal((n, n), dtype=np.float32), np.zeros((n, n), np.float32))


def _run(harness: Path, blocks: int) -> float:
    cmd = [sys.executable, "-m", "kpair", "run", str(harness), "--min-blocks", str(blocks),
           "--max-blocks", str(blocks), "--seed", "1"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n"
                         f"{proc.stderr}")
    return wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    n = args.n
    with tempfile.TemporaryDirectory(prefix="kpair-range-overhead-") as tmp:
        d = Path(tmp)
        lib = compile_shared(CSRC / "range_ops.c", d / "ops.so", flags=("-O2", "-g"))
        a, b, c = _inputs(n)
        record_call(lib, "kp_matmul", [a, b, c, np.int32(n)], d / "single",
                    names=["a", "b", "c", "n"])
        a, b, c = _inputs(n)
        record_range([(lib, "kp_matmul", [a, b, c, np.int32(n)])], d / "range",
                     names={"a": a, "b": b, "c": c}, outputs=[c])
        plan_dir = d / "plan"
        plan_dir.mkdir()
        (plan_dir / "ops.so").write_bytes(lib.read_bytes())
        (plan_dir / "opt.plan.json").write_text(json.dumps({
            "schema": "kpair.plan", "schema_version": 1, "launches": [{
                "code": "ops.so", "kernel": "kp_matmul", "args": [
                    {"bind": "region", "name": "a"}, {"bind": "region", "name": "b"},
                    {"bind": "region", "name": "c", "access": "write"},
                    {"bind": "scalar", "kind": "i32", "value": n}]}]}))
        single = create_harness(d / "single", d / "H-single", opt=lib).root
        ranged = create_harness(d / "range", d / "H-range", plan=plan_dir / "opt.plan.json").root
        walls: dict[str, list[float]] = {"single": [], "range": []}
        _run(single, args.blocks)   # warm-up: imports, page cache
        for _ in range(args.rounds):
            walls["single"].append(_run(single, args.blocks))
            walls["range"].append(_run(ranged, args.blocks))
    med = {k: statistics.median(v) for k, v in walls.items()}
    emit({"benchmark": "range_overhead", "kpair": __version__, "backend": "host", "n": n,
          "blocks": args.blocks, "rounds": args.rounds,
          "what": "wall time of `kpair run` (checked, fixed ABBA blocks) on a one-operation "
                  "range harness with a one-launch plan, over a single-dispatch harness of "
                  "the same kernel with a same-layout opt",
          "single_s": [round(w, 3) for w in walls["single"]],
          "range_s": [round(w, 3) for w in walls["range"]],
          "single_median_s": round(med["single"], 3), "range_median_s": round(med["range"], 3),
          "ratio": round(med["range"] / med["single"], 4), "goal": 1.2}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
