"""Seconds per pipeline stage of one ``kpair demo`` operator's checked run, in this process.

The demo gives each operator's checked run ``60 + 4 x 2.5`` = 70 s (``--timeout``) for the
whole worker, setup included; the CUDA softmax (8192x1024 float32, cosine >= 0.9999) ran
out of it in trust:ref. This builds that operator as the demo does (nvcc for cuda, the C
compiler for host), records ref's call, makes the harness and runs ``prepare`` and
``evaluate`` in-process, with no --timeout, timing every stage; a traceback of every thread
is written every ``--dump-s`` seconds (faulthandler) so a stall shows where it is.

    python benchmarks/demo_stage_times.py --backend cuda --op 23_Softmax --out "$OUT"

writes ``stages.json`` (status, seconds per stage, the total) and ``tracebacks.txt``.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="cuda", choices=["cuda", "host"])
    ap.add_argument("--op", default="23_Softmax")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dump-s", type=float, default=20.0)
    a = ap.parse_args(argv)

    import kpair.demo as demo
    from kpair.harness import create_harness
    from kpair.pipeline import Facts, RunOptions, close, evaluate, own_candidate, prepare
    from kpair.policy import Policy
    from kpair.record import record_call

    a.out.mkdir(parents=True, exist_ok=True)
    trace = (a.out / "tracebacks.txt").open("w")
    faulthandler.dump_traceback_later(a.dump_s, repeat=True, file=trace)
    op = next(o for o in demo.OPERATORS if o.name == a.op)
    suffix, build = demo._toolchain(a.backend)
    times: dict[str, float] = {}
    current = [None, time.monotonic()]

    def stage(name: str) -> None:
        now = time.monotonic()
        if current[0] is not None:
            times[current[0]] = round(times.get(current[0], 0.0) + now - current[1], 3)
        current[:] = [name, now]
        print(f"stage {name} at {now - started:.1f} s", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="kpair-stages-") as tmp:
        work = Path(tmp)
        source = resources.files(demo.__name__) / "csrc" / (op.source + suffix)
        with resources.as_file(source) as src:
            builds = {role: build(src, work / role, {**op.defines, "KP_OPT": v})
                      for role, v in (("ref", 0), ("opt", 1))}
        rng = np.random.default_rng(20261202)
        make = op.gpu_args if a.backend != "host" and op.gpu_args else op.make_args
        args, names = make(rng)
        launch = op.launch(args) if a.backend != "host" else None
        opt_launch = op.opt_launch(args) if a.backend != "host" else {}
        kw = {"launch": launch} if launch is not None else {}
        record_call(builds["ref"], op.symbol, args, work / "capture", names=names,
                    backend=a.backend, **kw)
        h = create_harness(work / "capture", work / "harness", ref=builds["ref"],
                           opt=builds["opt"], opt_launch=opt_launch or None,
                           policy=Policy(op.tolerances(args), op.policy_note,
                                         max_bias=op.max_bias),
                           measure={"time_cap_s": demo.TIME_CAP_S,
                                    "min_blocks": demo.MIN_BLOCKS})
        options = RunOptions(time_cap_s=demo.TIME_CAP_S, min_blocks=demo.MIN_BLOCKS)
        started = time.monotonic()
        run, failed = prepare(h.root, options, facts=Facts(harness=str(h.root), started="now"),
                              stage=stage)
        try:
            result = failed
            if failed is None:
                result, _ = evaluate(run, own_candidate(run.harness), stage)
            stage("end")
        finally:
            close(run)
    faulthandler.cancel_dump_traceback_later()
    out = {"operator": op.name, "backend": a.backend, "status": result.status,
           "reason": result.to_json().get("correctness", {}).get("summary"),
           "stage_s": times, "total_s": round(time.monotonic() - started, 3),
           "demo_timeout_s": 60 + 4 * demo.TIME_CAP_S}
    (a.out / "stages.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
