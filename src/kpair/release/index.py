"""``index.json``: a release's typed index, and the pure arithmetic that builds it.

``Index`` holds one ``Row`` per published operator (its verdict: ``CorrectnessMode``,
``HarnessSpeed``, ``Director``, ``Paths``) and one per pair ``release add`` refused, and a
``Summary`` whose geometric means cover passing operators only. ``operator_row`` builds a row
from a ``Result`` and the harness it judged; ``summarize`` and ``build_index`` are pure, so the
index math is tested on synthetic rows without running anything. ``Index.read`` (and
``load_index``) is the one strict reader: it names the failing field (``operators[3].status``).

The JSON is the contract of ``docs/format.md`` (schema ``kpair.release_index`` v1); field order
and nulls are as kpair 0.1 wrote them, so an index written then reads now.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from .. import __version__
from .._util import utc_now
from ..errors import FormatError, KpairError, UsageError
from ..formats import Record, read, write
from ..measure import geomean
from ..policy import Policy, Tolerance
from ..result import Result

SCHEMA = "kpair.release_index"
SCHEMA_VERSION = 1
INDEX = "index.json"
HARNESS, PROVENANCE, EXCLUDED = "harness", "provenance", "excluded"
#: ``level<N>/<op>/devices/<d>/``: results of ``verify --each`` on devices other than the first.
DEVICES = "devices"
DIRECTOR_FILE = "director_validation.json"
LAYOUT = "level<N>/<op>/harness, level<N>/<op>/provenance"
#: The band inside which slot_bias says "the slot position does not matter" (seed: 0.9914-1.0089).
SLOT_BIAS_BAND = (0.99, 1.01)
DIRECTOR_NOTE = ("reference only: the optimizer's own baseline on its own workload, not the "
                 "captured dispatch; not comparable with the Harness speedup")
STATUSES = ("pass", "fail", "error")
WHERE_PUBLISHED = "published, fails verification"
WHERE_REFUSED = "refused by release add"
WHERE_NO_WINNER = "refused by the optimizer: no winner"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")

Status = Literal["pass", "fail", "error"]
Level = Annotated[int, msgspec.Meta(ge=1)]


def check_key(level: object, name: object) -> tuple[int, str]:
    """Refuse levels and operator names that would not make a safe, unambiguous directory."""
    if isinstance(level, bool) or not isinstance(level, int) or level < 1:
        raise UsageError(f"level must be an integer >= 1, got {level!r}")
    if not isinstance(name, str) or not is_operator_name(name):
        raise UsageError(f"operator name {name!r} must be letters, digits and _ . + - "
                         "(not starting with a dot or dash), e.g. 37_FrobeniusNorm_")
    return level, name


def is_operator_name(name: str) -> bool:
    return bool(_NAME.fullmatch(name)) and len(name) <= 200


def rel_dir(level: int, name: str) -> str:
    return f"level{level}/{name}"


# --------------------------------------------------------------------------- the records


class ToleranceRow(Record):
    """One declared tolerance of the policy, with what the last run measured (null if none)."""

    region: str
    range: tuple[int, int]
    dtype: str
    criterion: str
    threshold: dict[str, int | float]
    rule: str
    metric: str | None
    measured: float | None


class CorrectnessMode(Record, omit_defaults=True):
    """``byte-exact``; or ``tolerance`` with the policy's path and its tolerances; or
    ``unknown`` with the ``error`` that kept the policy from being read."""

    mode: Literal["byte-exact", "tolerance", "unknown"]
    label: str
    policy: str | None = None
    tolerances: list[ToleranceRow] | None = None
    error: str | None = None


class HarnessSpeed(Record, kw_only=True, omit_defaults=True):
    """The Harness measurement (recommended numbers), as in result.json's ``speed``;
    ``combined_ci95`` also holds the identical-binary control's systematic ``bound``."""

    speedup: float
    ci95: tuple[float, float]
    slot_bias: float
    slot_bias_ci95: tuple[float, float] | None
    blocks: int
    stopped_by: str
    rel_ci_halfwidth: float
    cache: str | None
    combined_ci95: tuple[float, float] | None = None
    systematic_bound: float | None = None

    @property
    def reported_ci95(self) -> tuple[float, float]:
        return self.combined_ci95 if self.combined_ci95 is not None else self.ci95


class Director(Record, omit_defaults=True):
    """The optimizer's own speedup from provenance: reference only, never in the Harness
    numbers. ``speedup`` is null and ``error`` says why when the file was malformed."""

    speedup: float | None
    source: str
    reference_only: Literal[True]
    note: str
    error: str | None = None


class Kernels(Record):
    ref: str | None
    opt: str | None


class Paths(Record):
    """Where the row's files are, relative to the release root."""

    harness: str | None
    result: str
    provenance: str | None


class DeviceRun(Record, kw_only=True):
    """One device's verdict on an operator (``verify --each``): its status, and on a pass the
    Harness speedup with its intervals, side by side with the other devices'."""

    device_index: int
    device: str | None
    status: Status
    reason: str | None
    speedup: float | None
    ci95: tuple[float, float] | None
    combined_ci95: tuple[float, float] | None
    result: str


class Row(Record, omit_defaults=True):
    """One operator: a published harness, or a pair ``release add`` refused. ``per_device``
    (absent unless the release was verified on several devices with ``--each``) holds every
    device's verdict; the row's own numbers are the first device's. ``refused_by`` is
    "optimizer" on the row of an operator an optimizer found no winner for
    (``refuse_operator``), absent otherwise."""

    level: Level
    name: str
    status: Status
    reason: str | None
    backend: str | None
    arch: str | None
    device: str | None
    kernels: Kernels
    correctness: CorrectnessMode
    harness: HarnessSpeed | None
    director: Director | None
    paths: Paths
    replay: str | None
    inputs_digest: str | None
    verified: str | None
    per_device: list[DeviceRun] | None = None
    refused_by: Literal["optimizer"] | None = None

    def __post_init__(self) -> None:
        try:
            check_key(self.level, self.name)
        except UsageError as e:  # msgspec names the row in the error it makes of this
            raise ValueError(str(e)) from None
        if (self.status == "pass") != (self.harness is not None):
            raise ValueError("a row has a harness speed exactly when its status is pass")

    @property
    def key(self) -> tuple[int, str]:
        return self.level, self.name

    @property
    def rel(self) -> str:
        return rel_dir(self.level, self.name)


class Counts(Record):
    published: int
    passed: int = msgspec.field(name="pass")
    fail: int
    error: int
    refused: int
    excluded: int
    byte_exact: int
    tolerance: int
    by_level: dict[str, int]


class Exclusion(Record):
    """A row kept out of both geometric means, and where it came from."""

    level: Level
    name: str
    status: Status
    reason: str | None
    where: Literal["published, fails verification", "refused by release add",
                   "refused by the optimizer: no winner"]


class Summary(Record):
    counts: Counts
    recommended: Literal["harness"]
    harness_geomean_speedup: float | None
    harness_geomean_over: int
    director_geomean_speedup: float | None
    director_geomean_over: int
    director_note: str
    slot_bias_range: tuple[float, float] | None
    slot_bias_band: tuple[float, float]
    slot_bias_outside_band: list[str]
    excluded: list[Exclusion]


class Index(Record, kw_only=True):
    """``index.json`` (schema ``kpair.release_index`` v1)."""

    schema: Literal["kpair.release_index"] = SCHEMA
    schema_version: Literal[1] = SCHEMA_VERSION
    kpair_version: str = __version__
    updated: str
    layout: str = LAYOUT
    operators: list[Row]
    refused: list[Row]
    summary: Summary

    @classmethod
    def read(cls, path: str | os.PathLike) -> Index:
        return read(Path(path), cls, schema=SCHEMA, version=SCHEMA_VERSION)

    def write(self, path: str | os.PathLike) -> None:
        """Write atomically (a temporary file, then a rename)."""
        write(Path(path), self)

    @property
    def passing(self) -> list[Row]:
        return [r for r in self.operators if r.status == "pass"]


def load_index(root: str | os.PathLike) -> Index | None:
    """Read ``<root>/index.json`` (None if there is none); FormatError names the bad field."""
    path = Path(root) / INDEX
    return Index.read(path) if path.exists() else None


# --------------------------------------------------------------------------- rows


def rule_text(t: Tolerance) -> str:
    """The criterion and threshold of ``t`` without its range ("cosine >= 0.9999"): the head of
    ``Tolerance.describe``, so both say the same."""
    return t.describe().partition(" over ")[0]


class _Tol(msgspec.Struct):
    region: str | None = None
    range: tuple[int, int] | None = None


class _Check(msgspec.Struct):
    tolerance: _Tol = msgspec.field(default_factory=_Tol)
    metric: str | None = None
    value: float | None = None


class _JudgedRegion(msgspec.Struct):
    checks: list[_Check] = []


def _measured(result: Result | None) -> dict[tuple, _Check]:
    """The last run's measured value per declared range, from result.json's regions."""
    if result is None or result.correctness is None:
        return {}
    try:
        regions = msgspec.convert(result.correctness.regions, list[_JudgedRegion])
    except msgspec.ValidationError:
        return {}  # no numbers to show is not worth losing the row over
    return {(c.tolerance.region, c.tolerance.range): c for r in regions for c in r.checks}


def correctness_mode(policy: Policy, result: Result | None, policy_path: str
                     ) -> CorrectnessMode:
    """Byte-exact, or the declared tolerances with criterion, threshold and measured value."""
    if policy.mode == "byte-exact":
        return CorrectnessMode(mode="byte-exact", label="byte-exact")
    measured = _measured(result)
    tolerances = []
    for t in policy.tolerances:
        seen = measured.get((t.region, (t.start, t.end)), _Check())
        tolerances.append(ToleranceRow(
            region=t.region, range=(t.start, t.end), dtype=t.dtype, criterion=t.criterion,
            threshold={k: getattr(t, k) for k in ("min_cosine", "rtol", "atol", "max_ulp")
                       if getattr(t, k) is not None},
            rule=rule_text(t), metric=seen.metric, measured=seen.value))
    rules = sorted({t.rule for t in tolerances})
    return CorrectnessMode(mode="tolerance", label="tolerance: " + "; ".join(rules),
                           policy=policy_path, tolerances=tolerances)


def read_director(prov: Path | None, rel: str) -> Director | None:
    """The optimizer's own speedup from ``director_validation.json``; None when absent.

    The file is free-form (only ``speedup`` is read), and a malformed one does not stop a
    batch: the row carries the problem instead of a number.
    """
    if prov is None or not (prov / DIRECTOR_FILE).is_file():
        return None
    out = {"source": rel, "reference_only": True, "note": DIRECTOR_NOTE}
    try:
        data = json.loads((prov / DIRECTOR_FILE).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return Director(speedup=None, error=f"{DIRECTOR_FILE} is not readable JSON: {e}", **out)
    value = data.get("speedup") if isinstance(data, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value <= 0:
        return Director(speedup=None, error=f"{DIRECTOR_FILE}: field speedup must be a finite "
                                            f"positive number, got {value!r}", **out)
    return Director(speedup=float(value), **out)


def harness_speed(result: Result) -> HarnessSpeed | None:
    """The Harness numbers of a pass (None otherwise)."""
    s = result.speed
    if result.status != "pass" or s is None:
        return None
    return HarnessSpeed(speedup=s.speedup, ci95=s.ci95, slot_bias=s.slot_bias,
                        slot_bias_ci95=s.slot_bias_ci95, blocks=s.blocks,
                        stopped_by=s.stopped_by, rel_ci_halfwidth=s.rel_ci_halfwidth,
                        cache=s.cache, combined_ci95=s.combined_ci95,
                        systematic_bound=s.systematic.bound if s.systematic else None)


def operator_row(level: int, name: str, result: Result, *, harness_dir: Path,
                 provenance_dir: Path | None, published: bool = True) -> Row:
    """One index row from a harness directory and its result (paths relative to the root).

    A harness that cannot be opened (the reason its run is an error, most often) still gets a
    row: its kernels are unknown and its correctness mode is ``unknown`` with the error."""
    from ..harness import Harness  # opens snapshots and policies: not needed for the math

    base = rel_dir(level, name) if published else f"{EXCLUDED}/{rel_dir(level, name)}"
    env: dict[str, Any] = result.environment or {}
    backend, arch, kernels = env.get("backend"), env.get("arch"), Kernels(ref=None, opt=None)
    try:
        h = Harness.open(harness_dir, verify=False)
    except KpairError as e:
        correctness = CorrectnessMode(mode="unknown", label="unknown", error=str(e))
    else:
        backend, arch = h.backend, h.snapshot.manifest.arch
        kernels = Kernels(ref=h.ref.kernel, opt=h.opt.kernel)
        # info["policy"] is the policy's path inside the harness, checked by Harness.open.
        policy_path = f"{rel_dir(level, name)}/{HARNESS}/{h.info['policy']}"
        correctness = correctness_mode(h.policy, result, policy_path)
    return Row(
        level=level, name=name, status=result.status, reason=result.reason,
        backend=backend, arch=arch, device=env.get("device"), kernels=kernels,
        correctness=correctness, harness=harness_speed(result),
        director=read_director(provenance_dir, f"{base}/{PROVENANCE}/{DIRECTOR_FILE}"),
        paths=Paths(harness=f"{base}/{HARNESS}" if published else None,
                    result=f"{base}/{HARNESS}/result.json" if published
                    else f"{base}/result.json",
                    provenance=f"{base}/{PROVENANCE}" if provenance_dir else None),
        replay=(result.replay or {}).get("mode"), inputs_digest=result.inputs_digest,
        verified=result.started or None)


def device_run(device: int, result: Result, path: str) -> DeviceRun:
    """One device's verdict from its result (``path``: its result.json, relative to the root)."""
    speed = harness_speed(result)
    return DeviceRun(device_index=device, device=(result.environment or {}).get("device"),
                     status=result.status, reason=result.reason,
                     speedup=speed.speedup if speed else None, ci95=speed.ci95 if speed else None,
                     combined_ci95=speed.combined_ci95 if speed else None, result=path)


def with_devices(row: Row, runs: list[DeviceRun]) -> Row:
    """``row`` (made from the first device's result) with every device's verdict. The verdict
    must not depend on where it ran: a device that could not run it, or correctness verdicts
    that differ between devices, make the row an ``error`` that says which device and why."""
    errors = [r for r in runs if r.status == "error"]
    statuses = {r.status for r in runs}
    if errors:
        why = "; ".join(f"device {r.device_index}: {r.reason}" for r in errors)
        reason = f"not verified on every device ({why})"
    elif len(statuses) > 1:
        said = ", ".join(f"{r.status} on device {r.device_index}" for r in runs)
        fails = "; ".join(f"device {r.device_index}: {r.reason}" for r in runs
                          if r.status == "fail")
        reason = f"verdicts differ between devices: {said} ({fails})"
    else:
        return row.replace(per_device=runs)
    return row.replace(status="error", reason=reason, harness=None, per_device=runs)


# --------------------------------------------------------------------------- index math


def sort_key(level: int, name: str) -> tuple:
    # KernelBench-style names start with a problem number: sort 2_ before 10_.
    m = re.match(r"(\d+)", name)
    return level, int(m.group(1)) if m else math.inf, name


def summarize(operators: list[Row], refused: list[Row]) -> Summary:
    """Counts, geometric means over passing operators only, slot_bias range, exclusions."""
    passing = [r for r in operators if r.status == "pass" and r.harness is not None]
    speedups = [r.harness.speedup for r in passing]
    director = [r.director.speedup for r in passing if r.director and r.director.speedup]
    biases = [r.harness.slot_bias for r in passing]
    lo, hi = SLOT_BIAS_BAND
    excluded = [Exclusion(level=r.level, name=r.name, status=r.status, reason=r.reason,
                          where=WHERE_PUBLISHED if published else
                          WHERE_NO_WINNER if r.refused_by == "optimizer" else WHERE_REFUSED)
                for rows, published in ((operators, True), (refused, False))
                # A refused pass (correct, not faster) is excluded as well.
                for r in rows if r.status != "pass" or not published]
    levels: dict[str, int] = {}
    for r in passing:
        levels[f"level{r.level}"] = levels.get(f"level{r.level}", 0) + 1
    return Summary(
        counts=Counts(
            published=len(operators), passed=len(passing),
            fail=sum(r.status == "fail" for r in operators),
            error=sum(r.status == "error" for r in operators),
            refused=len(refused), excluded=len(excluded),
            byte_exact=sum(r.correctness.mode == "byte-exact" for r in passing),
            tolerance=sum(r.correctness.mode == "tolerance" for r in passing),
            by_level=dict(sorted(levels.items()))),
        recommended="harness",
        harness_geomean_speedup=geomean(speedups) if speedups else None,
        harness_geomean_over=len(speedups),
        director_geomean_speedup=geomean(director) if director else None,
        director_geomean_over=len(director),
        director_note=DIRECTOR_NOTE,
        slot_bias_range=(min(biases), max(biases)) if biases else None,
        slot_bias_band=SLOT_BIAS_BAND,
        slot_bias_outside_band=[r.rel for r in passing
                                if not lo <= r.harness.slot_bias <= hi],
        excluded=excluded)


def build_index(operators: list[Row], refused: list[Row]) -> Index:
    operators = sorted(operators, key=lambda r: sort_key(*r.key))
    refused = sorted(refused, key=lambda r: sort_key(*r.key))
    return Index(updated=utc_now(), operators=operators, refused=refused,
                 summary=summarize(operators, refused))


__all__ = ["CorrectnessMode", "Counts", "DEVICES", "DIRECTOR_NOTE", "DeviceRun", "Director",
           "Exclusion",
           "FormatError", "HarnessSpeed", "INDEX", "Index", "Kernels", "Paths", "Row",
           "SLOT_BIAS_BAND", "Summary", "ToleranceRow", "build_index", "check_key",
           "correctness_mode", "harness_speed", "load_index", "operator_row", "read_director",
           "rule_text", "summarize", "device_run", "with_devices"]
