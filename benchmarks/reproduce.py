"""Do published numbers reproduce? Publish a release, re-verify it many times, print coverage.

Two phases, so that a GPU run fits the device's 10-minute calls and a release published on
one machine can be re-verified on another:

    python benchmarks/reproduce.py publish --backend cuda -o REL   # kpair optimize, 2 programs
    python benchmarks/reproduce.py publish --backend host -o REL   # recorded kp_matmul pairs
        [--sizes 96 128 224 256] [--hogs 2] [--time-cap S]
    python benchmarks/reproduce.py verify REL [--times 6] [--hogs 2] [--out FILE.json]
    python benchmarks/reproduce.py compact REL -o SMALL [--max-mb 24]   # to re-verify elsewhere

``publish --backend cuda`` runs ``kpair optimize`` (Triton retunes, as in the README) on the two
compiled programs of ``benchmarks/programs/`` into REL, then pairs ``--identical`` of the
published operators with themselves (opt = ref's own binary: no difference at all) under
``REL/identical/``. ``publish --backend host`` records kp_matmul at several sizes, publishes
naive-against-reordered pairs and keeps identical pairs likewise (tests/csrc/matmul.c);
``--hogs N`` publishes beside N busy loops (as ``verify --hogs`` re-runs), ``--time-cap S``
gives the harnesses a measurement budget of S seconds (their ``measure.time_cap_s``: the
replicates then span S seconds of wall clock, at a publication and at every re-run alike).

``verify`` runs ``kpair verify REL`` ``--times`` times, each in a fresh process (``--hogs N``:
beside N busy-loop processes), and each identical pair as many times with ``kpair run``. It
reads the verification records those runs appended to ``REL/index.json`` (earlier records, such
as a committed release carries, are not counted) and prints one JSON document: ``coverage``
(re-verified points inside the published interval / compared), per operator its published
interval, half-width and re-run points, the identical pairs' "no measurable difference" rate,
the wall time per harness, and ``rules``: the same re-runs against the intervals other ways of
folding in the identical-binary control, or leaving out the run-level term, would have
published (``RULES``), so a candidate rule is judged on runs it was not chosen from.

``compact`` publishes the operators of REL whose harnesses are smallest, up to ``--max-mb`` in
all, into a release of their own (``kpair release add``, with their provenance, plus two
identical pairs): small enough to commit and to carry to another, freshly started machine,
where ``verify`` re-runs it.
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

import numpy as np
from _bench import device_line, hogs

KPAIR = [sys.executable, "-m", "kpair"]
ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = [("llama.", "hf_causal_lm.py"), ("resnet18.", "torchvision_model.py")]


def _say(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def _identical(harness: Path, out: Path) -> Path:
    """A pair of the harness's ref with itself: the same bytes loaded twice."""
    from kpair.harness import Harness, create_harness

    h = Harness.open(harness)
    ref = out.parent / (out.name + ".ref" + Path(h.ref.binary).suffix)
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_bytes(h.binary(h.ref))
    return create_harness(h.snapshot.root, out, ref=ref, opt=ref, ref_kernel=h.ref.kernel,
                          opt_kernel=h.ref.kernel, measure=h.info.get("measure") or None).root


def publish_cuda(rel: Path, top: int, limit: int, keep: int, identical: int) -> None:
    for prefix, program in PROGRAMS:
        cmd = KPAIR + ["optimize", "-o", str(rel), "--work", str(rel) + f".work-{prefix}",
                       "--prefix", prefix, "--top", str(top), "--kernel-filter", "^triton_",
                       "--strategy", "triton", "--triton-limit", str(limit), "--keep", str(keep),
                       "--prune-max-blocks", "12", "--prune-time-cap", "0.5", "--time-cap", "2",
                       "--timeout", "60", "--seed", "1", "--",
                       sys.executable, str(ROOT / "benchmarks" / "programs" / program)]
        _say("$", " ".join(cmd[2:]))
        subprocess.run(cmd, check=False)
    _pair_identical(rel, identical)


def _pair_identical(rel: Path, identical: int) -> None:
    index = json.loads((rel / "index.json").read_text())
    for row in index["operators"][:identical]:
        harness = rel / row["paths"]["harness"]
        _identical(harness, rel / "identical" / row["name"])


HOST_SIZES = (96, 128, 160, 192, 224, 256)


def publish_host(rel: Path, identical: int, sizes: tuple[int, ...] = HOST_SIZES,
                 time_cap_s: float | None = None, n_hogs: int = 0) -> None:
    from kpair.harness import create_harness
    from kpair.record import record_call
    from kpair.toolchain import compile_shared

    tmp = Path(tempfile.mkdtemp(prefix="kpair-repro-"))
    libs = {name: compile_shared(ROOT / "tests" / "csrc" / "matmul.c", tmp / f"{name}.so",
                                 defines={"KP_VARIANT": v}) for name, v in (("naive", 0),
                                                                              ("fast", 1))}
    rng = np.random.default_rng(0)
    measure = {"time_cap_s": time_cap_s} if time_cap_s else None
    with hogs(n_hogs):
        for n in sizes:
            a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
            snap = record_call(libs["naive"], "kp_matmul",
                               [a, b, np.zeros((n, n), np.float32), np.int32(n)],
                               tmp / f"s{n}", names=["a", "b", "c", "n"]).root
            h = create_harness(snap, tmp / f"h{n}", opt=libs["fast"], measure=measure)
            t0 = time.monotonic()
            subprocess.run(KPAIR + ["release", "add", str(rel), str(h.root), "--level", "1",
                                    "--name", f"matmul_{n}"], check=False)
            _say(f"published matmul_{n} in {time.monotonic() - t0:.1f} s")
    _pair_identical(rel, identical)


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def compact(rel: Path, out: Path, max_bytes: int, identical: int) -> None:
    rows = json.loads((rel / "index.json").read_text())["operators"]
    sized = sorted((_size(rel / row["paths"]["harness"]), row) for row in rows
                   if row["status"] == "pass")
    total = 0
    for size, row in sized:
        if total + size > max_bytes:
            break
        cmd = KPAIR + ["release", "add", str(out), str(rel / row["paths"]["harness"]),
                       "--level", str(row["level"]), "--name", row["name"]]
        if row["paths"].get("provenance"):   # optimize's publications have one
            cmd += ["--provenance", str(rel / row["paths"]["provenance"])]
        _say("$", " ".join(cmd[2:]), f"({size / 1e6:.1f} MB)")
        if subprocess.run(cmd, check=False).returncode == 0:
            total += size
    _pair_identical(out, identical)
    _say(f"compact release {out}: {_size(out) / 1e6:.1f} MB")


def verify(rel: Path, times: int, n_hogs: int, identical_pairs: bool = True) -> dict:
    walls, identical = [], {}
    # Only this invocation's re-runs count: a committed release carries the verification
    # records of every earlier re-run in its index.json.
    since = len(json.loads((rel / "index.json").read_text()).get("verifications", []))
    with hogs(n_hogs):
        for i in range(times):
            t0 = time.monotonic()
            subprocess.run(KPAIR + ["verify", str(rel), "--fresh"], check=False,
                           stdout=subprocess.DEVNULL)
            walls.append(time.monotonic() - t0)
            _say(f"verify {i + 1}/{times}: {walls[-1]:.1f} s")
        pairs = sorted((rel / "identical").glob("*")) \
            if identical_pairs and (rel / "identical").is_dir() else []
        for pair in pairs:
            if not (pair / "harness.json").exists():
                continue
            runs = identical[pair.name] = []
            for _ in range(times):
                out = subprocess.run(KPAIR + ["run", str(pair), "--json"], capture_output=True,
                                     text=True, check=False).stdout
                r = json.loads(out) if out.strip().startswith("{") else {}
                speed = r.get("speed") or {}
                parts = _parts(speed)
                runs.append({"status": r.get("status"), "speedup": speed.get("speedup"),
                             "interval": speed.get("combined_ci95") or speed.get("ci95"),
                             "difference": speed.get("difference"),
                             "ci95": speed.get("ci95"),
                             "bound": (speed.get("systematic") or {}).get("bound"),
                             "w_no_run_term": parts[2] if parts else None})
    return summary(rel, walls, identical, n_hogs, times, since)


def _published_speed(rel: Path, row: dict) -> dict:
    """The ``speed`` section of the harness's result.json at publication ({} if absent)."""
    path = (row.get("paths") or {}).get("result")
    try:
        return json.loads((rel / path).read_text())["speed"] or {}
    except (TypeError, OSError, ValueError, KeyError):
        return {}


#: Ways to fold the identical-binary control's bound b into the re-run interval's log
#: half-width w, compared on the same re-runs (``rules`` in the output): what kpair publishes
#: (``quadrature``, since session 17) and the others. ``linear`` is what it published before;
#: ``calibrated`` widens w by the ratio of the spread of run means between processes to what
#: the replicates inside one predict (median 1.19 over 13 H200 operators,
#: benchmarks/results/replicate_structure_h200.json (run 2026-12-04 43c724f)); ``no_run_term`` is
#: ``quadrature`` with w0, w without the run-level term u (``speed.run_sd_log``).
RULES = {"quadrature": lambda w, b, w0: math.hypot(w, b), "linear": lambda w, b, w0: w + b,
         "rerun_only": lambda w, b, w0: w,
         "calibrated": lambda w, b, w0: math.hypot(1.2 * w, b),
         "no_run_term": lambda w, b, w0: math.hypot(w0, b)}


def _halves(ci95, bound) -> tuple[float, float] | None:
    """(w, b): the log half-width of ``ci95`` and the log of the control's bound."""
    if not ci95 or not bound:
        return None
    return (math.log(ci95[1]) - math.log(ci95[0])) / 2, math.log(bound)


def _parts(speed: dict) -> tuple[float, float, float] | None:
    """(w, b, w0) of a result's ``speed``: ``_halves`` of its re-run interval, and w0, w
    without the run-level term (w scaled by sqrt((s^2/R) / (s^2/R + u^2)); w where the
    result has no u)."""
    wb = _halves(speed.get("ci95"), (speed.get("systematic") or {}).get("bound"))
    if wb is None:
        return None
    s, u = speed.get("replicate_sd_log"), speed.get("run_sd_log")
    r = len(speed.get("replicates") or ())
    own = s * s / r if s and r else 0.0
    return (*wb, wb[0] * math.sqrt(own / (own + u * u)) if own and u else wb[0])


def rules(ops: list[dict], identical: dict) -> dict:
    """Per rule: coverage of the same re-runs, median half-width (all, and ref >= 5 us), and
    the identical pairs' "no measurable difference" rate had their intervals been made so."""
    out = {}
    for name, rule in RULES.items():
        inside = compared = 0
        halves, long_halves, none = [], [], []
        for o in ops:
            if o["log_parts"] is None:
                continue
            half = rule(*o["log_parts"], o.get("w_no_run_term") or o["log_parts"][0])
            centre = math.log(o["speedup"])
            for x, ok in zip(o["reruns"], o["inside"], strict=True):
                compared += 1
                inside += x is not None and ok is not None and abs(math.log(x) - centre) <= half
            halves.append(math.expm1(half))
            if (o["ref_median_us"] or 0) >= 5:
                long_halves.append(math.expm1(half))
        for runs in identical.values():
            for r in runs:
                parts = _halves(r.get("ci95"), r.get("bound"))
                if parts and r.get("speedup"):
                    w0 = r.get("w_no_run_term") or parts[0]
                    none.append(abs(math.log(r["speedup"])) <= rule(*parts, w0))
        out[name] = {"coverage": inside / compared if compared else None,
                     "inside": inside, "compared": compared,
                     "median_half_width": statistics.median(halves) if halves else None,
                     "median_half_width_ref_ge_5us": statistics.median(long_halves)
                     if long_halves else None,
                     "identical_no_difference": sum(none) / len(none) if none else None}
    return out


def summary(rel: Path, walls: list[float], identical: dict, hogs: int, times: int,
            since: int = 0) -> dict:
    """The coverage document of a verified release (``verify``'s output): the re-runs
    numbered after ``since`` (the verification records the index held before them)."""
    index = json.loads((rel / "index.json").read_text())
    ops, inside, compared, halves = [], 0, 0, []
    for row in index["operators"]:
        hs = row.get("harness") or {}
        published = hs.get("combined_ci95") or hs.get("ci95")
        # Every re-run compared with the publication counts, a failed one as a miss (its
        # "inside" is None): coverage is kpair verify's own "reproduced" rate.
        points = [v for v in row.get("verifications", [])
                  if v.get("outcome") in ("reproduced", "not reproduced")
                  and v.get("run", 0) > since]
        inside += sum(1 for v in points if v["outcome"] == "reproduced")
        compared += len(points)
        half = (published[1] - published[0]) / 2 / hs["speedup"] if published else None
        if half is not None:
            halves.append(half)
        speed = _published_speed(rel, row)
        parts = _parts(speed)
        ops.append({"name": row["name"], "speedup": hs.get("speedup"), "published": published,
                    "half_width": half,
                    "ref_median_us": (speed.get("debug_only") or {}).get("ref_median_us"),
                    "reruns": [v.get("speedup") for v in points],
                    "inside": [v["outcome"] == "reproduced" for v in points],
                    "failed": [v.get("reason") for v in points if v.get("verdict") != "pass"],
                    "log_parts": parts[:2] if parts else None,
                    "w_no_run_term": parts[2] if parts else None})
    none = [r["difference"] == "none" for runs in identical.values() for r in runs]
    long_halves = [o["half_width"] for o in ops
                   if o["half_width"] is not None and (o["ref_median_us"] or 0) >= 5]
    n_harness = max(1, len(index["operators"]))
    return {"device": device_line(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "hogs": hogs, "times": times, "operators": len(index["operators"]),
            "coverage": inside / compared if compared else None, "compared": compared,
            "inside": inside, "median_half_width": statistics.median(halves) if halves else None,
            "median_half_width_ref_ge_5us": statistics.median(long_halves) if long_halves
            else None,
            "wall_per_harness_s": statistics.median(walls) / n_harness if walls else None,
            "identical_no_difference": (sum(none) / len(none)) if none else None,
            "rules": rules(ops, identical), "identical_runs": identical, "per_operator": ops,
            "earlier_verify_runs": since, "verify_runs": index.get("verifications", [])[since:]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="phase", required=True)
    pub = sub.add_parser("publish")
    pub.add_argument("--backend", choices=("cuda", "host"), default="host")
    pub.add_argument("-o", "--out", type=Path, required=True)
    pub.add_argument("--top", type=int, default=8)
    pub.add_argument("--triton-limit", type=int, default=10)
    pub.add_argument("--keep", type=int, default=2)
    pub.add_argument("--identical", type=int, default=4)
    pub.add_argument("--sizes", type=int, nargs="+", default=list(HOST_SIZES),
                     help="host: the kp_matmul sizes to publish")
    pub.add_argument("--hogs", type=int, default=0, help="host: publish beside N busy loops")
    pub.add_argument("--time-cap", type=float,
                     help="host: the harnesses' measurement budget in seconds (default 30)")
    com = sub.add_parser("compact")
    com.add_argument("release", type=Path)
    com.add_argument("-o", "--out", type=Path, required=True)
    com.add_argument("--max-mb", type=float, default=24)
    com.add_argument("--identical", type=int, default=2)
    ver = sub.add_parser("verify")
    ver.add_argument("release", type=Path)
    ver.add_argument("--times", type=int, default=6)
    ver.add_argument("--hogs", type=int, default=0)
    ver.add_argument("--out", type=Path)
    ver.add_argument("--no-identical", action="store_true",
                     help="re-verify the release only, not the identical-binary pairs")
    args = p.parse_args(argv)
    if args.phase == "publish":
        if args.backend == "cuda":
            publish_cuda(args.out, args.top, args.triton_limit, args.keep, args.identical)
        else:
            publish_host(args.out, args.identical, tuple(args.sizes), args.time_cap, args.hogs)
        return
    if args.phase == "compact":
        compact(args.release, args.out, int(args.max_mb * 1e6), args.identical)
        return
    doc = verify(args.release, args.times, args.hogs, not args.no_identical)
    text = json.dumps(doc, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
