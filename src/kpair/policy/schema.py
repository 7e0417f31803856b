"""``validation_policy.json``: which bytes of a region may differ from the baseline, and how.

``Tolerance`` declares one half-open byte range ``[start, end)`` of one region, the dtype its
bytes hold and a criterion (cosine, scalar_rtol, allclose, ulp); ``Mutation``
(``kpair.policy.mutation``) asks for differential runs on changed inputs. A ``Policy`` is the
list of them for one harness; every byte outside a declared range is compared byte-exactly.
The JSON shape is ``PolicyDocument`` (strictly read through ``kpair.formats``); the rules that
tie fields together (a range that fits its dtype, parameters of its criterion, no overlaps)
are checked when a Tolerance or Policy is built, from JSON or from Python alike, and name the
field that breaks them. Judging lives in ``kpair.policy.judge``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

from ..dtypes import DTYPES, FLOAT_DTYPES, dtype_size
from ..errors import PolicyError
from ..formats import Record, check_version, convert, write
from .mutation import Mutation, MutationDoc

SCHEMA = "kpair.validation_policy"
SCHEMA_VERSION = 1
#: Criterion -> (required parameters, optional parameters).
CRITERIA: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "cosine": (("min_cosine",), ()),
    "scalar_rtol": (("rtol",), ("atol",)),
    "allclose": (("atol", "rtol"), ()),
    "ulp": (("max_ulp",), ()),
}
PARAMS = ("min_cosine", "rtol", "atol", "max_ulp")
NAN_MODES = ("match", "fail")


class ToleranceDoc(Record, omit_defaults=True):
    """One entry of ``tolerances`` as JSON spells it."""

    region: str
    range: tuple[int, int]
    dtype: str
    criterion: str
    min_cosine: float | None = None
    rtol: float | None = None
    atol: float | None = None
    max_ulp: int | None = None
    nan: str = "match"


class PolicyDocument(Record, omit_defaults=True):
    """``validation_policy.json`` (schema ``kpair.validation_policy`` v1). ``mutations``
    absent: kpair derives them; ``[]``: differential runs are off, by declaration."""

    schema: Literal["kpair.validation_policy"]
    schema_version: Literal[1]
    default: Literal["byte-exact"] = "byte-exact"
    tolerances: list[ToleranceDoc] = []
    mutations: list[MutationDoc] | None = None
    max_bias: float | None = None
    allow_loose: bool = False
    mutations_exact: bool = False
    note: str = ""


_INDEX_TAIL = re.compile(r"(\.range)\[\d+\]$")


def _convert(obj: Any, kind: type, path: object, field: str = "") -> Any:
    """Structural reading; an element of ``range`` is reported as the range itself."""
    try:
        return convert(obj, kind, path=path, error=PolicyError, field=field)
    except PolicyError as e:
        if e.field and _INDEX_TAIL.search(e.field):
            raise PolicyError(str(e).split(": ")[-1], path=path,
                              field=_INDEX_TAIL.sub(r"\1", e.field)) from None
        raise


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


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
    def from_doc(cls, doc: ToleranceDoc, *, field: str = "", path: object = None) -> Tolerance:
        kw = {k: getattr(doc, k) for k in ("region", "dtype", "criterion", "nan", *PARAMS)}
        kw.update(start=doc.range[0], end=doc.range[1])
        _check_tolerance(SimpleNamespace(**kw), f"{field}." if field else "", path)
        return cls(**kw)

    @classmethod
    def from_json(cls, obj: Any, *, field: str = "", path: object = None) -> Tolerance:
        return cls.from_doc(_convert(obj, ToleranceDoc, path, field), field=field, path=path)


@dataclass(frozen=True)
class Policy:
    """The declared tolerances of one harness; everything else is compared byte-exactly.

    ``mutations`` ask for differential runs on changed inputs (``kpair.policy.mutation``):
    None (not declared) lets kpair derive them from what ref reads, ``()`` turns them off.
    ``max_bias`` (None: one machine epsilon of the range's dtype) is the mean signed relative
    error a cosine range may show before a significant one-sided error fails it.
    ``allow_loose`` keeps tolerances that a constant output would meet (``kpair.policy.lint``);
    it needs a ``note`` saying why. ``mutations_exact`` keeps declared mutations exactly as
    written (else read-only regions they leave out get derived ones too); it needs a ``note``."""

    tolerances: tuple[Tolerance, ...] = ()
    note: str = ""
    mutations: tuple[Mutation, ...] | None = None
    max_bias: float | None = None
    allow_loose: bool = False
    mutations_exact: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "tolerances", tuple(self.tolerances))
        if self.mutations is not None:
            object.__setattr__(self, "mutations", tuple(self.mutations))
        _check_overlaps(self.tolerances)
        if self.max_bias is not None and (not _is_num(self.max_bias) or self.max_bias < 0):
            raise PolicyError(f"expected a finite number >= 0, got {self.max_bias!r}",
                              field="max_bias")
        if self.allow_loose and not self.note.strip():
            raise PolicyError("allow_loose needs a note saying why the loose tolerance is "
                              "right", field="note")
        if self.mutations_exact and not self.mutations:
            raise PolicyError("mutations_exact needs declared mutations to keep",
                              field="mutations_exact")
        if self.mutations_exact and not self.note.strip():
            raise PolicyError("mutations_exact needs a note saying why the regions the "
                              "mutations leave out may stay as captured", field="note")

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
        for i, m in enumerate(self.mutations or ()):
            m.validate_against(regions, field=f"mutations[{i}]", path=path)

    def to_json(self) -> dict:
        out = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "default": "byte-exact",
               "tolerances": [t.to_json() for t in self.tolerances]}
        if self.mutations is not None:
            out["mutations"] = [m.to_json() for m in self.mutations]
        if self.max_bias is not None:
            out["max_bias"] = self.max_bias
        if self.allow_loose:
            out["allow_loose"] = True
        if self.mutations_exact:
            out["mutations_exact"] = True
        if self.note:
            out["note"] = self.note
        return out

    @classmethod
    def from_json(cls, obj: Any, *, path: object = None) -> Policy:
        check_version(obj, SCHEMA, SCHEMA_VERSION, path=path, error=PolicyError)
        doc = _convert(obj, PolicyDocument, path)
        tols = tuple(Tolerance.from_doc(t, field=f"tolerances[{i}]", path=path)
                     for i, t in enumerate(doc.tolerances))
        _check_overlaps(tols, path)
        mutations = None if doc.mutations is None else tuple(
            Mutation.from_doc(m, field=f"mutations[{i}]", path=path)
            for i, m in enumerate(doc.mutations))
        if doc.max_bias is not None and (not _is_num(doc.max_bias) or doc.max_bias < 0):
            raise PolicyError(f"expected a finite number >= 0, got {doc.max_bias!r}", path=path,
                              field="max_bias")
        try:
            return cls(tols, doc.note, mutations, doc.max_bias, doc.allow_loose,
                       doc.mutations_exact)
        except PolicyError as e:
            raise PolicyError(str(e).split(": ", 1)[-1], path=path, field=e.field) from None


def load_policy(path: str | Path) -> Policy:
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise PolicyError(f"cannot read: {getattr(e, 'strerror', None) or e}",
                          path=path) from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise PolicyError(f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}",
                          path=path) from None
    return Policy.from_json(obj, path=path)


def save_policy(policy: Policy, path: str | Path, *, replace: bool = True) -> None:
    write(Path(path), policy.to_json(), replace=replace)


