"""Releases: many pair harnesses, their provenance, and one index that a third party re-checks.

Layout (contract in ``docs/format.md``)::

    <root>/index.json                  the index (schema kpair.release_index v1)
    <root>/level<N>/<op>/harness/      a pair harness (+ result.json once verified)
    <root>/level<N>/<op>/provenance/   optimizer records, optional: director_validation.json,
                                       attempts.jsonl, ...
    <root>/excluded/level<N>/<op>/     what ``release add`` refused: the result.json that
                                       refused it (+ provenance); the harness is not published

The index holds one *row* per published operator (its Harness verdict: correctness mode, speedup,
slot_bias, CI; its Director speedup from provenance, reference only; its status) and one per
refused pair, and a *summary* whose geometric means cover passing operators only. Rows are
built from ``result.json`` files by pure functions (``operator_row``, ``summarize``), so the
index math is tested without running anything.

Writers: ``verify_release`` re-runs every published harness, each in its own worker process
(``kpair.run.run_harness``), writes every result.json and then the index. ``add_operator``
stages a copy of the harness inside the root, verifies the staged copy, and only on a pass
moves it into place (a directory rename) and rewrites the index. The index is always written
through a temporary file and a rename, and a failed index write moves the directories back, so
an interrupted command leaves the previous index and tree as they were. Both writers hold an
exclusive ``flock`` on ``<root>/.kpair-release.lock`` for their whole run: two concurrent adds
would otherwise each rewrite the index from the same old copy and lose one operator.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from . import __version__
from ._util import read_versioned_json, utc_now
from .errors import FormatError, UsageError
from .measure import geomean
from .policy import Policy, load_policy
from .run import RunOptions, error_result, exit_code, run_harness
from .snapshot import write_json_atomic

SCHEMA = "kpair.release_index"
SCHEMA_VERSION = 1
INDEX = "index.json"
HARNESS, PROVENANCE, EXCLUDED = "harness", "provenance", "excluded"
DIRECTOR_FILE = "director_validation.json"
LOCK = ".kpair-release.lock"
#: The band inside which slot_bias says "the slot position does not matter" (seed: 0.9914-1.0089).
SLOT_BIAS_BAND = (0.99, 1.01)
DIRECTOR_NOTE = ("reference only: the optimizer's own baseline on its own workload, not the "
                 "captured dispatch; not comparable with the Harness speedup")
STATUSES = ("pass", "fail", "error")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")

#: progress(done, total, "level1/op", row or None): None when an operator starts.
Progress = Callable[[int, int, str, "dict | None"], None]


def check_key(level: object, name: object) -> tuple[int, str]:
    """Refuse levels and operator names that would not make a safe, unambiguous directory."""
    if isinstance(level, bool) or not isinstance(level, int) or level < 1:
        raise UsageError(f"level must be an integer >= 1, got {level!r}")
    if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > 200:
        raise UsageError(f"operator name {name!r} must be letters, digits and _ . + - "
                         "(not starting with a dot or dash), e.g. 37_FrobeniusNorm_")
    return level, name


def rel_dir(level: int, name: str) -> str:
    return f"level{level}/{name}"


def _sort_key(row: dict) -> tuple:
    # KernelBench-style names start with a problem number: sort 2_ before 10_.
    m = re.match(r"(\d+)", row["name"])
    return row["level"], int(m.group(1)) if m else math.inf, row["name"]


def discover(root: Path) -> list[tuple[int, str]]:
    """Every published operator: ``level<N>/<op>/harness/harness.json`` under ``root``."""
    found = []
    for level_dir in root.glob("level*"):
        m = re.fullmatch(r"level([1-9][0-9]*)", level_dir.name)
        if not m or not level_dir.is_dir():
            continue
        for op in level_dir.iterdir():
            if _NAME.fullmatch(op.name) and (op / HARNESS / "harness.json").is_file():
                found.append((int(m.group(1)), op.name))
    return [(r["level"], r["name"]) for r in
            sorted(({"level": lv, "name": n} for lv, n in found), key=_sort_key)]


# --------------------------------------------------------------------------- rows


def _short_rule(tol: dict) -> str:
    c = tol["criterion"]
    if c == "cosine":
        return f"cosine >= {tol['min_cosine']:g}"
    if c == "scalar_rtol":
        return f"rtol {tol['rtol']:g}" + (f" (atol {tol['atol']:g})" if tol.get("atol") else "")
    if c == "allclose":
        return f"allclose atol {tol['atol']:g} rtol {tol['rtol']:g}"
    return f"<= {tol['max_ulp']} ulp"


def correctness_mode(policy: Policy, result: dict | None, policy_path: str) -> dict:
    """Byte-exact, or the declared tolerances with criterion, threshold and measured value."""
    if policy.mode == "byte-exact":
        return {"mode": "byte-exact", "label": "byte-exact"}
    measured = {}
    for region in ((result or {}).get("correctness") or {}).get("regions") or []:
        for c in region.get("checks") or []:
            t = c.get("tolerance") or {}
            measured[(t.get("region"), tuple(t.get("range") or ()))] = c
    tolerances = []
    for t in policy.tolerances:
        tj = t.to_json()
        c = measured.get((t.region, (t.start, t.end)), {})
        tolerances.append({"region": t.region, "range": [t.start, t.end], "dtype": t.dtype,
                           "criterion": t.criterion,
                           "threshold": {k: v for k, v in tj.items()
                                         if k in ("min_cosine", "rtol", "atol", "max_ulp")},
                           "rule": _short_rule(tj), "metric": c.get("metric"),
                           "measured": c.get("value")})
    rules = sorted({t["rule"] for t in tolerances})
    return {"mode": "tolerance", "label": "tolerance: " + "; ".join(rules),
            "policy": policy_path, "tolerances": tolerances}


def read_director(prov: Path | None, rel: str) -> dict | None:
    """The optimizer's own speedup from ``director_validation.json``; None when absent.

    A malformed file does not stop a batch: the row carries the problem instead of a number.
    """
    if prov is None or not (prov / DIRECTOR_FILE).is_file():
        return None
    out: dict = {"speedup": None, "source": rel, "reference_only": True, "note": DIRECTOR_NOTE}
    try:
        data = json.loads((prov / DIRECTOR_FILE).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return {**out, "error": f"{DIRECTOR_FILE} is not readable JSON: {e}"}
    value = data.get("speedup") if isinstance(data, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value <= 0:
        return {**out, "error": f"{DIRECTOR_FILE}: field speedup must be a finite positive "
                                f"number, got {value!r}"}
    return {**out, "speedup": float(value)}


def _reason(result: dict) -> str | None:
    status = result.get("status")
    if status == "pass":
        return None
    if status == "fail":
        return (result.get("correctness") or {}).get("summary") or "opt is incorrect"
    err = result.get("error") or {}
    stage = f" (stage {err['stage']})" if err.get("stage") else ""
    return f"{err.get('type', 'error')}{stage}: {err.get('message', 'no verdict')}"


def operator_row(level: int, name: str, result: dict, *, harness_dir: Path,
                 provenance_dir: Path | None, published: bool = True) -> dict:
    """One index row from a harness directory and its result (paths relative to the root)."""
    base = rel_dir(level, name) if published else f"{EXCLUDED}/{rel_dir(level, name)}"
    spec: dict = {}
    with contextlib.suppress(OSError, UnicodeDecodeError, json.JSONDecodeError):
        spec = json.loads((harness_dir / "harness.json").read_text())
    spec = spec if isinstance(spec, dict) else {}
    policy_rel = spec.get("policy") if isinstance(spec.get("policy"), str) \
        else "capture/validation_policy.json"
    try:
        correctness = correctness_mode(load_policy(harness_dir / policy_rel), result,
                                       f"{rel_dir(level, name)}/{HARNESS}/{policy_rel}")
    except FormatError as e:
        correctness = {"mode": "unknown", "label": "unknown", "error": str(e)}
    status = result.get("status") if result.get("status") in STATUSES else "error"
    speed = result.get("speed") if status == "pass" else None
    harness = None
    if speed:
        harness = {k: speed.get(k) for k in ("speedup", "ci95", "slot_bias", "slot_bias_ci95",
                                               "blocks", "stopped_by", "rel_ci_halfwidth",
                                               "cache")}
    env = result.get("environment") or {}
    return {
        "level": level, "name": name, "status": status, "reason": _reason(result),
        "backend": spec.get("backend") or env.get("backend"),
        "arch": spec.get("arch") or env.get("arch"), "device": env.get("device"),
        "kernels": {"ref": (spec.get("ref") or {}).get("kernel"),
                    "opt": (spec.get("opt") or {}).get("kernel")},
        "correctness": correctness, "harness": harness,
        "director": read_director(provenance_dir, f"{base}/{PROVENANCE}/{DIRECTOR_FILE}"),
        "paths": {"harness": f"{base}/{HARNESS}" if published else None,
                  "result": f"{base}/{HARNESS}/result.json" if published
                  else f"{base}/result.json",
                  "provenance": f"{base}/{PROVENANCE}" if provenance_dir else None},
        "replay": (result.get("replay") or {}).get("mode"),
        "inputs_digest": result.get("inputs_digest"),
        "verified": result.get("started"),
    }


# --------------------------------------------------------------------------- index math


def summarize(operators: list[dict], refused: list[dict]) -> dict:
    """Counts, geometric means over passing operators only, slot_bias range, exclusions."""
    passing = [r for r in operators if r["status"] == "pass" and r.get("harness")]
    speedups = [r["harness"]["speedup"] for r in passing]
    director = [r["director"]["speedup"] for r in passing
                if r.get("director") and r["director"].get("speedup")]
    biases = [r["harness"]["slot_bias"] for r in passing]
    lo, hi = SLOT_BIAS_BAND
    excluded = [{"level": r["level"], "name": r["name"], "status": r["status"],
                 "reason": r["reason"], "where": where}
                for rows, where in ((operators, "published, fails verification"),
                                    (refused, "refused by release add"))
                for r in rows if r["status"] != "pass"]
    levels: dict[str, int] = {}
    for r in passing:
        levels[f"level{r['level']}"] = levels.get(f"level{r['level']}", 0) + 1
    return {
        "counts": {
            "published": len(operators), "pass": len(passing),
            "fail": sum(r["status"] == "fail" for r in operators),
            "error": sum(r["status"] == "error" for r in operators),
            "refused": len(refused), "excluded": len(excluded),
            "byte_exact": sum(r["correctness"]["mode"] == "byte-exact" for r in passing),
            "tolerance": sum(r["correctness"]["mode"] == "tolerance" for r in passing),
            "by_level": dict(sorted(levels.items())),
        },
        "recommended": "harness",
        "harness_geomean_speedup": geomean(speedups) if speedups else None,
        "harness_geomean_over": len(speedups),
        "director_geomean_speedup": geomean(director) if director else None,
        "director_geomean_over": len(director),
        "director_note": DIRECTOR_NOTE,
        "slot_bias_range": [min(biases), max(biases)] if biases else None,
        "slot_bias_band": list(SLOT_BIAS_BAND),
        "slot_bias_outside_band": [f"level{r['level']}/{r['name']}" for r in passing
                                   if not lo <= r["harness"]["slot_bias"] <= hi],
        "excluded": excluded,
    }


def build_index(operators: list[dict], refused: list[dict]) -> dict:
    operators = sorted(operators, key=_sort_key)
    refused = sorted(refused, key=_sort_key)
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION,
            "kpair_version": __version__, "updated": utc_now(),
            "layout": "level<N>/<op>/harness, level<N>/<op>/provenance",
            "operators": operators, "refused": refused,
            "summary": summarize(operators, refused)}


def load_index(root: str | os.PathLike) -> dict | None:
    """Read ``<root>/index.json`` (None if there is none); FormatError names the bad field."""
    path = Path(root) / INDEX
    if not path.exists():
        return None
    obj = read_versioned_json(path, SCHEMA, SCHEMA_VERSION)
    for key in ("operators", "refused"):
        rows = obj.get(key)
        if not isinstance(rows, list):
            raise FormatError("expected an array", path=path, field=key)
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise FormatError("expected an object", path=path, field=f"{key}[{i}]")
            try:
                check_key(row.get("level"), row.get("name"))
            except UsageError as e:
                raise FormatError(str(e), path=path, field=f"{key}[{i}]") from None
            if row.get("status") not in STATUSES:
                raise FormatError(f"expected one of {STATUSES}", path=path,
                                  field=f"{key}[{i}].status")
            if not isinstance(row.get("correctness"), dict):
                raise FormatError("expected an object", path=path,
                                  field=f"{key}[{i}].correctness")
    if not isinstance(obj.get("summary"), dict):
        raise FormatError("expected an object", path=path, field="summary")
    return obj


def write_index(root: Path, index: dict) -> None:
    write_json_atomic(root / INDEX, index)


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """Hold the release's writer lock; released by the kernel even if this process dies."""
    with open(root / LOCK, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(f"another kpair command is writing {root} (lock {LOCK}); "
                             "wait for it to finish") from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# --------------------------------------------------------------------------- writers


def _run_one(harness_dir: Path, options: RunOptions) -> dict:
    """run_harness, and whatever goes wrong around the worker still becomes an error row."""
    try:
        return run_harness(harness_dir, options)
    except Exception as e:  # noqa: BLE001 - one operator's trouble must not end the batch
        result = error_result(harness_dir, f"{type(e).__name__}: {e}", stage="run",
                              kind=type(e).__name__)
        with contextlib.suppress(OSError):
            write_json_atomic(harness_dir / "result.json", result)
        return result


def verify_release(root: str | os.PathLike, options: RunOptions | None = None, *,
                   progress: Progress | None = None) -> dict:
    """Run every published harness in its own process, write each result.json, then the index.

    Refused pairs recorded by earlier adds are carried over (they have no harness to re-run),
    unless an operator of the same level and name has since been published.
    """
    root = Path(root)
    if not root.is_dir():
        raise UsageError(f"{root} is not a directory")
    options = options or RunOptions()
    with locked(root):
        old = load_index(root)
        ops = discover(root)
        if not ops and old is None:
            raise UsageError(f"no operators under {root} (expected "
                             "level<N>/<op>/harness/harness.json)")
        rows = []
        for i, (level, name) in enumerate(ops):
            key = rel_dir(level, name)
            if progress:
                progress(i, len(ops), key, None)
            op = root / key
            result = _run_one(op / HARNESS, options)
            prov = op / PROVENANCE
            rows.append(operator_row(level, name, result, harness_dir=op / HARNESS,
                                     provenance_dir=prov if prov.is_dir() else None))
            if progress:
                progress(i + 1, len(ops), key, rows[-1])
        published = set(ops)
        refused = [r for r in (old or {}).get("refused", [])
                   if (r["level"], r["name"]) not in published]
        index = build_index(rows, refused)
        write_index(root, index)
    return index


@dataclass(frozen=True)
class AddOutcome:
    """What ``add_operator`` did: ``added`` only on a pass; ``row`` is the new index row."""

    added: bool
    row: dict
    result: dict
    index: dict

    @property
    def exit_code(self) -> int:
        return exit_code(self.result)


def _copy_inputs(src: Path, dst: Path) -> None:
    # A harness's outputs are not inputs: the add re-verifies and writes its own.
    shutil.copytree(src, dst, symlinks=False, ignore=shutil.ignore_patterns(
        "result.json", "samples.npz", "__pycache__", ".*"))


def add_operator(root: str | os.PathLike, harness: str | os.PathLike, *, level: int, name: str,
                 replace: bool = False, provenance: str | os.PathLike | None = None,
                 options: RunOptions | None = None) -> AddOutcome:
    """Verify ``harness`` and publish it as ``level<N>/<name>`` only if it passes.

    A fail or error is recorded in the index's ``refused`` list (with its result.json under
    ``excluded/``) and nothing is published. An operator already in the release is replaced
    only with ``replace=True``; a refused replacement leaves the published one in place.
    """
    level, name = check_key(level, name)
    root, harness = Path(root), Path(harness)
    if not (harness / "harness.json").is_file():
        raise FormatError("no harness.json here: not a kpair harness", path=harness)
    prov_src = Path(provenance) if provenance is not None else None
    if prov_src is not None and not prov_src.is_dir():
        raise UsageError(f"--provenance {prov_src} is not a directory")
    if root.exists() and not root.is_dir():
        raise UsageError(f"{root} exists and is not a directory")
    root.mkdir(parents=True, exist_ok=True)
    options = options or RunOptions()
    key = rel_dir(level, name)
    with locked(root):
        old = load_index(root) or {"operators": [], "refused": []}
        dest = root / key
        listed = any((r["level"], r["name"]) == (level, name) for r in old["operators"])
        if (dest.exists() or listed) and not replace:
            raise UsageError(f"{key} is already in the release; pass --replace to replace it")
        staging = Path(tempfile.mkdtemp(prefix=".add-", dir=root))
        try:
            staged = staging / "op"
            _copy_inputs(harness, staged / HARNESS)
            if prov_src is not None:
                shutil.copytree(prov_src, staged / PROVENANCE)
            prov = staged / PROVENANCE if prov_src is not None else None
            result = _run_one(staged / HARNESS, options)
            passed = result.get("status") == "pass"
            row = operator_row(level, name, result, harness_dir=staged / HARNESS,
                               provenance_dir=prov, published=passed)
            others = [r for r in old["operators"] if (r["level"], r["name"]) != (level, name)]
            refused = [r for r in old["refused"] if (r["level"], r["name"]) != (level, name)]
            if passed:
                result["harness"] = str((dest / HARNESS).resolve())
                write_json_atomic(staged / HARNESS / "result.json", result)
                _publish(root, staging, dest, build_index(others + [row], refused))
            else:
                kept = [r for r in old["operators"] if (r["level"], r["name"]) == (level, name)]
                _record_exclusion(root, staging, root / EXCLUDED / key,
                                  build_index(others + kept, refused + [row]))
            return AddOutcome(passed, row, result, load_index(root) or {})
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _swap_in(new: Path, dest: Path, trash: Path) -> bool:
    """Move ``new`` to ``dest``, the previous ``dest`` (if any) to ``trash``; True if there was
    one. Each step is one rename, so nothing is ever half copied in the tree."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    had_old = dest.exists()
    if had_old:
        os.replace(dest, trash)
    os.replace(new, dest)
    return had_old


def _swap_back(new: Path, dest: Path, trash: Path, had_old: bool) -> None:
    os.replace(dest, new)
    if had_old:
        os.replace(trash, dest)


def _publish(root: Path, staging: Path, dest: Path, index: dict) -> None:
    had_old = _swap_in(staging / "op", dest, staging / "old")
    try:
        write_index(root, index)
    except BaseException:
        # The index was not replaced: put the tree back the way that index describes it.
        _swap_back(staging / "op", dest, staging / "old", had_old)
        raise


def _record_exclusion(root: Path, staging: Path, dest: Path, index: dict) -> None:
    keep = staging / "excluded"
    keep.mkdir()
    with contextlib.suppress(FileNotFoundError):
        os.replace(staging / "op" / HARNESS / "result.json", keep / "result.json")
    if (staging / "op" / PROVENANCE).is_dir():
        os.replace(staging / "op" / PROVENANCE, keep / PROVENANCE)
    had_old = _swap_in(keep, dest, staging / "old-excluded")
    try:
        write_index(root, index)
    except BaseException:
        _swap_back(keep, dest, staging / "old-excluded", had_old)
        raise


__all__ = ["AddOutcome", "SLOT_BIAS_BAND", "add_operator", "build_index",
           "correctness_mode", "discover", "load_index", "operator_row", "read_director",
           "summarize", "verify_release"]
