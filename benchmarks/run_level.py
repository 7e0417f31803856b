"""Is there a run-level (worker process) component in a published speedup, as JSON?

On an H100 (2026-12-05, docs/evidence/timing.md), the re-run points of
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
        [--hogs N] [--no-singles] [--out FILE.json]

``--hogs N`` runs it all beside N busy-loop processes (``reproduce.py``'s, for the host).
Operators take turns round by round, so the runs of one round lie seconds apart:
``co_movement`` (the median correlation, over pairs of operators, of their points by round)
near 1 says the runs move with something of the machine's at that moment, which no design of
one run re-rolls; ``--no-singles`` skips the one-replicate processes.
"""

from __future__ import annotations

import argparse
import contextlib
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


def operator_stats(full: list[dict], single_runs: list[dict], replicates: int) -> dict:
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
            "full_detail": [{k: r[k] for k in ("round", "point", "at", "clocks_mhz")}
                            for r in full],
            "single_detail": [{k: r[k] for k in ("round", "point", "at", "clocks_mhz")}
                              for r in single_runs]}


def co_movement(ops: dict[str, list[dict]]) -> float | None:
    """The median, over pairs of operators, of the correlation of their runs' points taken
    in the same round (seconds apart): near 0, each operator's runs vary on their own; near
    1, they move together with something of the machine's at that moment."""
    by_round = {name: {r["round"]: r["point"] for r in runs} for name, runs in ops.items()}
    names, corr = sorted(by_round), []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            common = sorted(set(by_round[a]) & set(by_round[b]))
            if len(common) > 2:
                xs, ys = [by_round[a][k] for k in common], [by_round[b][k] for k in common]
                with contextlib.suppress(statistics.StatisticsError):
                    corr.append(statistics.correlation(xs, ys))
    return statistics.median(corr) if corr else None


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
    p.add_argument("--no-singles", dest="singles", action="store_false",
                   help="skip the one-replicate processes (the designs' comparison)")
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
    full = {name: [] for name, _, _ in todo}
    single = {name: [] for name, _, _ in todo}
    with tempfile.TemporaryDirectory() as tmp, hogs(args.hogs):
        # round by round, every operator in turn: a drift in time meets both designs and all
        # operators alike, and runs of one round lie seconds apart (co_movement)
        works = [Path(tmp) / f"op{n}" for n in range(len(todo))]
        for work in works:
            work.mkdir()
        for i in range(args.runs):
            for n, ((name, harness, us), work) in enumerate(zip(todo, works, strict=True), 1):
                print(f"[round {i + 1}/{args.runs}, {n}/{len(todo)}] {name} "
                      f"(ref {us or 0:.1f} µs)", file=sys.stderr, flush=True)
                r = _run(harness, work / f"full{i}.json", args.replicates)
                if r:
                    full[name].append({"round": i, **r})
                for j in range(args.replicates if args.singles else 0):
                    r = _run(harness, work / f"single{i}_{j}.json", 1)
                    if r:
                        single[name].append({"round": i, **r})
    for name, _, us in todo:
        doc["operators"][name] = {"ref_us": us, **operator_stats(full[name], single[name],
                                                                 args.replicates)}
    doc["co_movement"] = co_movement(full)
    ratios = [o["ratio_between_over_predicted"] for o in doc["operators"].values()
              if o["ratio_between_over_predicted"]]
    doc["median_ratio_between_over_predicted"] = statistics.median(ratios) if ratios else None
    emit(doc, args.out)


if __name__ == "__main__":
    main()
