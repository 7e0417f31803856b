"""Judging: opt's regions against ref's under a policy, as a verdict (never an exception).

``check`` judges ``expected`` (ref) against ``actual`` (opt) region by region and returns a
``Verdict`` of ``RegionVerdict``s of ``RangeCheck``s. Declared ranges are judged by their
criterion, every other byte exactly. ``PolicyError`` is raised only for a policy that does not
fit the regions it is applied to.

Cosine similarity cannot see a one-sided systematic error (``actual = 1.005 * expected`` has
cosine 1), so every range check also reports the mean signed relative error and, for cosine,
the least-squares scale of actual onto expected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..dtypes import DTYPES, FLOAT_DTYPES, decode, dtype_size
from .schema import Policy, Tolerance

_FIRST_MISMATCHES = 8


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
    if not tolerances and isinstance(expected, (bytes, bytearray)) \
            and isinstance(actual, (bytes, bytearray)) and expected == actual:
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


#: Elements per slice of a quick test (a few MiB of float64 temporaries, reused from cache).
_SLICE = 1 << 18
#: How far above its threshold a quick cosine of n elements must be: n float64 roundings
#: (2**-53 each) bound how far the sums of ``passes`` and of ``check`` (another order, another
#: scaling) can differ; this floor covers what is left.
_COSINE_MARGIN = 1e-12


def _finite(raw: np.ndarray, dtype: str) -> bool:
    if dtype == "bfloat16":   # raw: the bits; exponent all ones is an infinity or a NaN
        return bool(((raw & 0x7F80) != 0x7F80).all())
    return dtype not in FLOAT_DTYPES or bool(np.isfinite(raw).all())


def _range_passes(t: Tolerance, exp: np.ndarray, act: np.ndarray) -> bool:
    """Whether ``check`` certainly passes range ``t``: every element finite in both, and the
    criterion met (cosine with a margin for rounding; allclose, scalar_rtol and ulp by the
    same float64 or integer comparisons ``_metric`` makes), in slices that stay in cache."""
    dt = DTYPES[t.dtype]
    e_raw, a_raw = exp.view(dt), act.view(dt)
    if not (_finite(e_raw, t.dtype) and _finite(a_raw, t.dtype)):
        return False
    ee = aa = ea = 0.0
    for i in range(0, e_raw.size, _SLICE):
        e, a = e_raw[i:i + _SLICE], a_raw[i:i + _SLICE]
        if t.criterion == "ulp":
            size = dtype_size(t.dtype)
            dist = _ordered_distance(e.view(f"<u{size}"), a.view(f"<u{size}"), 8 * size)
            if dist.size and int(dist.max()) > t.max_ulp:
                return False
            continue
        e, a = decode(e, t.dtype), decode(a, t.dtype)
        if t.criterion == "cosine":
            ee, aa, ea = ee + float(e @ e), aa + float(a @ a), ea + float(e @ a)
            continue
        a -= e
        np.abs(a, out=a)   # the difference
        np.abs(e, out=e)
        e *= t.rtol
        e += t.atol or 0.0   # the bound
        if not bool((a <= e).all()):
            return False
    if t.criterion == "cosine":
        with np.errstate(all="ignore"):
            value = ea / math.sqrt(ee * aa) if ee > 0 and aa > 0 else math.nan
        margin = _COSINE_MARGIN + 2 * e_raw.size * 2.0 ** -53
        return math.isfinite(value) and value >= t.min_cosine + margin
    return True


def passes(policy: Policy, expected: dict[str, bytes], actual: dict[str, bytes]) -> bool:
    """A quick test that ``check`` would pass: True only where it certainly would; False
    means "ask ``check``" (which also says why). Bytes outside declared ranges are compared
    as bytes; a declared range passes only with every element finite and its criterion met
    (``_range_passes``). About ten times faster than ``check`` on a large float range: the
    judge of every timed block of a tolerance harness."""
    for name, exp in expected.items():
        act = actual.get(name)
        if act is None or len(act) != len(exp):
            return False
        e, a = np.frombuffer(exp, np.uint8), np.frombuffer(act, np.uint8)
        at = 0
        for t in sorted(policy.for_region(name), key=lambda t: t.start):
            if not np.array_equal(e[at:t.start], a[at:t.start]) or \
                    not _range_passes(t, e[t.start:t.end], a[t.start:t.end]):
                return False
            at = t.end
        if not np.array_equal(e[at:], a[at:]):
            return False
    return True


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
