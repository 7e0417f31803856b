"""Is there a run-level (worker process) component in a published speedup, as JSON?

On the H100 in session 14 (docs/evidence/h100-2026-12-05-session14.md), the re-run points of
kernels under 8 µs spread 2 to 7 times more than one run's six replicates predict for their
mean, while kernels from 12 µs up spread as predicted: something differs from one worker
process to the next that the replicates inside one process (fresh module loads, fresh pages)
do not re-roll. This measures it on the operators of a published release, in fresh
processes, two ways, interleaved:

* ``--runs`` runs of the publication's design (``kpair run --replicates R``): the spread of
  their points (between runs) against the replicates' own prediction (their sd / sqrt(R));
* ``--runs`` x ``R`` runs of one replicate each (``--replicates 1``): one replicate per
  process; their spread against the spread of replicates inside one run.

``ratio_between_over_predicted`` far above 1 with ``ratio_single_process_over_within`` far
above 1 says a fresh process is what moves the speed: replicates in fresh workers would see
it. Both near 1: the variation is elsewhere (time, neighbours).

    python benchmarks/run_level.py RELEASE [--max-ref-us 10] [--runs 4] [--replicates 6]
        [--hogs N] [--out FILE.json]

``--hogs N`` runs it all beside N busy-loop processes (``reproduce.py``'s, for the host).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _bench import device_line, emit, hogs


def _run(harness: Path, out: Path, replicates: int) -> dict | None:
    proc = subprocess.run([sys.executable, "-m", "kpair", "run", str(harness), "-o", str(out),
                           "--replicates", str(replicates), "--no-control", "-q"],
                          capture_output=True, text=True)
    if not out.is_file():
        print(f"  {harness.parent.name}: no result (exit {proc.returncode}): "
              f"{proc.stderr.strip()[-300:]}", file=sys.stderr)
        return None
    speed = json.loads(out.read_text()).get("speed") or {}
    if not speed.get("speedup"):
        return None
    reps = [math.log(r["speedup"]) for r in speed.get("replicates") or []]
    clocks = speed.get("clocks_mhz") or {}
    return {"point": math.log(speed["speedup"]), "replicates": reps, "at": time.time(),
            "clocks_mhz": [clocks.get("before"), clocks.get("after")]}


def _sd(values: list[float]) -> float | None:
    return statistics.stdev(values) if len(values) > 1 else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def operator(harness: Path, runs: int, replicates: int, work: Path) -> dict:
    full, single_runs = [], []
    for i in range(runs):   # interleaved, so that a drift in time meets both designs alike
        r = _run(harness, work / f"full{i}.json", replicates)
        if r:
            full.append(r)
        for j in range(replicates):
            r = _run(harness, work / f"single{i}_{j}.json", 1)
            if r:
                single_runs.append(r)
    within = [s for s in (_sd(r["replicates"]) for r in full) if s is not None]
    sd_within = math.sqrt(statistics.fmean(s * s for s in within)) if within else None
    between = _sd([r["point"] for r in full])
    predicted = sd_within / math.sqrt(replicates) if sd_within is not None else None
    single = [r["point"] for r in single_runs]
    sd_single = _sd(single)
    return {"runs": len(full), "single_runs": len(single),
            "sd_within_run": sd_within, "sd_between_runs": between,
            "predicted_between": predicted,
            "ratio_between_over_predicted": _ratio(between, predicted),
            "sd_single_process": sd_single,
            "ratio_single_process_over_within": _ratio(sd_single, sd_within),
            "points": [r["point"] for r in full], "single_points": single,
            # when each run ended and the clocks it saw: a drift in time or clocks, not a
            # process, would show here
            "full_detail": [{k: r[k] for k in ("point", "at", "clocks_mhz")} for r in full],
            "single_detail": [{k: r[k] for k in ("point", "at", "clocks_mhz")}
                              for r in single_runs]}


def _ref_us(harness: Path) -> float | None:
    """ref's median time at publication (the harness's result.json), None if absent."""
    try:
        speed = json.loads((harness / "result.json").read_text())["speed"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (speed.get("debug_only") or {}).get("ref_median_us")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("release", type=Path)
    p.add_argument("--max-ref-us", type=float, default=10.0,
                   help="operators whose ref takes at most this long (default 10 µs; 0: all)")
    p.add_argument("--runs", type=int, default=4)
    p.add_argument("--replicates", type=int, default=6)
    p.add_argument("--hogs", type=int, default=0)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    index = json.loads((args.release / "index.json").read_text())
    todo = []
    for row in index["operators"]:
        harness = args.release / (row.get("paths") or {}).get("harness", "")
        us = _ref_us(harness)
        if row["status"] == "pass" and (harness / "harness.json").is_file() and \
                (not args.max_ref_us or (us is not None and us <= args.max_ref_us)):
            todo.append((row["name"], harness, us))
    if not todo:
        raise SystemExit(f"run_level.py: no passing operator with ref <= {args.max_ref_us} µs")
    doc = {"benchmark": "run_level", "release": str(args.release), "runs": args.runs,
           "replicates": args.replicates, "hogs": args.hogs, "device": device_line(),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "operators": {}}
    with tempfile.TemporaryDirectory() as tmp, hogs(args.hogs):
        for n, (name, harness, us) in enumerate(todo, 1):
            print(f"[{n}/{len(todo)}] {name} (ref {us or 0:.1f} µs)", file=sys.stderr,
                  flush=True)
            work = Path(tmp) / f"op{n}"
            work.mkdir()
            doc["operators"][name] = {"ref_us": us, **operator(harness, args.runs,
                                                              args.replicates, work)}
    ratios = [o["ratio_between_over_predicted"] for o in doc["operators"].values()
              if o["ratio_between_over_predicted"]]
    doc["median_ratio_between_over_predicted"] = statistics.median(ratios) if ratios else None
    emit(doc, args.out)


if __name__ == "__main__":
    main()
