"""Mutations: how a policy asks for differential runs on changed inputs.

A ``Mutation`` names one input region (or a byte range of it), the dtype of its elements and
how to change them: ``permute`` (the same values in another order), ``resample`` (values
drawn with replacement from the region's own values: the observed distribution) or
``sparse`` (only ``SPARSE_ELEMENTS`` elements at secret positions change: floats take values
drawn from elsewhere in the region, other types swap values among those positions). All keep
every value one the kernel has already seen, so no NaN, no out-of-range index appears that
the captured input did not hold. A sparse input is the captured one almost everywhere: a
kernel that keys a memo or a specialization on a sample of input elements sees the same key
and gives the captured answer, which is wrong there. The differential check
(``kpair.trust.audit``) runs ref and opt on ``count`` such inputs and judges opt against ref
under the policy's own criteria: a kernel that hard-codes the captured answer, or returns a
cached one, fails there. ``Mutation.patch`` makes the fresh input of every timed block: a
few elements changed in every window of the range (``PATCH_WINDOW``).

Declared in ``validation_policy.json`` under ``mutations`` (contract in ``docs/format.md``);
``MutationDoc`` is the JSON shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from ..dtypes import DTYPES, FLOAT_DTYPES, dtype_size
from ..errors import PolicyError
from ..formats import Record, convert

METHODS = ("permute", "resample", "sparse")
#: Elements a sparse mutation changes (and a fresh timed input, in every window).
SPARSE_ELEMENTS = 4
#: A fresh timed input (``Mutation.patch``) changes a run of SPARSE_ELEMENTS elements in every
#: window of this many bytes of a sparse-mutated range, up to PATCH_RUNS runs (wider windows
#: past that): spread so that a kernel which keeps its last answer and recomputes only what
#: the changed elements touch (a delta memo) has every row of a matrix to redo.
PATCH_WINDOW = 256
PATCH_RUNS = 4096
MAX_COUNT = 64
#: Up to this many elements a mutation draws uniformly from every permutation (or sample);
#: a larger range is cut into tiles of TILE elements, and the tiles are shuffled (or drawn
#: with replacement) and the elements inside every tile permuted alike: the same kind of
#: change at the cost of a memory copy (a uniform shuffle of 4 Mi floats costs ~0.3 s).
EXACT = 1 << 16
TILE = 64
#: Derived whole-region runs: as many as fit in this many mutated bytes, 1 to DERIVED_RUNS.
#: A candidate that reorders floating-point sums (a retuned reduction) can match ref's bytes
#: on one input by chance and miss on the next; on the H200 one did on half of its inputs.
DERIVED_BYTES = 32 << 20
DERIVED_RUNS = 4


def _draw(values: np.ndarray, rng: np.random.Generator, out: np.ndarray, replace: bool
          ) -> None:
    """``values`` reordered (``replace``: drawn with replacement) into ``out``; past
    ``EXACT`` elements tile by tile (see ``EXACT``): the tiles gathered into a scratch
    buffer, then every tile's elements gathered into ``out`` (two passes at memory speed)."""
    n = values.size
    pick = (lambda k: rng.integers(0, k, k)) if replace else rng.permutation
    if n <= EXACT:
        np.take(values, pick(n), out=out)
        return
    tiles, whole = n // TILE, n // TILE * TILE
    rows = np.take(values[:whole].reshape(tiles, TILE), pick(tiles), axis=0)
    np.take(rows, rng.permutation(TILE), axis=1, out=out[:whole].reshape(tiles, TILE))
    out[whole:] = values[rng.integers(0, n, n - whole)] if replace else \
        values[whole:][rng.permutation(n - whole)]


def _sparse(values: np.ndarray, rng: np.random.Generator, swap: bool
            ) -> tuple[np.ndarray, np.ndarray]:
    """Where and what ``SPARSE_ELEMENTS`` elements of ``values`` become, at random
    positions: drawn from other positions (floats), or swapped among themselves (others: a
    swap keeps every value's count, so indices stay a valid set). A few tries find positions
    whose values differ; a region of one repeated value cannot change (nothing changes)."""
    n = values.size
    k = min(SPARSE_ELEMENTS, n)
    for _ in range(8):
        at = rng.choice(n, k, replace=False)
        new = values[at][rng.permutation(k)] if swap else values[rng.integers(0, n, k)]
        if (new.view(np.uint8) != values[at].view(np.uint8)).any():
            return at, new
    return at[:0], new[:0]


@dataclass(frozen=True)
class Patch:
    """Writes of ``size`` bytes each over a range: run i is ``data[i*size:(i+1)*size]`` at
    byte offset ``offsets[i]`` of the region (ascending, never overlapping)."""

    offsets: np.ndarray
    size: int
    data: bytes

    def writes(self, base: int = 0) -> list[tuple[int, bytes]]:
        """The runs as (``base`` + offset, bytes) pairs."""
        return [(base + int(o), self.data[i * self.size:(i + 1) * self.size])
                for i, o in enumerate(self.offsets)]


class MutationDoc(Record, omit_defaults=True):
    """One entry of a policy's ``mutations`` as JSON spells it."""

    region: str
    dtype: str
    method: str
    count: int = 2
    range: tuple[int, int | None] | None = None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check(m: Any, prefix: str = "", path: object = None) -> None:
    def fail(key: str, message: str) -> PolicyError:
        return PolicyError(message, path=path, field=prefix + key)

    if not isinstance(m.region, str) or not m.region:
        raise fail("region", "expected a non-empty string naming a snapshot region")
    if not isinstance(m.dtype, str) or m.dtype not in DTYPES:
        raise fail("dtype", f"unknown dtype {m.dtype!r} (one of {', '.join(DTYPES)})")
    if not isinstance(m.method, str) or m.method not in METHODS:
        raise fail("method", f"unknown method {m.method!r} (one of {', '.join(METHODS)})")
    if not _is_int(m.count) or not 1 <= m.count <= MAX_COUNT:
        raise fail("count", f"expected an integer in [1, {MAX_COUNT}], got {m.count!r}")
    if not _is_int(m.start) or m.start < 0 or not (m.end is None or _is_int(m.end)) \
            or (m.end is not None and m.end <= m.start):
        raise fail("range", f"expected [start, end) with 0 <= start < end, got "
                            f"[{m.start!r}, {m.end!r}]")
    size = dtype_size(m.dtype)
    if m.end is not None and (m.end - m.start) % size:
        raise fail("range", f"length {m.end - m.start} is not a multiple of the {m.dtype} "
                            f"size ({size} bytes)")


@dataclass(frozen=True)
class Mutation:
    """Change ``region[start:end)`` (``end`` None: the whole region from ``start``), read as
    ``dtype``, by ``method``, in each of ``count`` differential runs."""

    region: str
    dtype: str
    method: str
    count: int = 2
    start: int = 0
    end: int | None = None

    def __post_init__(self) -> None:
        _check(self)

    def span(self, region_size: int) -> tuple[int, int]:
        """The byte range mutated in a region of ``region_size`` bytes (whole elements)."""
        size = dtype_size(self.dtype)
        end = self.end if self.end is not None else \
            self.start + (region_size - self.start) // size * size
        return self.start, end

    def apply(self, data: bytes | bytearray, rng: np.random.Generator) -> bytearray:
        """``data`` (the region's bytes) with the declared range mutated, written into one
        new buffer (regions can be hundreds of MB: no second copy)."""
        start, end = self.span(len(data))
        dtype = np.dtype(DTYPES[self.dtype])
        count = (end - start) // dtype.itemsize
        values = np.frombuffer(data, dtype, count=count, offset=start)
        out = bytearray(len(data))
        whole, view = memoryview(data).cast("B"), memoryview(out)
        view[:start], view[end:] = whole[:start], whole[end:]
        mutated = np.frombuffer(out, dtype, count=count, offset=start)
        if self.method != "sparse":
            _draw(values, rng, mutated, replace=self.method == "resample")
            return out
        mutated[:] = values
        at, new = _sparse(values, rng, swap=self.dtype not in FLOAT_DTYPES)
        mutated[at] = new
        return out

    def patch(self, data: bytes, rng: np.random.Generator) -> Patch | None:
        """A fresh change of ``data``'s range spread over all of it: in every window of
        ``PATCH_WINDOW`` bytes (wider past ``PATCH_RUNS`` windows), ``SPARSE_ELEMENTS``
        consecutive elements at a random place, changed as ``sparse`` changes them (floats:
        values from elsewhere in the range, one slice of it from a random place, rotated;
        other types: the run's own values in another order). None where a few tries change
        nothing."""
        start, end = self.span(len(data))
        dtype = np.dtype(DTYPES[self.dtype])
        values = np.frombuffer(data, dtype, count=(end - start) // dtype.itemsize,
                               offset=start)
        n = values.size
        k = min(SPARSE_ELEMENTS, n)
        if not k:
            return None
        runs = min(max(1, -(-(end - start) // PATCH_WINDOW)), PATCH_RUNS, n // k)
        lo = np.arange(runs, dtype=np.int64) * n // runs      # window w: [lo[w], lo[w + 1])
        room = np.append(lo[1:], n) - lo - k + 1               # where a run of k fits in it
        at = (lo + (rng.random(runs) * room).astype(np.int64))[:, None] + np.arange(k)
        old = values[at]
        for _ in range(8):
            if self.dtype in FLOAT_DTYPES:   # a slice from a random place: no random gather
                s, m = int(rng.integers(0, n - runs * k + 1)), runs * k
                new = np.roll(values[s:s + m], int(rng.integers(0, m))).reshape(runs, k)
            else:
                new = np.take_along_axis(old, rng.random((runs, k)).argsort(axis=1), axis=1)
            if new.tobytes() != old.tobytes():
                return Patch(start + at[:, 0] * dtype.itemsize, k * dtype.itemsize,
                             new.tobytes())
        return None

    def sparse(self) -> Mutation:
        """The same range changed at a few secret positions only."""
        return Mutation(self.region, self.dtype, "sparse", self.count, self.start, self.end)

    def describe(self) -> str:
        rng = "" if self.start == 0 and self.end is None else f"[{self.start}:{self.end})"
        return f"{self.method} {self.region}{rng} as {self.dtype}"

    def to_json(self) -> dict:
        out: dict[str, Any] = {"region": self.region, "dtype": self.dtype,
                               "method": self.method, "count": self.count}
        if self.start or self.end is not None:
            out["range"] = [self.start, self.end]
        return out

    @classmethod
    def from_doc(cls, doc: MutationDoc, *, field: str = "", path: object = None) -> Mutation:
        start, end = doc.range if doc.range is not None else (0, None)
        kw = {"region": doc.region, "dtype": doc.dtype, "method": doc.method,
              "count": doc.count, "start": start, "end": end}
        _check(SimpleNamespace(**kw), f"{field}." if field else "", path)
        return cls(**kw)

    @classmethod
    def from_json(cls, obj: Any, *, field: str = "", path: object = None) -> Mutation:
        doc = convert(obj, MutationDoc, path=path, error=PolicyError, field=field)
        return cls.from_doc(doc, field=field, path=path)

    def validate_against(self, regions: dict[str, int], *, field: str, path: object = None
                         ) -> None:
        if self.region not in regions:
            known = ", ".join(sorted(regions)) or "none"
            raise PolicyError(f"region {self.region!r} is not in the snapshot (regions: "
                              f"{known})", path=path, field=f"{field}.region")
        start, end = self.span(regions[self.region])
        if end > regions[self.region] or end <= start:
            raise PolicyError(f"range [{start}, {end}) does not fit region {self.region!r} of "
                              f"{regions[self.region]} bytes", path=path, field=f"{field}.range")


def derive(regions: Sequence[tuple[str, int, str | None]], inputs: Sequence[str],
           holds_pointers: Sequence[str]) -> tuple[Mutation, ...]:
    """The mutations kpair runs when a policy declares none.

    ``regions``: (name, size, dtype hint) of every region; ``inputs``: those whose
    values ref reads (only reads, or updates in place);
    ``holds_pointers``: those with pointer words in them (never mutated: moving a pointer
    moves what the kernel reads, not a value). Floats get one resampled run; integers and
    untyped bytes (indices, sizes, flags) one run permuted within the region, so every value
    stays one the kernel was given. Small inputs get more whole-region runs (``count``): as
    many as fit in ``DERIVED_BYTES`` of mutated regions, up to ``DERIVED_RUNS``. The two sparse
    runs the audit adds after them (every mutated range with a few elements changed) are
    differential runs too.
    """
    out = []
    for name, size, hint in regions:
        if name not in inputs or name in holds_pointers:
            continue
        # Untyped: the widest word that divides the region, so no element of any type up to
        # 8 bytes is split (an int64 index keeps both halves together).
        dtype = hint if hint in DTYPES else next(
            d for w, d in ((8, "uint64"), (4, "uint32"), (2, "uint16"), (1, "uint8"))
            if size % w == 0)
        if size // dtype_size(dtype) < 2:
            continue  # one element: no other order, no other sample
        out.append((name, dtype, size))
    total = sum(size for _, _, size in out)
    count = max(1, min(DERIVED_RUNS, DERIVED_BYTES // max(total, 1)))
    return tuple(Mutation(name, dtype, "resample" if dtype in FLOAT_DTYPES else "permute",
                          count) for name, dtype, _ in out)


def completed(declared: Sequence[Mutation], derived: Sequence[Mutation]
              ) -> tuple[tuple[Mutation, ...], list[str]]:
    """The declared mutations, then the ``derived`` ones of every region no declared mutation
    names (a read-only region left out would never vary: a kernel could take it for a
    constant, memoise or lower it), and the names of those regions."""
    named = {m.region for m in declared}
    extra = [m for m in derived if m.region not in named]
    return (*declared, *extra), list(dict.fromkeys(m.region for m in extra))
