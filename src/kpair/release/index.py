"""``index.json``: a release's typed index, and the pure arithmetic that builds it.

``Index`` holds one ``Row`` per published operator (its verdict: ``CorrectnessMode``,
``HarnessSpeed``, ``Director``, ``Paths``) and one per pair ``release add`` refused, and a
``Summary`` whose geometric means cover passing operators only. ``operator_row`` builds a row
from a ``Result`` and the harness it judged; ``summarize`` and ``build_index`` are pure, so the
index math is tested on synthetic rows without running anything. ``Index.read`` (and
``load_index``) is the one strict reader: it names the failing field (``operators[3].status``).

Every row keeps what ``release add`` published; each ``kpair verify`` appends a
``Verification`` to every row it re-ran and one ``VerifyRun`` (the release-level tally) to
the index. ``classify`` (pure) says whether a re-run reproduced the published number, and
``RefIdentity`` (the ref code object's sha256, kernel name and launch) tells a re-capture
with another ref apart: a "different operator", never a changed speedup.

A release made by the tournament (``kpair.release.tournament``) has rows that name the
winning ``producer``, every producer's judged candidate (``entrants``) and, for an operator
not published, the ``exclusion`` reason from a fixed set.

The JSON is the contract of ``docs/format.md`` (schema ``kpair.release_index`` v4; a v1
index, as kpair 0.1 wrote it, and v2 and v3 ones read too and are upgraded in memory).
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
from ..formats import Record, check_version, convert, parse, read, write
from ..measure import geomean
from ..policy import Policy, Tolerance
from ..result import Result
from ..sol import SpeedOfLight

SCHEMA = "kpair.release_index"
SCHEMA_VERSION = 4
#: Versions ``Index.read`` reads (v1: no verification records, no ref identity; v2: no
#: region and stored bytes per row; v3: no tournament fields: producer, entrants, exclusion).
READS = (1, 2, 3, 4)
_V4_ROW_FIELDS = ("producer", "exclusion", "entrants")
#: Row fields each older version lacks: a file of that version that holds one is refused.
_NEWER_ROW_FIELDS = {1: ("ref_identity", "verifications", "region_bytes", "stored_bytes",
                         "range", "plan_launches", *_V4_ROW_FIELDS),
                     2: ("region_bytes", "stored_bytes", "range", "plan_launches",
                         *_V4_ROW_FIELDS),
                     3: _V4_ROW_FIELDS}
INDEX = "index.json"
HARNESS, PROVENANCE, EXCLUDED = "harness", "provenance", "excluded"
#: ``level<N>/<op>/devices/<d>/``: results of ``verify --each`` on devices other than the first.
DEVICES = "devices"
#: ``level<N>/<op>/verify/<run>/``: the results of verification ``run`` of a published
#: operator (the publication's own result.json under harness/ stays as it was published).
VERIFY = "verify"
DIRECTOR_FILE = "director_validation.json"
BASELINE_FILE = "baseline.json"
BASELINE_SCHEMA = "kpair.baseline"
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
#: What a verification found (``classify``).
Outcome = Literal["reproduced", "not reproduced", "different operator", "error",
                  "no published figure"]
OUTCOMES = ("reproduced", "not reproduced", "different operator", "error",
            "no published figure")
#: Who made a tournament entrant's candidate (``kpair.release.tournament``).
Producer = Literal["inductor-default", "max-autotune", "coordinate-descent", "kpair-search",
                   "plan", "retune"]
PRODUCERS = ("inductor-default", "max-autotune", "coordinate-descent", "kpair-search", "plan",
             "retune")
#: The producers that are Inductor's own choices (Inductor's best is the best correct of them).
INDUCTOR_PRODUCERS = ("inductor-default", "max-autotune", "coordinate-descent")
#: Why the tournament did not publish an operator (one of these, plus the detail).
ExclusionReason = Literal["no-candidate-faster", "wrong-under-every-candidate", "did-not-fit",
                          "nondeterministic-ref", "capture-failed"]
EXCLUSION_REASONS = ("no-candidate-faster", "wrong-under-every-candidate", "did-not-fit",
                     "nondeterministic-ref", "capture-failed")
#: What became of one entrant: judged (pass, fail, error) or refused at pairing.
EntrantStatus = Literal["pass", "fail", "error", "refused"]
Level = Annotated[int, msgspec.Meta(ge=1)]
Count = Annotated[int, msgspec.Meta(ge=0)]


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
        return verdict_interval(self)


def verdict_interval(speed: Any) -> tuple[float, float]:
    """The interval a verdict is read from, of a ``HarnessSpeed`` or a ``Result.speed``:
    ``combined_ci95`` when the identical-binary control ran, else ``ci95``. The one place that
    picks between those fields: reproduction compares against (and with) this interval."""
    combined = getattr(speed, "combined_ci95", None)
    return tuple(combined) if combined is not None else tuple(speed.ci95)


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


class BaselineEntry(Record, kw_only=True, omit_defaults=True):
    """One mode's config for this operator, and its measurement against ref."""

    mode: str
    found: bool
    reason: str | None = None            # why there is no number
    config: dict[str, Any] | None = None
    kernel: str | None = None            # the kernel's name in the tuned capture
    same_as_ref: bool = False
    status: str | None = None            # the search's verdict on it
    speedup: float | None = None         # against ref (1.0 when same_as_ref)
    ci95: tuple[float, float] | None = None


class BaselineRecord(Record, kw_only=True):
    """``provenance/baseline.json``: another tuner's configs for this operator (written by
    ``kpair.optimize.baseline``: Inductor's), measured on its captured dispatch with the
    confirming run's options."""

    schema: Literal["kpair.baseline"] = BASELINE_SCHEMA
    schema_version: Literal[1] = 1
    entries: list[BaselineEntry]
    written: str = ""

    @classmethod
    def read(cls, path: str | os.PathLike) -> BaselineRecord:
        return read(Path(path), cls, schema=BASELINE_SCHEMA, version=1)

    def write(self, path: str | os.PathLike) -> None:
        write(Path(path), self.replace(written=self.written or utc_now()))


class Baseline(Record, omit_defaults=True):
    """Another tuner's choice for this operator (Inductor's coordinate-descent or
    max-autotune config), measured against ref on the same captured dispatch: from the
    optimizer's ``provenance/baseline.json``. ``speedup`` is absent and ``reason`` says why
    when there is no number; ``same_as_ref``: the tuner chose the captured config."""

    mode: str
    speedup: float | None = None
    ci95: tuple[float, float] | None = None
    same_as_ref: bool = False
    reason: str | None = None


class BaselineSummary(Record):
    """The release against one baseline mode, over the operators it has a number for:
    kpair's choice (the published speedup; 1.0, ref kept, where nothing was published) over
    the baseline's, as a geometric mean; how many are at least as fast (points), and how many
    are not slower beyond the intervals (kpair's upper bound at or above the baseline's
    lower one)."""

    mode: str
    operators: int
    geomean_over_baseline: float | None
    at_least: int
    not_slower: int


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


Dim3 = tuple[int, int, int]


class RefIdentity(Record, omit_defaults=True):
    """What makes the ref the ref: its code object's sha256, kernel name and launch (grid,
    block, dynamic shared memory). A re-capture whose ref differs in any of them (Inductor
    autotunes afresh and may pick another config) measures a different operator. A range's
    ref is all its operations: ``sha256`` digests every operation's code object, kernel and
    launch in order, ``kernel`` is the range's name, the launch its first operation's, and
    ``ops`` their count (absent for one dispatch)."""

    sha256: str
    kernel: str
    grid: Dim3
    block: Dim3
    dynamic_shared_bytes: int
    ops: int | None = None

    def differences(self, other: RefIdentity) -> list[str]:
        """What differs from ``other``, one "field: mine -> theirs" each (empty: the same)."""
        out = []
        for f in self.__struct_fields__:
            mine, theirs = _show(getattr(self, f)), _show(getattr(other, f))
            if mine != theirs:
                if f == "sha256":
                    out.append(f"code sha256: {mine[:12]} -> {theirs[:12]}")
                else:
                    out.append(f"{f}: {mine} -> {theirs}")
        return out


def _show(v: object) -> str:
    return "x".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)


class RangeRef(Record):
    """The range a row's ref is: its name (the capture's, else its kernels in order) and how
    many operations it has."""

    name: str
    ops: Annotated[int, msgspec.Meta(ge=1)]


class Verification(Record, kw_only=True, omit_defaults=True):
    """One ``kpair verify`` re-run of a published operator, appended to its row (the row's
    published figures are never changed). ``verdict`` is the re-run's; ``speedup`` and
    ``ci95`` (its verdict interval) are present on a pass; ``published_ci95`` is the interval
    it was compared against; ``inside``/``compatible`` are null when nothing was compared;
    ``same_operator`` is null when either ref identity is unknown; ``differs`` lists what
    differs on a different operator."""

    run: Annotated[int, msgspec.Meta(ge=1)]
    when: str | None
    environment: str | None
    verdict: Status
    reason: str | None
    speedup: float | None
    ci95: tuple[float, float] | None
    published_ci95: tuple[float, float] | None
    inside: bool | None
    compatible: bool | None
    same_operator: bool | None
    outcome: Outcome
    ref_identity: RefIdentity | None
    result: str
    differs: list[str] | None = None
    per_device: list[DeviceRun] | None = None


class VerifyRun(Record, kw_only=True):
    """One ``kpair verify`` of the release: when, where, and how many published numbers it
    reproduced (``reproduced`` of ``compared``; ``rate`` null when nothing was compared).
    ``compared`` counts every re-run of a published pass with the same (or an unknown) ref,
    whatever its verdict; different operators, and rows published without a figure, are
    counted apart; ``first_published`` counts operators this verify published (no earlier
    row)."""

    run: Annotated[int, msgspec.Meta(ge=1)]
    when: str
    kpair_version: str
    devices: list[str]
    compared: int
    reproduced: int
    not_reproduced: int
    error: int
    different_operator: int
    no_published_figure: int
    first_published: int
    rate: float | None


class EntrantRow(Record, kw_only=True, omit_defaults=True):
    """One tournament entrant of an operator, as judged: its ``producer``, the candidate
    (its file or folder name), the verdict (``refused``: the pair itself was refused, e.g. a
    region that could not be bound), and on a pass the Harness speedup with its reported
    interval and whether that interval lies above 1.0 (``faster``). ``winner``: the one
    published."""

    producer: Producer
    candidate: str
    status: EntrantStatus
    reason: str | None = None
    speedup: float | None = None
    ci95: tuple[float, float] | None = None
    faster: bool | None = None
    winner: bool = False
    note: str | None = None


class Row(Record, omit_defaults=True):
    """One operator: a published harness, or a pair ``release add`` refused. ``per_device``
    (absent unless the release was verified on several devices with ``--each``) holds every
    device's verdict; the row's own numbers are the first device's. ``refused_by`` is
    "optimizer" on the row of an operator an optimizer found no winner for
    (``refuse_operator``), absent otherwise. ``ref_identity`` is the ref's identity at
    publication (absent in rows of a v1 index); ``verifications`` the re-runs since, oldest
    first. ``region_bytes`` and ``stored_bytes`` (v3) are the harness snapshot's regions and
    its blob files on disk (absent where the harness could not be opened, and in older rows).
    ``range`` (a range harness: its name and operation count) and ``plan_launches`` (an opt
    that is a launch plan) say what was paired; ``kernels`` then name the range and the
    plan's kernels in order. A tournament's row (v4) names the winning ``producer``, lists
    every ``entrants`` judged, in the order they were judged, and on an operator it did not
    publish (refused by the optimizer) the ``exclusion`` reason, ``reason`` the detail."""

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
    ref_identity: RefIdentity | None = None
    verifications: list[Verification] = []
    sol: SpeedOfLight | None = None
    baselines: list[Baseline] = []
    region_bytes: Count | None = None
    stored_bytes: Count | None = None
    range: RangeRef | None = None
    plan_launches: Annotated[int, msgspec.Meta(ge=1)] | None = None
    producer: Producer | None = None
    exclusion: ExclusionReason | None = None
    entrants: list[EntrantRow] = []

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


# fail and error count a published pass whose last verification failed as that
# verification's verdict (it is not in pass).
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


class Exclusion(Record, omit_defaults=True):
    """A row kept out of both geometric means, and where it came from; ``exclusion``: the
    tournament's reason, where it made the row."""

    level: Level
    name: str
    status: Status
    reason: str | None
    where: Literal["published, fails verification", "refused by release add",
                   "refused by the optimizer: no winner"]
    exclusion: ExclusionReason | None = None


class Summary(Record, omit_defaults=True):
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
    baselines: list[BaselineSummary] = []


class Index(Record, kw_only=True):
    """``index.json`` (schema ``kpair.release_index`` v4): the publication (``operators``,
    ``refused``, ``summary``) and every verify run since (``verifications``, oldest first)."""

    schema: Literal["kpair.release_index"] = SCHEMA
    schema_version: Literal[4] = SCHEMA_VERSION
    kpair_version: str = __version__
    updated: str
    layout: str = LAYOUT
    operators: list[Row]
    refused: list[Row]
    summary: Summary
    verifications: list[VerifyRun] = []

    @classmethod
    def read(cls, path: str | os.PathLike) -> Index:
        """The strict reader of every version: a v1 index comes back as v4, unverified; a
        v2 one as v4 without region and stored bytes; a v3 one as v4 without tournament
        fields."""
        path = Path(path)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise FormatError(f"cannot read ({e.strerror or e})", path=path) from None
        obj = parse(data, path=path)
        if isinstance(obj, dict) and obj.get("schema_version") == 1:
            check_version(obj, SCHEMA, 1, path=path)
            return convert(obj, IndexV1, path=path).upgrade(path)
        if isinstance(obj, dict) and obj.get("schema") == SCHEMA \
                and obj.get("schema_version") not in READS:
            reads = ", ".join(map(str, READS[:-1])) + f" and {READS[-1]}"
            raise FormatError(f"schema_version {obj.get('schema_version')!r} is not supported "
                              f"(this kpair reads {reads})",
                              path=path, field="schema_version")
        if isinstance(obj, dict) and obj.get("schema_version") in (2, 3):
            version = obj["schema_version"]
            check_version(obj, SCHEMA, version, path=path)
            idx = convert({**obj, "schema_version": SCHEMA_VERSION}, cls, path=path)
            _refuse_newer_fields(idx, version, path)
            return idx
        check_version(obj, SCHEMA, SCHEMA_VERSION, path=path)
        return convert(obj, cls, path=path)

    def write(self, path: str | os.PathLike) -> None:
        """Write atomically (a temporary file, then a rename)."""
        write(Path(path), self)

    @property
    def passing(self) -> list[Row]:
        """Published passes whose last verification (if any) did not fail."""
        return [r for r in self.operators if r.status == "pass" and failed_verification(r) is None]


class IndexV1(Record, kw_only=True):
    """``index.json`` v1 (kpair 0.1 and later, before verification records): read only."""

    schema: Literal["kpair.release_index"]
    schema_version: Literal[1]
    kpair_version: str
    updated: str
    layout: str
    operators: list[Row]
    refused: list[Row]
    summary: Summary

    def upgrade(self, path: object = None) -> Index:
        """The same index as v4: no verification yet, no ref identity recorded."""
        _refuse_newer_fields(self, 1, path)
        return Index(kpair_version=self.kpair_version, updated=self.updated,
                     layout=self.layout, operators=self.operators, refused=self.refused,
                     summary=self.summary)


def _refuse_newer_fields(index: Index | IndexV1, version: int, path: object) -> None:
    """Refuse a row of a ``version`` index that holds a field only later versions define."""
    for key in ("operators", "refused"):
        for i, r in enumerate(getattr(index, key)):
            for f in _NEWER_ROW_FIELDS[version]:
                if getattr(r, f) not in (None, []):
                    raise FormatError("unknown field (this format version does not "
                                      "define it)", path=path, field=f"{key}[{i}].{f}")


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


def read_baselines(prov: Path | None) -> list[Baseline]:
    """The baselines an optimizer measured (``provenance/baseline.json``); [] when absent. A
    malformed file does not stop a batch: one entry says what is wrong."""
    if prov is None or not (prov / BASELINE_FILE).is_file():
        return []
    try:
        record = BaselineRecord.read(prov / BASELINE_FILE)
    except (KpairError, OSError) as e:
        return [Baseline(mode="unknown", reason=f"{BASELINE_FILE} is not readable: {e}")]
    return [Baseline(mode=e.mode, speedup=e.speedup, ci95=e.ci95, same_as_ref=e.same_as_ref,
                     reason=None if e.speedup else e.reason or e.status)
            for e in record.entries]


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


def ref_identity(harness: Any) -> RefIdentity:
    """The ref identity of an opened ``kpair.harness.Harness``: its ref code object's sha256,
    kernel name and launch (the captured one with ref's own launch override, if any)."""
    import hashlib

    m = harness.snapshot.manifest
    if m.is_range:   # every operation, in order
        first = next(op for op in m.operations if op.kind == "kernel").launch
        ops = [[op.code.blob.sha256, op.code.kernel_name, list(op.launch.grid),
                list(op.launch.block), op.launch.dynamic_shared_bytes] if op.kind == "kernel"
               else [op.kind, op.dst, op.src, op.size, op.value, op.element_size]
               for op in m.operations]
        return RefIdentity(sha256=hashlib.sha256(json.dumps(ops).encode()).hexdigest(),
                           kernel=harness.range_name, grid=tuple(first.grid),
                           block=tuple(first.block),
                           dynamic_shared_bytes=int(first.dynamic_shared_bytes), ops=len(ops))
    launch = harness.launch(harness.ref)
    return RefIdentity(sha256=hashlib.sha256(harness.binary(harness.ref)).hexdigest(),
                       kernel=harness.ref.kernel, grid=tuple(launch.grid),
                       block=tuple(launch.block),
                       dynamic_shared_bytes=int(launch.dynamic_shared_bytes))


def ref_identity_of(harness_dir: str | os.PathLike) -> RefIdentity | None:
    """The ref identity of the harness in ``harness_dir``; None when it cannot be opened (its
    run says why)."""
    from ..harness import Harness

    try:
        return ref_identity(Harness.open(harness_dir, verify=False))
    except (KpairError, OSError):
        return None


def operator_row(level: int, name: str, result: Result, *, harness_dir: Path,
                 provenance_dir: Path | None, published: bool = True) -> Row:
    """One index row from a harness directory and its result (paths relative to the root).

    A harness that cannot be opened (the reason its run is an error, most often) still gets a
    row: its kernels are unknown and its correctness mode is ``unknown`` with the error."""
    from ..harness import Harness  # opens snapshots and policies: not needed for the math

    base = rel_dir(level, name) if published else f"{EXCLUDED}/{rel_dir(level, name)}"
    env: dict[str, Any] = result.environment or {}
    backend, arch, kernels = env.get("backend"), env.get("arch"), Kernels(ref=None, opt=None)
    identity = region_bytes = stored_bytes = ranged = launches = None
    try:
        h = Harness.open(harness_dir, verify=False)
        identity = ref_identity(h)
    except (KpairError, OSError) as e:
        correctness = CorrectnessMode(mode="unknown", label="unknown", error=str(e))
    else:
        backend, arch = h.backend, h.snapshot.manifest.arch
        kernels = Kernels(ref=h.range_name or h.ref.kernel, opt=h.opt_name)
        if h.snapshot.manifest.is_range:
            ranged = RangeRef(name=h.range_name, ops=len(h.snapshot.manifest.operations))
        launches = len(h.plan.launches) if h.plan is not None else None
        region_bytes = h.snapshot.region_bytes()
        stored_bytes = h.snapshot.stored_bytes()
        # info["policy"] is the policy's path inside the harness, checked by Harness.open.
        policy_path = f"{rel_dir(level, name)}/{HARNESS}/{h.info['policy']}"
        correctness = correctness_mode(h.policy, result, policy_path)
    return Row(
        level=level, name=name, status=result.status, reason=result.reason,
        backend=backend, arch=arch, device=env.get("device"), kernels=kernels,
        correctness=correctness, harness=harness_speed(result),
        director=read_director(provenance_dir, f"{base}/{PROVENANCE}/{DIRECTOR_FILE}"),
        baselines=read_baselines(provenance_dir),
        paths=Paths(harness=f"{base}/{HARNESS}" if published else None,
                    result=f"{base}/{HARNESS}/result.json" if published
                    else f"{base}/result.json",
                    provenance=f"{base}/{PROVENANCE}" if provenance_dir else None),
        replay=(result.replay or {}).get("mode"), inputs_digest=result.inputs_digest,
        verified=result.started or None, ref_identity=identity, sol=result.sol,
        region_bytes=region_bytes, stored_bytes=stored_bytes, range=ranged,
        plan_launches=launches)


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


# --------------------------------------------------------------------------- reproduction


def same_operator(published: RefIdentity | None, rerun: RefIdentity | None) -> bool | None:
    """Whether two ref identities are equal; None when either is unknown."""
    if published is None or rerun is None:
        return None
    return not published.differences(rerun)


def classify(published: tuple[float, float] | None, verdict: Status, speedup: float | None,
             interval: tuple[float, float] | None, same: bool | None
             ) -> tuple[Outcome, bool | None, bool | None]:
    """(outcome, inside, compatible) of one re-run against the published interval.

    In this order: a different ref identity is a "different operator" (nothing compared); a
    re-run that could not run is an "error"; a row published without a figure (not a pass)
    has "no published figure"; a re-run that fails correctness is "not reproduced"; a pass
    is "reproduced" exactly when its speedup lies inside the published interval (ends
    included). ``compatible`` says whether the two intervals overlap, the weaker check,
    reported beside it; ``inside`` and ``compatible`` are None when nothing was compared."""
    if same is False:
        return "different operator", None, None
    if verdict == "error":
        return "error", None, None
    if published is None:
        return "no published figure", None, None
    if verdict != "pass" or speedup is None or interval is None:
        return "not reproduced", None, None
    lo, hi = published
    inside = lo <= speedup <= hi
    compatible = interval[0] <= hi and lo <= interval[1]
    return ("reproduced" if inside else "not reproduced"), inside, compatible


def environment_line(row: Row) -> str | None:
    """Where a run ran, in one line: device name and backend/architecture."""
    parts = [p for p in (row.device, "/".join(x for x in (row.backend, row.arch) if x))
             if p]
    return ", ".join(parts) or None


def verification(published: Row, rerun: Row, *, run: int) -> Verification:
    """The record of ``rerun`` (the row the re-run's result makes, as ``operator_row`` and
    ``with_devices`` build it) against the ``published`` row. Pure."""
    speed = rerun.harness if rerun.status == "pass" else None
    shown = verdict_interval(published.harness) if published.harness else None
    interval = verdict_interval(speed) if speed else None
    same = same_operator(published.ref_identity, rerun.ref_identity)
    outcome, inside, compatible = classify(shown, rerun.status,
                                           speed.speedup if speed else None, interval, same)
    return Verification(
        run=run, when=rerun.verified, environment=environment_line(rerun),
        verdict=rerun.status, reason=rerun.reason, speedup=speed.speedup if speed else None,
        ci95=interval, published_ci95=shown, inside=inside, compatible=compatible,
        same_operator=same, outcome=outcome, ref_identity=rerun.ref_identity,
        result=rerun.paths.result,
        differs=published.ref_identity.differences(rerun.ref_identity) if same is False
        else None, per_device=rerun.per_device)


def verified_row(published: Row, rerun: Row, *, run: int) -> Row:
    """``published`` as it was, with the verification of ``rerun`` appended."""
    return published.replace(verifications=[*published.verifications,
                                            verification(published, rerun, run=run)])


def verify_run(run: int, when: str, records: list[Verification], *,
               first_published: int = 0) -> VerifyRun:
    """The release-level tally of one verify run's records (one per re-run row)."""
    count = {o: sum(v.outcome == o for v in records) for o in OUTCOMES}
    compared = count["reproduced"] + count["not reproduced"] + count["error"]
    return VerifyRun(
        run=run, when=when, kpair_version=__version__,
        devices=sorted({v.environment for v in records if v.environment}),
        compared=compared, reproduced=count["reproduced"],
        not_reproduced=count["not reproduced"], error=count["error"],
        different_operator=count["different operator"],
        no_published_figure=count["no published figure"], first_published=first_published,
        rate=count["reproduced"] / compared if compared else None)


def failed_verification(row: Row) -> Verification | None:
    """The row's last verification when it failed: its re-run failed correctness or could not
    be judged (a tampered input, a crash), on the same (or an unknown) ref. Such a row is
    shown failed and left out of the geometric means, whatever was published; None when the
    row was never verified or its last re-run passed (reproduced or not)."""
    v = latest(row)
    if v is None or v.same_operator is False or v.verdict == "pass":
        return None
    return v


def verification_reason(v: Verification) -> str:
    """One line: which verification failed and why."""
    return f"kpair verify {v.run}: {v.verdict}" + (f": {v.reason}" if v.reason else "")


def latest(row: Row, run: int | None = None) -> Verification | None:
    """The row's verification of ``run`` (default: its last), None if there is none."""
    for v in reversed(row.verifications):
        if run is None or v.run == run:
            return v
    return None


# --------------------------------------------------------------------------- index math


def sort_key(level: int, name: str) -> tuple:
    # KernelBench-style names start with a problem number: sort 2_ before 10_.
    m = re.match(r"(\d+)", name)
    return level, int(m.group(1)) if m else math.inf, name


def summarize(operators: list[Row], refused: list[Row]) -> Summary:
    """Counts, geometric means over passing operators only, slot_bias range, exclusions.

    A published pass whose last verification failed (``failed_verification``) counts as
    that verdict and is excluded, with the verification's reason."""
    failed = {r.key: v for r in operators if (v := failed_verification(r)) is not None}
    passing = [r for r in operators if r.status == "pass" and r.harness is not None
               and r.key not in failed]
    speedups = [r.harness.speedup for r in passing]
    director = [r.director.speedup for r in passing if r.director and r.director.speedup]
    biases = [r.harness.slot_bias for r in passing]
    lo, hi = SLOT_BIAS_BAND
    excluded = [Exclusion(level=r.level, name=r.name, status=r.status, reason=r.reason,
                          where=WHERE_PUBLISHED if published else
                          WHERE_NO_WINNER if r.refused_by == "optimizer" else WHERE_REFUSED,
                          exclusion=r.exclusion)
                for rows, published in ((operators, True), (refused, False))
                # A refused pass (correct, not faster) is excluded as well.
                for r in rows if (r.status != "pass" or not published)
                and not (published and r.key in failed)]
    excluded += [Exclusion(level=r.level, name=r.name, status=failed[r.key].verdict,
                           reason=verification_reason(failed[r.key]), where=WHERE_PUBLISHED)
                 for r in operators if r.key in failed]
    status = {r.key: failed[r.key].verdict if r.key in failed else r.status
              for r in operators}
    levels: dict[str, int] = {}
    for r in passing:
        levels[f"level{r.level}"] = levels.get(f"level{r.level}", 0) + 1
    return Summary(
        counts=Counts(
            published=len(operators), passed=len(passing),
            fail=sum(s == "fail" for s in status.values()),
            error=sum(s == "error" for s in status.values()),
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
        excluded=excluded, baselines=baseline_summaries(operators, refused))


def baseline_summaries(operators: list[Row], refused: list[Row]) -> list[BaselineSummary]:
    """kpair's choice against each baseline mode (``BaselineSummary``)."""
    ratios: dict[str, list[tuple[float, bool]]] = {}
    for rows, published in ((operators, True), (refused, False)):
        for r in rows:
            ours, upper = 1.0, 1.0  # nothing published: ref is kept
            if published and r.status == "pass" and r.harness is not None \
                    and failed_verification(r) is None:
                ours, upper = r.harness.speedup, r.harness.reported_ci95[1]
            for b in r.baselines:
                if b.speedup:
                    lower = b.ci95[0] if b.ci95 else b.speedup
                    ratios.setdefault(b.mode, []).append((ours / b.speedup, upper >= lower))
    return [BaselineSummary(mode=mode, operators=len(v),
                            geomean_over_baseline=geomean([x for x, _ in v]),
                            at_least=sum(x >= 1.0 for x, _ in v),
                            not_slower=sum(ok for _, ok in v))
            for mode, v in sorted(ratios.items())]


def build_index(operators: list[Row], refused: list[Row],
                verifications: list[VerifyRun] | None = None) -> Index:
    """The index of these rows; ``verifications``: the release's verify runs, carried over."""
    operators = sorted(operators, key=lambda r: sort_key(*r.key))
    refused = sorted(refused, key=lambda r: sort_key(*r.key))
    return Index(updated=utc_now(), operators=operators, refused=refused,
                 summary=summarize(operators, refused), verifications=list(verifications or []))


__all__ = ["BASELINE_FILE", "Baseline", "BaselineEntry", "BaselineRecord", "BaselineSummary",
           "CorrectnessMode", "Counts", "DEVICES", "DIRECTOR_NOTE", "DeviceRun", "Director",
           "EXCLUSION_REASONS", "EntrantRow", "EntrantStatus", "ExclusionReason",
           "INDUCTOR_PRODUCERS", "PRODUCERS", "Producer", "Exclusion",
           "FormatError", "HarnessSpeed", "INDEX", "Index", "IndexV1", "Kernels",
           "OUTCOMES", "Outcome", "Paths", "RangeRef", "RefIdentity", "Row", "SLOT_BIAS_BAND",
           "Summary",
           "ToleranceRow", "Verification", "VerifyRun", "baseline_summaries", "build_index",
           "check_key", "classify", "correctness_mode", "device_run",
           "environment_line", "failed_verification",
           "harness_speed", "latest", "load_index", "operator_row", "read_baselines",
           "read_director", "ref_identity", "ref_identity_of", "rule_text", "same_operator",
           "summarize", "verdict_interval", "verification", "verification_reason", "verified_row",
           "verify_run",
           "with_devices"]
