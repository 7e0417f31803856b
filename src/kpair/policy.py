"""Validation policies: which bytes of a region may differ from the baseline, and by how much.

``Tolerance`` declares one half-open byte range of one region, the dtype its bytes hold and a
criterion (cosine, scalar_rtol, allclose, ulp). A ``Policy`` is the list of them for one harness
(file ``validation_policy.json``, contract in ``docs/format.md``); every byte outside a declared
range is compared byte-exactly. ``check`` judges ``expected`` (ref) against ``actual`` (opt)
region by region and returns a ``Verdict`` of ``RegionVerdict``s of ``RangeCheck``s: a
mismatch is a result, never an exception. ``PolicyError`` is raised only for a malformed policy
or one that does not fit the regions it is applied to.

Cosine similarity cannot see a one-sided systematic error (``actual = 1.005 * expected`` has
cosine 1), so every range check also reports the mean signed relative error and, for cosine,
the least-squares scale of actual onto expected.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from .errors import PolicyError
from .mutation import Mutation
from .snapshot.store import write_json_atomic

SCHEMA = "kpair.validation_policy"
SCHEMA_VERSION = 1

#: Little-endian storage dtype of each declared dtype; bfloat16 is stored as its uint16 bits.
DTYPES: dict[str, str] = {
    "float16": "<f2", "bfloat16": "<u2", "float32": "<f4", "float64": "<f8",
    "int8": "i1", "int16": "<i2", "int32": "<i4", "int64": "<i8",
    "uint8": "u1", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8",
}
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
#: Criterion -> (required parameters, optional parameters).
CRITERIA: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "cosine": (("min_cosine",), ()),
    "scalar_rtol": (("rtol",), ("atol",)),
    "allclose": (("atol", "rtol"), ()),
    "ulp": (("max_ulp",), ()),
}
PARAMS = ("min_cosine", "rtol", "atol", "max_ulp")
NAN_MODES = ("match", "fail")
_TOP_KEYS = {"schema", "schema_version", "default", "tolerances", "note", "mutations",
             "max_bias"}
_TOL_KEYS = {"region", "range", "dtype", "criterion", "nan", *PARAMS}
_FIRST_MISMATCHES = 8


def dtype_size(dtype: str) -> int:
    return np.dtype(DTYPES[dtype]).itemsize


def decode(data: bytes | np.ndarray, dtype: str) -> np.ndarray:
    """The values of little-endian ``data`` as float64 (bfloat16: its bits << 16 as float32)."""
    dt = DTYPES[dtype]
    raw = data.view(dt) if isinstance(data, np.ndarray) else np.frombuffer(data, dt)
    if dtype == "bfloat16":
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return raw.astype(np.float64)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def _no_extra(obj: dict, allowed: set[str], prefix: str, path: object) -> None:
    extra = sorted(set(obj) - allowed)
    if extra:
        raise PolicyError("unknown field (schema v1 does not define it)", path=path,
                          field=prefix + extra[0])


def _check_tolerance(t: Any, prefix: str = "", path: object = None) -> None:
    """Every constraint on one tolerance; ``t`` has Tolerance's attributes."""

    def fail(key: str, message: str) -> PolicyError:
        return PolicyError(message, path=path, field=prefix + key)

    if not isinstance(t.region, str) or not t.region:
        raise fail("region", "expected a non-empty string naming a snapshot region")
    if not (_is_int(t.start) and _is_int(t.end)) or t.start < 0 or t.end <= t.start:
        raise fail("range", f"expected [start, end) with 0 <= start < end, got "
                            f"[{t.start!r}, {t.end!r}]")
    if not isinstance(t.dtype, str) or t.dtype not in DTYPES:
        raise fail("dtype", f"unknown dtype {t.dtype!r} (one of {', '.join(DTYPES)})")
    if not isinstance(t.criterion, str) or t.criterion not in CRITERIA:
        raise fail("criterion", f"unknown criterion {t.criterion!r} (one of {', '.join(CRITERIA)})")
    if t.criterion in ("cosine", "ulp") and t.dtype not in FLOAT_DTYPES:
        raise fail("dtype", f"criterion {t.criterion} needs a float dtype, got {t.dtype}")
    size = dtype_size(t.dtype)
    if (t.end - t.start) % size:
        raise fail("range", f"length {t.end - t.start} is not a multiple of the {t.dtype} "
                            f"size ({size} bytes)")
    if t.criterion == "scalar_rtol" and t.end - t.start != size:
        raise fail("range", f"scalar_rtol needs exactly one {t.dtype} element ({size} bytes), "
                            f"got {t.end - t.start} bytes")
    required, optional = CRITERIA[t.criterion]
    for key in PARAMS:
        value = getattr(t, key)
        if value is None:
            if key in required:
                raise fail(key, f"missing (criterion {t.criterion} requires it)")
            continue
        if key not in required + optional:
            raise fail(key, f"not a parameter of criterion {t.criterion}")
        if key == "max_ulp":
            if not _is_int(value) or value < 0:
                raise fail(key, f"expected an integer >= 0, got {value!r}")
        elif not _is_num(value) or value < 0:
            raise fail(key, f"expected a finite number >= 0, got {value!r}")
        elif key == "min_cosine" and not 0 < value <= 1:
            raise fail(key, f"must be in (0, 1], got {value!r}")
    if not isinstance(t.nan, str) or t.nan not in NAN_MODES:
        raise fail("nan", f"expected 'match' or 'fail', got {t.nan!r}")


def _check_overlaps(tolerances: tuple[Tolerance, ...], path: object = None) -> None:
    spans = sorted((t.region, t.start, t.end, i) for i, t in enumerate(tolerances))
    for (r0, _, e0, i0), (r1, s1, _, i1) in zip(spans, spans[1:], strict=False):
        if r0 == r1 and s1 < e0:
            raise PolicyError(f"overlaps tolerances[{i0}] in region {r0!r}", path=path,
                              field=f"tolerances[{max(i0, i1)}].range")


@dataclass(frozen=True)
class Tolerance:
    """One declared byte range ``[start, end)`` of ``region``, read as ``dtype``, judged by
    ``criterion``. ``nan``: "match" (NaN where expected has NaN, nowhere else) or "fail"."""

    region: str
    start: int
    end: int
    dtype: str
    criterion: str
    min_cosine: float | None = None
    rtol: float | None = None
    atol: float | None = None
    max_ulp: int | None = None
    nan: str = "match"

    def __post_init__(self) -> None:
        _check_tolerance(self)

    def describe(self) -> str:
        c = self.criterion
        if c == "cosine":
            rule = f"cosine >= {self.min_cosine:g}"
        elif c == "scalar_rtol":
            rule = f"rel err <= {self.rtol:g}" + (f" (atol {self.atol:g})" if self.atol else "")
        elif c == "allclose":
            rule = f"|a-e| <= {self.atol:g} + {self.rtol:g}*|e|"
        else:
            rule = f"<= {self.max_ulp} ulp"
        nan = ", nan=fail" if self.nan == "fail" else ""
        return f"{rule} over {self.region}[{self.start}:{self.end}) as {self.dtype}{nan}"

    def to_json(self) -> dict:
        params = {k: getattr(self, k) for k in PARAMS if getattr(self, k) is not None}
        return {"region": self.region, "range": [self.start, self.end], "dtype": self.dtype,
                "criterion": self.criterion, **params, "nan": self.nan}

    @classmethod
    def from_json(cls, obj: Any, *, field: str = "", path: object = None) -> Tolerance:
        prefix = f"{field}." if field else ""
        if not isinstance(obj, dict):
            raise PolicyError("expected a JSON object", path=path, field=field or None)
        _no_extra(obj, _TOL_KEYS, prefix, path)
        for key in ("region", "range", "dtype", "criterion"):
            if key not in obj:
                raise PolicyError("missing", path=path, field=prefix + key)
        rng = obj["range"]
        if not isinstance(rng, list) or len(rng) != 2:
            raise PolicyError(f"expected [start, end], got {rng!r}", path=path,
                              field=prefix + "range")
        kw = {k: obj.get(k) for k in ("region", "dtype", "criterion", *PARAMS)}
        kw.update(start=rng[0], end=rng[1], nan=obj.get("nan", "match"))
        _check_tolerance(SimpleNamespace(**kw), prefix, path)
        return cls(**kw)


@dataclass(frozen=True)
class Policy:
    """The declared tolerances of one harness; everything else is compared byte-exactly.

    ``mutations`` ask for differential runs on changed inputs (``kpair.mutation``);
    ``max_bias`` (None: one machine epsilon of the range's dtype) is the mean signed relative
    error a cosine range may show before a significant one-sided error fails it."""

    tolerances: tuple[Tolerance, ...] = ()
    note: str = ""
    mutations: tuple[Mutation, ...] = ()
    max_bias: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tolerances", tuple(self.tolerances))
        object.__setattr__(self, "mutations", tuple(self.mutations))
        _check_overlaps(self.tolerances)
        if self.max_bias is not None and (not _is_num(self.max_bias) or self.max_bias < 0):
            raise PolicyError(f"expected a finite number >= 0, got {self.max_bias!r}",
                              field="max_bias")

    @classmethod
    def byte_exact(cls) -> Policy:
        return cls()

    @property
    def mode(self) -> str:
        return "tolerance" if self.tolerances else "byte-exact"

    def for_region(self, name: str) -> tuple[Tolerance, ...]:
        return tuple(t for t in self.tolerances if t.region == name)

    def validate_against(self, regions: dict[str, int], *, path: object = None) -> None:
        """Refuse tolerances naming a region not in ``regions`` (name -> size in bytes) or
        reaching past its end."""
        for i, t in enumerate(self.tolerances):
            if t.region not in regions:
                known = ", ".join(sorted(regions)) or "none"
                raise PolicyError(f"region {t.region!r} is not in the snapshot (regions: {known})",
                                  path=path, field=f"tolerances[{i}].region")
            if t.end > regions[t.region]:
                raise PolicyError(f"range [{t.start}, {t.end}) exceeds region {t.region!r} of "
                                  f"{regions[t.region]} bytes", path=path,
                                  field=f"tolerances[{i}].range")
        for i, m in enumerate(self.mutations):
            m.validate_against(regions, field=f"mutations[{i}]", path=path)

    def to_json(self) -> dict:
        out = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "default": "byte-exact",
               "tolerances": [t.to_json() for t in self.tolerances]}
        if self.mutations:
            out["mutations"] = [m.to_json() for m in self.mutations]
        if self.max_bias is not None:
            out["max_bias"] = self.max_bias
        if self.note:
            out["note"] = self.note
        return out

    @classmethod
    def from_json(cls, obj: Any, *, path: object = None) -> Policy:
        if not isinstance(obj, dict):
            raise PolicyError("expected a JSON object", path=path)
        _no_extra(obj, _TOP_KEYS, "", path)
        if obj.get("schema") != SCHEMA:
            raise PolicyError(f"expected {SCHEMA!r}, got {obj.get('schema')!r}", path=path,
                              field="schema")
        version = obj.get("schema_version")
        if not _is_int(version) or version != SCHEMA_VERSION:
            raise PolicyError(f"unsupported schema_version {version!r} (this kpair reads "
                              f"{SCHEMA_VERSION})", path=path, field="schema_version")
        if obj.get("default", "byte-exact") != "byte-exact":
            raise PolicyError(f"schema v1 only allows 'byte-exact', got {obj['default']!r}",
                              path=path, field="default")
        note = obj.get("note", "")
        if not isinstance(note, str):
            raise PolicyError("expected a string", path=path, field="note")
        items = obj.get("tolerances", [])
        if not isinstance(items, list):
            raise PolicyError("expected an array", path=path, field="tolerances")
        tols = tuple(Tolerance.from_json(v, field=f"tolerances[{i}]", path=path)
                     for i, v in enumerate(items))
        _check_overlaps(tols, path)
        muts = obj.get("mutations", [])
        if not isinstance(muts, list):
            raise PolicyError("expected an array", path=path, field="mutations")
        mutations = tuple(Mutation.from_json(v, field=f"mutations[{i}]", path=path)
                          for i, v in enumerate(muts))
        max_bias = obj.get("max_bias")
        if max_bias is not None and (not _is_num(max_bias) or max_bias < 0):
            raise PolicyError(f"expected a finite number >= 0, got {max_bias!r}", path=path,
                              field="max_bias")
        return cls(tols, note, mutations, max_bias)


def load_policy(path: str | Path) -> Policy:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise PolicyError(f"cannot read: {e.strerror or e}", path=path) from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise PolicyError(f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}",
                          path=path) from None
    return Policy.from_json(obj, path=path)


def save_policy(policy: Policy, path: str | Path) -> None:
    write_json_atomic(Path(path), policy.to_json())


def _plain(x: Any) -> Any:
    """JSON-safe copy: numpy scalars to Python, NaN/inf to "nan"/"inf"/"-inf"."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


@dataclass(frozen=True)
class RangeCheck:
    """One declared range, evaluated. ``detail``: element count, NaN/inf counts, the worst
    element (byte offset in the region, expected and actual values), mean signed rel. error."""

    tolerance: Tolerance
    passed: bool
    metric: str
    value: float
    threshold: float
    detail: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return _plain({"tolerance": self.tolerance.to_json(), "rule": self.tolerance.describe(),
                       "passed": self.passed, "metric": self.metric, "value": self.value,
                       "threshold": self.threshold, "detail": self.detail})


def _ordered_distance(e_bits: np.ndarray, a_bits: np.ndarray, width: int) -> np.ndarray:
    """ULP distance through the sign-magnitude -> ordered-integer mapping (+0 and -0 coincide)."""
    e_bits, a_bits = e_bits.astype(np.uint64), a_bits.astype(np.uint64)
    sign, mag = np.uint64(width - 1), np.uint64((1 << (width - 1)) - 1)
    es, em, as_, am = e_bits >> sign, e_bits & mag, a_bits >> sign, a_bits & mag
    same = np.maximum(em, am) - np.minimum(em, am)
    return np.where(es == as_, same, em + am)  # magnitudes < 2**63: the sum fits in uint64


def _metric(t: Tolerance, exp: np.ndarray, act: np.ndarray, fin: np.ndarray, ef: np.ndarray,
            af: np.ndarray, diff: np.ndarray) -> tuple[str, float, float, bool, int | None, dict]:
    """The criterion over the finite elements ``fin``: metric, value, threshold, passed, index
    of the worst element (into ``fin``) and extra detail."""
    if t.criterion == "cosine":
        ne, na = np.abs(ef).max(initial=0.0), np.abs(af).max(initial=0.0)
        worst = int(np.argmax(diff)) if diff.size else None
        if ne == 0 or na == 0:
            value = 1.0 if ne == na else 0.0
            return "cosine", value, t.min_cosine, value >= t.min_cosine, worst, {}
        en, an = ef / ne, af / na  # each scaled by its max |x|: no overflow, same cosine
        value = min(1.0, float(en @ an / (np.linalg.norm(en) * np.linalg.norm(an))))
        scale = float((af / ne) @ en / (en @ en))  # least squares actual ~ scale * expected
        return "cosine", value, t.min_cosine, value >= t.min_cosine, worst, {"scale": scale}
    if t.criterion == "ulp":
        size = dtype_size(t.dtype)
        dist = _ordered_distance(exp.view(f"<u{size}")[fin], act.view(f"<u{size}")[fin], 8 * size)
        worst = int(np.argmax(dist)) if dist.size else None
        top = int(dist[worst]) if dist.size else 0
        return "max_ulp", float(top), t.max_ulp, top <= t.max_ulp, worst, {}
    bound = (t.atol or 0.0) + t.rtol * np.abs(ef)
    ratio = np.where(bound > 0, diff / bound, np.where(diff == 0, 0.0, np.inf))
    ok = bool(np.all(diff <= bound))
    worst = int(np.argmax(ratio)) if ratio.size else None
    if t.criterion == "allclose":
        value = float(ratio[worst]) if ratio.size else 0.0
        return "max_abs_err_over_bound", value, 1.0, ok, worst, {}
    if not diff.size:  # scalar_rtol on a matched NaN or infinity
        return "rel_err", 0.0, t.rtol, ok, None, {}
    e0, d0 = abs(float(ef[0])), float(diff[0])
    rel = d0 / e0 if e0 else (0.0 if d0 == 0 else math.inf)
    return "rel_err", rel, t.rtol, ok, 0, {"abs_err": d0, "bound": float(bound[0])}


def _evaluate(t: Tolerance, exp: np.ndarray, act: np.ndarray) -> RangeCheck:
    e, a = decode(exp, t.dtype), decode(act, t.dtype)
    with np.errstate(all="ignore"):  # overflow to inf and 0/0 are expected and handled
        e_nan, a_nan = np.isnan(e), np.isnan(a)
        bad_nan = (e_nan != a_nan) if t.nan == "match" else (e_nan | a_nan)
        bad_inf = (np.isinf(e) | np.isinf(a)) & (e != a) & ~(e_nan | a_nan)
        fin = np.flatnonzero(np.isfinite(e) & np.isfinite(a))
        ef, af = e[fin], a[fin]
        diff = np.abs(af - ef)
        metric, value, threshold, ok, worst, extra = _metric(t, exp, act, fin, ef, af, diff)
        nz = ef != 0
        mean_rel = float(np.mean((af[nz] - ef[nz]) / ef[nz])) if nz.any() else None
    special = np.flatnonzero(bad_nan | bad_inf)
    if special.size:  # a NaN/inf failure outranks the metric's worst element
        idx, ok = int(special[0]), False
        value = math.inf if t.criterion == "scalar_rtol" else value
    else:
        idx = int(fin[worst]) if worst is not None else None
    detail = {
        "elements": int(e.size), "nan_expected": int(e_nan.sum()), "nan_actual": int(a_nan.sum()),
        "nan_mismatch": int(bad_nan.sum()), "inf_mismatch": int(bad_inf.sum()),
        "mean_signed_rel_err": mean_rel, "max_abs_err": float(diff.max(initial=0.0)), **extra,
    }
    if idx is not None:
        detail.update(worst_index=idx, worst_offset=t.start + idx * dtype_size(t.dtype),
                      expected=float(e[idx]), actual=float(a[idx]))
    return RangeCheck(t, bool(ok), metric, float(value), float(threshold), detail)


def _element(e8: np.ndarray, a8: np.ndarray, offset: int, dtype: str) -> dict:
    """The element of ``dtype`` containing byte ``offset`` (counted from the region start)."""
    size = dtype_size(dtype)
    start = offset // size * size
    if start + size > e8.size:
        return {}
    eb, ab = e8[start:start + size], a8[start:start + size]
    view = decode if dtype in FLOAT_DTYPES else (lambda b, d: b.view(DTYPES[d]))
    return {"element_offset": start, "dtype": dtype,
            "expected_bits": eb[::-1].tobytes().hex(), "actual_bits": ab[::-1].tobytes().hex(),
            "expected_value": view(eb, dtype)[0].item(), "actual_value": view(ab, dtype)[0].item()}


@dataclass(frozen=True)
class RegionVerdict:
    """One region judged. ``criterion``: "byte-exact" (no declared range) or "tolerance".
    ``mismatch`` (None when the bytes outside declared ranges agree): ``reason`` is "missing",
    "length" or "bytes"; for "bytes", the count and the first differing offsets."""

    region: str
    passed: bool
    criterion: str
    checks: tuple[RangeCheck, ...] = ()
    mismatch: dict | None = None

    def to_json(self) -> dict:
        return _plain({"region": self.region, "passed": self.passed, "criterion": self.criterion,
                       "checks": [c.to_json() for c in self.checks], "mismatch": self.mismatch})

    def reason(self) -> str:
        """Why this region failed, in one phrase ("" when it passed)."""
        m = self.mismatch
        if m and m["reason"] != "bytes":
            return "missing from actual" if m["reason"] == "missing" else (
                f"length differs (expected {m['expected_len']} bytes, got {m['actual_len']})")
        if m:
            f = m["first"][0]
            if "expected_bits" in f:
                what = (f"expected {f['expected_bits']} = {f['expected_value']}, "
                        f"got {f['actual_bits']} = {f['actual_value']}")
            else:
                what = f"expected {f['expected']}, got {f['actual']}"
            n = m["differing_bytes"]
            verb = "bytes differ" if n != 1 else "byte differs"
            return f"{n} {verb}, first at 0x{f['offset']:x} ({what})"
        for c in self.checks:
            if not c.passed:
                d = c.detail
                if d["nan_mismatch"] or d["inf_mismatch"]:
                    got = f"{d['nan_mismatch']} NaN and {d['inf_mismatch']} inf mismatches"
                else:
                    got = f"{c.metric} {c.value:.6g}"
                return f"{got}, rule {c.tolerance.describe()}"
        return ""


def check_region(name: str, expected: bytes, actual: bytes, tolerances: tuple = (), *,
                 dtype_hint: str | None = None) -> RegionVerdict:
    """Judge one region: declared ranges by their criterion, every other byte exactly.

    ``dtype_hint`` (the region's element type, when known) only decorates mismatch reports;
    an unknown hint is ignored."""
    tolerances = tuple(tolerances)
    criterion = "tolerance" if tolerances else "byte-exact"
    if not tolerances and isinstance(expected, bytes) and expected == actual:
        return RegionVerdict(name, True, criterion)  # a memcmp, not numpy over the region
    e8, a8 = np.frombuffer(expected, np.uint8), np.frombuffer(actual, np.uint8)
    if e8.size != a8.size:
        return RegionVerdict(name, False, criterion, (), {
            "reason": "length", "expected_len": int(e8.size), "actual_len": int(a8.size)})
    Policy(tolerances).validate_against({name: e8.size})  # and no overlaps
    covered = np.zeros(e8.size, dtype=bool)
    checks = []
    for t in tolerances:
        covered[t.start:t.end] = True
        checks.append(_evaluate(t, e8[t.start:t.end], a8[t.start:t.end]))
    differ = np.flatnonzero((e8 != a8) & ~covered)
    mismatch = None
    if differ.size:
        first, seen = [], set()
        for off in differ[:_FIRST_MISMATCHES * 8].tolist():  # 8 bytes: the widest dtype
            entry = {"offset": off, "expected": f"{e8[off]:02x}", "actual": f"{a8[off]:02x}"}
            if dtype_hint in DTYPES:
                entry.update(_element(e8, a8, off, dtype_hint))
                # One entry per differing element: its other bytes add nothing.
                if entry.get("element_offset") in seen:
                    continue
                seen.add(entry.get("element_offset"))
            first.append(entry)
            if len(first) == _FIRST_MISMATCHES:
                break
        mismatch = {"reason": "bytes", "differing_bytes": int(differ.size), "first": first}
    passed = mismatch is None and all(c.passed for c in checks)
    return RegionVerdict(name, passed, criterion, tuple(checks), mismatch)


@dataclass(frozen=True)
class Verdict:
    """The judgement of one opt run against ref under a policy."""

    passed: bool
    mode: str
    regions: tuple[RegionVerdict, ...]

    def summary(self) -> str:
        n = len(self.regions)
        failed = [r for r in self.regions if not r.passed]
        if failed:
            more = f" (+{len(failed) - 1} more failing)" if len(failed) > 1 else ""
            return f"FAIL: region {failed[0].region}: {failed[0].reason()}{more}"
        if self.mode == "byte-exact":
            return f"byte-exact: {n}/{n} regions identical"
        k = sum(len(r.checks) for r in self.regions)
        return (f"tolerance: {n}/{n} regions pass ({k} declared range{'s' * (k != 1)} within "
                f"tolerance, all other bytes identical)")

    def to_json(self) -> dict:
        return {"passed": self.passed, "mode": self.mode, "summary": self.summary(),
                "regions": [r.to_json() for r in self.regions]}


def check(policy: Policy, expected: dict[str, bytes], actual: dict[str, bytes], *,
          dtype_hints: dict[str, str] | None = None) -> Verdict:
    """Judge every region of ``expected``; one absent from ``actual`` fails. Regions only in
    ``actual`` are not judged. Raises PolicyError if the policy does not fit ``expected``."""
    policy.validate_against({k: np.frombuffer(v, np.uint8).size for k, v in expected.items()})
    hints = dtype_hints or {}
    verdicts = []
    for name, exp in expected.items():
        tols = policy.for_region(name)
        verdicts.append(check_region(name, exp, actual[name], tols, dtype_hint=hints.get(name))
                        if name in actual else RegionVerdict(
                            name, False, "tolerance" if tols else "byte-exact", (),
                            {"reason": "missing"}))
    return Verdict(all(v.passed for v in verdicts), policy.mode, tuple(verdicts))
