"""Fold one benchmark run into its results file: ``benchmarks/results/<benchmark>_<device>.json``.

    python benchmarks/fold_result.py OUT.json benchmarks/results/trust_overhead_cuda_h100.json \
        [--command "python benchmarks/trust_overhead.py --backend cuda ..."] [--device LINE] \
        [--tree SHA] [--date "YYYY-MM-DD HH:MM UTC"] [--id ID]

A results file holds every kept run of one benchmark on one device class, newest first:

    {"benchmark": "trust_overhead", "device_class": "cuda_h100",
     "runs": [{"id": "2026-12-07 ec8a887", "date": "...", "device": "...", "tree": "...",
               "command": "...", "figures": {...the benchmark's own JSON...}}, ...]}

``figures`` is the benchmark's output as it wrote it. A run whose figures are already in the
file is not added again. Defaults: ``date`` now (UTC), ``tree`` the checkout's short HEAD,
``device`` and ``command`` the output's own ``device_line``/``device`` and ``command`` fields,
``id`` the date and the tree (made unique within the file).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
from pathlib import Path


def _head() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], capture_output=True,
                             text=True, check=True, cwd=Path(__file__).parent)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def _field(figures: object, *names: str) -> str | None:
    if isinstance(figures, dict):
        for name in names:
            value = figures.get(name)
            if isinstance(value, str) and value:
                return value
    return None


def new_file(path: Path) -> dict:
    """An empty results file named ``<benchmark>_<device class>.json``: the benchmark is
    everything up to the device class, the last ``_`` part (two for ``cuda_h100``)."""
    parts = path.stem.split("_")
    cut = -2 if len(parts) > 2 and parts[-2] in ("cuda", "hip") else -1
    return {"benchmark": "_".join(parts[:cut]) or path.stem,
            "device_class": "_".join(parts[cut:]), "runs": []}


def unique_id(base: str, taken: set[str]) -> str:
    if base not in taken:
        return base
    n = 2
    while f"{base} ({n})" in taken:
        n += 1
    return f"{base} ({n})"


def fold(doc: dict, figures: object, *, date: str | None = None, device: str | None = None,
         tree: str | None = None, command: str | None = None, run_id: str | None = None
         ) -> dict | None:
    """Add one run to ``doc`` (a results file's content), newest first by date; returns the
    run, or None where the same figures are already there."""
    runs = doc.setdefault("runs", [])
    if any(r.get("figures") == figures for r in runs):
        return None
    date = date or dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    run = {"id": unique_id(run_id or " ".join(x for x in (date[:10], tree) if x),
                           {r["id"] for r in runs}),
           "date": date, "device": device or _field(figures, "device_line", "device"),
           "tree": tree, "command": command or _field(figures, "command"),
           "figures": figures}
    runs.append(run)
    runs.sort(key=lambda r: r.get("date") or "", reverse=True)
    return run


def write(path: Path, doc: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("result", type=Path, help="the benchmark's JSON output")
    ap.add_argument("into", type=Path, help="benchmarks/results/<benchmark>_<device>.json")
    ap.add_argument("--command")
    ap.add_argument("--device")
    ap.add_argument("--tree")
    ap.add_argument("--date")
    ap.add_argument("--id", dest="run_id")
    args = ap.parse_args(argv)
    try:
        figures = json.loads(args.result.read_text())
        doc = json.loads(args.into.read_text()) if args.into.exists() else new_file(args.into)
    except (OSError, ValueError) as e:
        print(f"fold_result: {e}", file=sys.stderr)
        return 2
    run = fold(doc, figures, date=args.date, device=args.device, tree=args.tree or _head(),
               command=args.command, run_id=args.run_id)
    if run is None:
        print(f"{args.into}: these figures are already there")
        return 0
    write(args.into, doc)
    print(f"{args.into}: run {run['id']!r} added ({len(doc['runs'])} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
