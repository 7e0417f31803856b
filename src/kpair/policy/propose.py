"""A tolerance policy from ref-against-opt differences (``kpair pair --propose-policy``).

Fused or reordered code rounds differently from the sequence it replaces, so a candidate
is judged under a tolerance; this module proposes the tightest one the observed runs need.
``Observed`` reduces runs as they come: for every run (ref and opt on the same input: the
captured one or a mutated one) and every float range (a region's declared output spans, else
the whole region) it keeps the largest |opt - ref|, the largest relative error, the worst
element, and for every rtol of a grid (0, then the dtype's epsilon times powers of
10^(1/4) up to the ceiling's rtol) the smallest atol under which every element passed,
``max(|opt - ref| - rtol * |ref|)``. Memory is that of one run, whatever the run count.

``propose`` picks, per range that differed, the grid point whose allclose bound
``margin * (atol + rtol * |ref|)`` is smallest on average over the observed values, so every
observed element passes with ``margin`` to spare (a smaller margin where only that fits
under the ceiling, said in the notes). Ranges that never differed stay byte-exact. It refuses
(``ToleranceOverCeiling``, exit 4), naming the region and the measured error, when even the
ceiling (KernelBench's atol = rtol = 1e-2 by default) fails an observed element, when a NaN
or infinity appears on one side only, when a non-float region or one the range does not
write differs, or when bytes differ outside a region's declared outputs. Pure: no device.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..dtypes import EPS, FLOAT_DTYPES, decode, dtype_size
from ..errors import KpairError
from .schema import Policy, Tolerance

#: KernelBench's own check: torch.allclose(out, ref, atol=1e-2, rtol=1e-2).
CEILING = (1e-2, 1e-2)
MARGIN = 4.0
#: Grid steps per decade of rtol.
STEPS = 4
#: Elements decoded at a time (float64 copies of ref's and opt's: 64 MiB each).
CHUNK = 1 << 23


class ToleranceOverCeiling(KpairError):
    """The candidate differs from ref more than any policy under the ceiling allows (or in a
    way no tolerance covers): exit 4, one line naming the region and the measured error."""

    exit_code = 4


@dataclass(frozen=True)
class RegionSpec:
    """One region as the proposal sees it: ``spans`` are the byte ranges a tolerance may
    cover (its declared output spans, else the whole region in whole elements); ``output``
    whether the range writes it (role out/inout, or ref changed it)."""

    name: str
    size: int
    dtype: str | None
    output: bool
    spans: tuple[tuple[int, int], ...] = ()

    def tolerable(self) -> tuple[tuple[int, int], ...]:
        if self.dtype not in FLOAT_DTYPES:
            return ()
        if self.spans:
            return self.spans
        es = dtype_size(self.dtype)
        return ((0, self.size // es * es),) if self.size >= es else ()


def rtol_grid(dtype: str, max_rtol: float) -> np.ndarray:
    """0, then ``EPS[dtype] * 10**(k / STEPS)`` below ``max_rtol``, then ``max_rtol``."""
    eps = EPS[dtype]
    points = [0.0]
    k = 0
    while eps * 10 ** (k / STEPS) < max_rtol:
        points.append(eps * 10 ** (k / STEPS))
        k += 1
    points.append(max_rtol)
    return np.array(points)


@dataclass
class _Range:
    """The running reduction of one float range [start, end) of a region."""

    region: str
    start: int
    end: int
    dtype: str
    grid: np.ndarray
    need: np.ndarray = field(init=False)
    runs_differing: int = 0
    elements_differing: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    worst: tuple | None = None   # (run label, byte offset, ref value, opt value)
    special: tuple | None = None  # a NaN/inf on one side: (run label, offset, ref, opt)
    sum_abs: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.need = np.full(self.grid.size, -np.inf)

    def add(self, label: str, want: bytes, got: bytes) -> None:
        es = dtype_size(self.dtype)
        n = (self.end - self.start) // es
        w8, g8 = np.frombuffer(want, np.uint8), np.frombuffer(got, np.uint8)
        nz = 0
        for lo in range(0, n, CHUNK):   # float64 copies of one chunk at a time
            at = self.start + lo * es
            hi = at + min(CHUNK, n - lo) * es
            nz += self._chunk(label, at, decode(w8[at:hi].copy(), self.dtype),
                              decode(g8[at:hi].copy(), self.dtype))
        if nz:
            self.runs_differing += 1
            self.elements_differing = max(self.elements_differing, nz)

    def _chunk(self, label: str, at: int, w: np.ndarray, g: np.ndarray) -> int:
        """Fold in the elements from byte ``at`` on; how many of them differ."""
        es = dtype_size(self.dtype)
        with np.errstate(all="ignore"):
            wn, gn = np.isnan(w), np.isnan(g)
            bad = (wn != gn) | ((np.isinf(w) | np.isinf(g)) & (w != g) & ~(wn | gn))
            fin = np.isfinite(w) & np.isfinite(g)
            aw = np.abs(w[fin])
            self.sum_abs += float(aw.sum())
            self.count += int(aw.size)
            d = np.abs(g[fin] - w[fin])
        if bad.any() and self.special is None:
            i = int(np.flatnonzero(bad)[0])
            self.special = (label, at + i * es, float(w[i]), float(g[i]))
        nz = int(np.count_nonzero(d))
        if not nz:
            return 0
        k = int(np.argmax(d))
        if d[k] > self.max_abs:
            idx = int(np.flatnonzero(fin)[k])
            self.max_abs = float(d[k])
            self.worst = (label, at + idx * es, float(w[idx]), float(g[idx]))
        with np.errstate(all="ignore"):
            rel = np.where(aw > 0, d / aw, np.where(d > 0, np.inf, 0.0))
        self.max_rel = max(self.max_rel, float(rel.max(initial=0.0)))
        for i, r in enumerate(self.grid):
            self.need[i] = max(self.need[i], float((d - r * aw).max(initial=0.0)))
        return nz

    @property
    def differs(self) -> bool:
        return self.runs_differing > 0 or self.special is not None

    def measured(self) -> str:
        s = f"max |opt-ref| {self.max_abs:.3g}, max relative error {self.max_rel:.3g}"
        if self.worst is not None:
            label, off, w, g = self.worst
            s += f" (worst at byte {off}, {label}: ref {w:.6g}, opt {g:.6g})"
        return s


class Observed:
    """What ref and opt disagree on over runs, reduced as they come (see the module doc)."""

    def __init__(self, regions: Sequence[RegionSpec], *, max_rtol: float = CEILING[1]):
        self.specs = {r.name: r for r in regions}
        self.runs: list[str] = []
        self.ranges: dict[str, list[_Range]] = {
            r.name: [_Range(r.name, s, e, r.dtype, rtol_grid(r.dtype, max_rtol))
                     for s, e in r.tolerable()] for r in regions}
        #: region -> (run label, first differing byte, last differing byte + 1) where bytes
        #: differ that no tolerance may cover (outside its spans, or a non-float region).
        self.foreign: dict[str, tuple[str, int, int]] = {}
        self.differing: set[str] = set()

    def add(self, label: str, want: Mapping[str, bytes], got: Mapping[str, bytes]) -> None:
        """Fold in one run: ref's regions ``want`` and opt's ``got`` on the same input."""
        self.runs.append(label)
        for name in self.specs:
            a, b = want[name], got[name]
            if a == b:
                continue
            self.differing.add(name)
            x, y = np.frombuffer(a, np.uint8), np.frombuffer(b, np.uint8)
            diff = x != y
            for rg in self.ranges[name]:
                rg.add(label, a, b)
                diff[rg.start:rg.end] = False
            where = np.flatnonzero(diff)
            if where.size and name not in self.foreign:
                self.foreign[name] = (label, int(where[0]), int(where[-1]) + 1)


@dataclass(frozen=True)
class Proposal:
    """What ``propose`` decided: the policy, one note per region that differed, and per
    tolerance the measured errors (``details``: JSON-ready)."""

    policy: Policy
    notes: tuple[str, ...]
    details: tuple[dict, ...]

    def to_json(self) -> dict:
        return {"policy": self.policy.to_json(), "notes": list(self.notes),
                "regions": list(self.details)}


def _up(x: float) -> float:
    """``x`` rounded up to 3 significant digits (never below it)."""
    if x <= 0 or not math.isfinite(x):
        return float(x)
    e = math.floor(math.log10(x)) - 2
    return max(float(f"{math.ceil(x / 10 ** e) * 10 ** e:.3g}"), x)


def _choose(rg: _Range, margin: float, max_atol: float, max_rtol: float
            ) -> tuple[float, float, float] | None:
    """(atol, rtol, margin used) of the tightest allclose every observed element passes,
    ``margin`` times wider than needed; where no grid point fits under the ceiling with the
    margin, the tightest one that does with a smaller one (at least 1). None: none fits."""
    mean = rg.sum_abs / rg.count if rg.count else 0.0
    for strict in (True, False):
        best = None
        for r, need in zip(rg.grid, rg.need, strict=True):
            r, need = float(r), max(float(need), 0.0)
            if r > max_rtol or need > max_atol:
                continue   # not even the observed elements pass here
            atol, rtol = _up(margin * need), _up(margin * r)
            if atol > max_atol or rtol > max_rtol:
                if strict:
                    continue
                atol, rtol = min(atol, max_atol), min(rtol, max_rtol)
            used = min(atol / need if need else math.inf, rtol / r if r else math.inf,
                       margin)
            score = atol + rtol * mean
            if best is None or score < best[0]:
                best = (score, atol, rtol, used)
        if best is not None:
            return best[1], best[2], best[3]
    return None


def propose(observed: Observed, *, margin: float = MARGIN,
            ceiling: tuple[float, float] = CEILING, base: Policy | None = None,
            how: str = "") -> Proposal:
    """The tightest policy every run of ``observed`` passes (see the module doc). ``base``:
    its mutations, ``max_bias`` and ``mutations_exact`` are kept (its tolerances are
    replaced: every region was measured). ``how``: how the runs were made, for the note.
    Raises ``ToleranceOverCeiling`` where no tolerance under ``ceiling`` (atol, rtol) fits."""
    max_atol, max_rtol = ceiling
    if not observed.runs:
        raise ValueError("no runs to propose a policy from")
    n = len(observed.runs)
    for name in sorted(observed.differing):
        spec = observed.specs[name]
        if not spec.output:
            raise ToleranceOverCeiling(
                f"opt changes region {name!r}, which the range does not write (an input): no "
                "tolerance is proposed there")
        if name in observed.foreign:
            label, lo, hi = observed.foreign[name]
            why = (f"outside its declared outputs, bytes [{lo}, {hi}) ({label})" if spec.spans
                   else f"in bytes [{lo}, {hi}) ({label}), and it is not a float region "
                   f"({spec.dtype or 'element type unknown'})")
            raise ToleranceOverCeiling(f"opt differs from ref in region {name!r} {why}: no "
                                       "tolerance is proposed there")
    tols, notes, details, summary = [], [], [], []
    for name, ranges in observed.ranges.items():
        for rg in ranges:
            if not rg.differs:
                continue
            where = f"region {name!r}[{rg.start}:{rg.end}) as {rg.dtype}"
            if rg.special is not None:
                label, off, w, g = rg.special
                raise ToleranceOverCeiling(
                    f"{where}: opt gives {g!r} where ref gives {w!r} (byte {off}, {label}): "
                    "a NaN or infinity on one side is no rounding difference")
            chosen = _choose(rg, margin, max_atol, max_rtol)
            if chosen is None:
                need = max(float(rg.need[-1]), 0.0)
                raise ToleranceOverCeiling(
                    f"{where}: {rg.measured()}; at rtol {max_rtol:g} it needs atol "
                    f"{need:.3g}, over the ceiling (atol {max_atol:g}, rtol {max_rtol:g})")
            atol, rtol, used = chosen
            tol = Tolerance(name, rg.start, rg.end, rg.dtype, "allclose", atol=atol, rtol=rtol)
            tols.append(tol)
            tight = "" if used == margin else \
                f" (margin {used:.3g}, not {margin:g}: the ceiling allows no more)"
            notes.append(f"{where}: differs in {rg.runs_differing} of {n} runs, "
                         f"{rg.measured()}; {tol.describe()}{tight}")
            summary.append(f"{name}: max abs {rg.max_abs:.3g}, max rel {rg.max_rel:.3g}")
            details.append({"region": name, "range": [rg.start, rg.end], "dtype": rg.dtype,
                            "runs_differing": rg.runs_differing,
                            "max_abs_err": rg.max_abs, "max_rel_err": _finite(rg.max_rel),
                            "atol": atol, "rtol": rtol, "margin": _finite(used)})
    base = base or Policy()
    if tols:
        note = (f"proposed by kpair pair --propose-policy from ref-against-opt differences "
                f"over {n} runs{' (' + how + ')' if how else ''}: per range the tightest "
                f"allclose on a grid of rtol that every run passes with margin {margin:g} "
                f"({'; '.join(summary)}); ceiling atol {max_atol:g}, rtol {max_rtol:g}")
    else:
        note = (f"proposed by kpair pair --propose-policy: opt matched ref byte for byte over "
                f"{n} runs{' (' + how + ')' if how else ''}, so the policy stays byte-exact")
    if base.note and base.mutations_exact:
        note += f". {base.note}"
    policy = Policy(tuple(tols), note, base.mutations, base.max_bias, False,
                    base.mutations_exact)
    return Proposal(policy, tuple(notes), tuple(details))


def _finite(x: float) -> float | str:
    return x if math.isfinite(x) else "inf"


__all__ = ["CEILING", "MARGIN", "Observed", "Proposal", "RegionSpec", "ToleranceOverCeiling",
           "propose", "rtol_grid"]
