"""ABBA timing of a ref/opt kernel pair: schedule, statistics, stopping rule, raw samples.

The abstractions (nvbench's names where they fit):

- A *block* is two timed launches: forward (F) puts ref in slot 1 and opt in slot 2, reverse (R)
  swaps them. Its ratio is r = t(slot 1) / t(slot 2).
- A *round* is ``round_blocks`` blocks, half F and half R, in an order drawn from one seeded
  generator. The stopping rule is consulted only between rounds, so every analysed prefix is
  balanced.
- :class:`Samples` hold the raw per-block timings of one run. ``save_samples`` writes them beside
  ``result.json``. :func:`analyze` turns them into an :class:`AbbaResult`; it is pure, so the
  reported numbers can be recomputed from the samples file alone.
- :class:`StoppingRule` decides from a :class:`MeasureState` snapshot whether to stop. The clock
  is injected into :func:`measure`, so tests drive the time cap with fake clocks.

Why ABBA: with fwd = geomean(r over F) and rev = geomean(r over R), a slot effect s (slot 1
always s times slower) gives fwd = s*S and rev = s/S, so sqrt(fwd/rev) = S = t_ref/t_opt exactly
and sqrt(fwd*rev) = s is reported as ``slot_bias``. Random F/R order stops slow drift (clocks,
temperature) from lining up with either direction. Only ratios are reported: absolute times drift
by tens of percent with power state and address placement.

Lifetimes: ``Samples`` and ``AbbaResult`` are immutable and outlive the run; a ``MeasureState``
exists for one rule check.
"""

from __future__ import annotations

import io
import math
import secrets
import time
import zipfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from kpair.errors import FormatError, KpairError, UsageError

MODES = ("A/B", "A/A")
STOP_REASONS = ("ci", "max_blocks", "time_cap")
#: How a run's blocks become one speedup (``analyze``): "mean", the ABBA geometric mean of the
#: block ratios; "low_quartile", the ratio of each kernel's lower-quartile time over every
#: block (a CPU's clock: interference only adds time).
LOCATIONS = ("mean", "low_quartile")
#: 2 added ``replicate``, 3 ``location``; files of versions 1 (one replicate) and 2 still load,
#: as "mean".
SAMPLES_VERSION = 3
# The bootstrap draws from (seed, this) so that it never replays the schedule's random stream.
_BOOT_STREAM = 0xB007
_SAMPLE_ARRAYS = ("block", "direction", "t_slot1_s", "t_slot2_s")


def geomean(values: Sequence[float] | np.ndarray) -> float:
    """Geometric mean as exp(mean(log x)): no overflow from a long product. The sum is
    ``math.fsum`` over libm's logs, so the same values give the same bits whatever numpy's
    SIMD paths or summation order are (a published geomean is compared, not re-derived)."""
    try:
        x = np.asarray(values, dtype=np.float64).ravel()
    except (TypeError, ValueError) as exc:
        raise KpairError(f"geomean needs numbers: {exc}") from None
    if x.size == 0:
        raise KpairError("geomean of no values")
    bad = ~np.isfinite(x) | (x <= 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise KpairError(f"geomean needs finite positive values; value [{i}] is {x[i]!r}")
    return math.exp(math.fsum(map(math.log, x.tolist())) / x.size)


# --------------------------------------------------------------------------- raw samples


def _checked_samples(block, direction, t1, t2, mode, seed, stopped_by, path,
                     location="mean"):
    """Normalise and validate the fields of a Samples record; FormatError names the bad one."""

    def fail(msg: str, fld: str) -> FormatError:
        return FormatError(msg, path=path, field=fld)

    arrays = {}
    for name, raw, kind in (("block", block, "i"), ("t_slot1_s", t1, "f"), ("t_slot2_s", t2, "f")):
        a = np.asarray(raw)
        if a.ndim != 1 or a.dtype.kind not in ("iu" if kind == "i" else "iuf"):
            raise fail(f"expected a 1-d {'integer' if kind == 'i' else 'float'} array, "
                       f"got dtype {a.dtype} shape {a.shape}", name)
        arrays[name] = a.astype(np.int64 if kind == "i" else np.float64)
    d = np.asarray(direction)
    if d.dtype.kind == "S":
        d = d.astype("U1") if d.dtype.itemsize == 1 else d.astype(str)
    if d.ndim != 1 or d.dtype.kind != "U":
        raise fail(f"expected a 1-d array of 'F'/'R', got dtype {d.dtype} shape {d.shape}",
                   "direction")
    n = d.shape[0]
    for name, a in arrays.items():
        if a.shape[0] != n:
            raise fail(f"has {a.shape[0]} entries but direction has {n}", name)
    wrong = ~np.isin(d, ["F", "R"])
    if wrong.any():
        i = int(np.argmax(wrong))
        raise fail(f"must be 'F' or 'R', got {d[i]!r}", f"direction[{i}]")
    d = d.astype("U1")
    wrong = arrays["block"] != np.arange(n)
    if wrong.any():
        i = int(np.argmax(wrong))
        raise fail(f"block indices must be 0..{n - 1} in order, got {arrays['block'][i]}",
                   f"block[{i}]")
    for name in ("t_slot1_s", "t_slot2_s"):
        a = arrays[name]
        wrong = ~np.isfinite(a) | (a <= 0)
        if wrong.any():
            i = int(np.argmax(wrong))
            raise fail(f"timings must be finite positive seconds, got {a[i]!r}", f"{name}[{i}]")
    if mode not in MODES:
        raise fail(f"must be one of {MODES}, got {mode!r}", "mode")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**63:
        raise fail(f"must be an integer in [0, 2**63), got {seed!r}", "seed")
    if stopped_by not in ("", *STOP_REASONS):
        raise fail(f"must be '' or one of {STOP_REASONS}, got {stopped_by!r}", "stopped_by")
    if location not in LOCATIONS:
        raise fail(f"must be one of {LOCATIONS}, got {location!r}", "location")
    for a in (*arrays.values(), d):
        a.flags.writeable = False
    return (arrays["block"], d, arrays["t_slot1_s"], arrays["t_slot2_s"], mode, int(seed),
            stopped_by, location)


@dataclass(frozen=True, eq=False)
class Samples:
    """Raw timings of one ABBA run, one entry per block, in execution order.

    ``direction[i]`` is "F" (ref in slot 1) or "R" (opt in slot 1); times are float64 seconds.
    ``seed`` seeded the schedule (and, by default, the bootstrap); ``stopped_by`` is "" while
    the run is still going; ``location`` is how ``analyze`` reads them (``LOCATIONS``). Arrays
    are made read-only.
    """

    block: np.ndarray
    direction: np.ndarray
    t_slot1_s: np.ndarray
    t_slot2_s: np.ndarray
    mode: str = "A/B"
    seed: int = 0
    stopped_by: str = ""
    replicate: np.ndarray | None = None
    location: str = "mean"

    def __post_init__(self):
        fields = _checked_samples(self.block, self.direction, self.t_slot1_s, self.t_slot2_s,
                                  self.mode, self.seed, self.stopped_by, None, self.location)
        for name, value in zip(
            ("block", "direction", "t_slot1_s", "t_slot2_s", "mode", "seed", "stopped_by",
             "location"),
            fields, strict=True,
        ):
            object.__setattr__(self, name, value)
        rep = np.zeros(len(self), np.int64) if self.replicate is None else \
            np.asarray(self.replicate)
        if rep.shape != (len(self),) or rep.dtype.kind not in "iu" or (rep < 0).any():
            raise FormatError(f"expected one replicate index >= 0 per block, got dtype "
                              f"{rep.dtype} shape {rep.shape}", field="replicate")
        rep = rep.astype(np.int64)
        rep.flags.writeable = False
        object.__setattr__(self, "replicate", rep)

    @classmethod
    def joined(cls, parts: Sequence[Samples]) -> Samples:
        """Several replicates' samples as one record, ``replicate`` telling them apart."""
        def cat(name: str) -> np.ndarray:
            return np.concatenate([getattr(p, name) for p in parts])

        return cls(np.arange(sum(len(p) for p in parts)), cat("direction"), cat("t_slot1_s"),
                   cat("t_slot2_s"), mode=parts[0].mode, seed=parts[0].seed,
                   stopped_by=parts[-1].stopped_by,
                   replicate=np.concatenate([np.full(len(p), i) for i, p in enumerate(parts)]),
                   location=parts[0].location)

    def part(self, replicate: int) -> Samples:
        """The blocks of one replicate (its seed is ``replicate_seed(seed, replicate)``)."""
        at = self.replicate == replicate
        return Samples(np.arange(int(at.sum())), self.direction[at], self.t_slot1_s[at],
                       self.t_slot2_s[at], mode=self.mode,
                       seed=replicate_seed(self.seed, replicate), stopped_by=self.stopped_by,
                       location=self.location)

    @property
    def replicates(self) -> int:
        return int(self.replicate.max()) + 1 if len(self) else 0

    @classmethod
    def from_blocks(cls, directions, t_slot1_s, t_slot2_s, **meta) -> Samples:
        directions = list(directions)
        return cls(np.arange(len(directions)), np.array(directions, dtype="U1"),
                   np.asarray(t_slot1_s, np.float64), np.asarray(t_slot2_s, np.float64), **meta)

    def __len__(self) -> int:
        return int(self.block.shape[0])

    @property
    def forward(self) -> np.ndarray:
        return self.direction == "F"

    @property
    def t_ref_s(self) -> np.ndarray:
        return np.where(self.forward, self.t_slot1_s, self.t_slot2_s)

    @property
    def t_opt_s(self) -> np.ndarray:
        return np.where(self.forward, self.t_slot2_s, self.t_slot1_s)


def save_samples(samples: Samples, path: str | Path) -> Path:
    """Write ``samples`` as a compressed .npz (layout in docs/format.md); returns the path."""
    path = Path(path)
    path.write_bytes(samples_bytes(samples))
    return path


def samples_bytes(samples: Samples) -> bytes:
    """``samples`` as the bytes of a compressed .npz (what ``save_samples`` writes)."""
    fh = io.BytesIO()  # a file object also stops numpy from appending ".npz" itself
    np.savez_compressed(
        fh,
        kpair_samples_version=np.int64(SAMPLES_VERSION),
        mode=np.bytes_(samples.mode.encode()),
        seed=np.int64(samples.seed),
        stopped_by=np.bytes_(samples.stopped_by.encode()),
        block=samples.block,
        direction=samples.direction.astype("S1"),
        t_slot1_s=samples.t_slot1_s,
        t_slot2_s=samples.t_slot2_s,
        replicate=samples.replicate,
        location=np.bytes_(samples.location.encode()),
    )
    return fh.getvalue()


def _scalar(npz, name: str, kind: str, path):
    if name not in npz.files:
        raise FormatError("missing", path=path, field=name)
    a = npz[name]
    if a.shape != () or a.dtype.kind not in kind:
        raise FormatError(f"expected a scalar of kind {kind!r}, got dtype {a.dtype} shape "
                          f"{a.shape}", path=path, field=name)
    v = a.item()
    if isinstance(v, bytes):
        try:
            v = v.decode("ascii")
        except UnicodeDecodeError:
            raise FormatError("is not ASCII", path=path, field=name) from None
    return v


def load_samples(path: str | Path) -> Samples:
    """Read and validate a samples file written by :func:`save_samples`."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as npz:
            version = _scalar(npz, "kpair_samples_version", "iu", path)
            if version not in (1, 2, SAMPLES_VERSION):
                raise FormatError(f"unsupported version {version} (this kpair reads "
                                  f"{SAMPLES_VERSION})", path=path, field="kpair_samples_version")
            meta = {k: _scalar(npz, k, kd, path)
                    for k, kd in (("mode", "SU"), ("seed", "iu"), ("stopped_by", "SU"))}
            arrays = []
            for name in _SAMPLE_ARRAYS:
                if name not in npz.files:
                    raise FormatError("missing array", path=path, field=name)
                arrays.append(npz[name])
            replicate = npz["replicate"] if version >= 2 and "replicate" in npz.files else None
            if version >= 2 and replicate is None:
                raise FormatError("missing array", path=path, field="replicate")
            location = _scalar(npz, "location", "SU", path) if version >= 3 else "mean"
    except FormatError:
        raise
    except OSError as exc:
        raise FormatError(f"cannot read samples file: {exc}", path=path) from None
    except (ValueError, EOFError, KeyError, RuntimeError, NotImplementedError,
            zipfile.BadZipFile, zlib.error) as exc:
        # RuntimeError / NotImplementedError: zipfile's answer to flipped header flag bits.
        raise FormatError(f"not a readable .npz samples file (truncated or corrupted?): {exc}",
                          path=path) from None
    fields = _checked_samples(*arrays, meta["mode"], meta["seed"], meta["stopped_by"], path,
                              location)
    if replicate is not None and (replicate.shape != fields[0].shape or
                                  replicate.dtype.kind not in "iu" or (replicate < 0).any()):
        raise FormatError("expected one replicate index >= 0 per block", path=path,
                          field="replicate")
    *fields, location = fields
    return Samples(*fields, replicate=replicate, location=location)


# --------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class AbbaResult:
    """The ``speed`` verdict of one run. ``speedup`` = t_ref/t_opt (>1: opt faster)."""

    mode: str
    speedup: float
    ci95: tuple[float, float]
    slot_bias: float
    slot_bias_ci95: tuple[float, float]
    fwd: float
    rev: float
    blocks: int
    forward_blocks: int
    reverse_blocks: int
    stopped_by: str
    rel_ci_halfwidth: float
    seed: int
    ref_median_s: float
    opt_median_s: float
    n_boot: int = 2000
    location: str = "mean"

    def to_json(self, samples_file: str | None = None) -> dict:
        """Plain JSON types; absolute times only under ``debug_only``, in microseconds."""
        out = {
            "mode": self.mode,
            "speedup": self.speedup,
            "ci95": list(self.ci95),
            "slot_bias": self.slot_bias,
            "slot_bias_ci95": list(self.slot_bias_ci95),
            "fwd": self.fwd,
            "rev": self.rev,
            "blocks": self.blocks,
            "forward_blocks": self.forward_blocks,
            "reverse_blocks": self.reverse_blocks,
            "stopped_by": self.stopped_by,
            "rel_ci_halfwidth": self.rel_ci_halfwidth,
            "seed": self.seed,
            "n_boot": self.n_boot,
            "debug_only": {
                "ref_median_us": self.ref_median_s * 1e6,
                "opt_median_us": self.opt_median_s * 1e6,
                "note": "absolute times drift with power and placement; compare ratios",
            },
        }
        if self.location != "mean":
            out["location"] = self.location
        if samples_file is not None:
            out["samples_file"] = samples_file
        return out


def _boot_means(rng: np.random.Generator, x: np.ndarray, n_boot: int) -> np.ndarray:
    return x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)


def analyze(samples: Samples, *, n_boot: int = 2000, seed: int | None = None) -> AbbaResult:
    """ABBA statistics of ``samples`` (pure; ``seed`` defaults to ``samples.seed``).

    fwd and rev are geometric means of the block ratios per direction; speedup = sqrt(fwd/rev),
    slot_bias = sqrt(fwd*rev). The 95% CIs are bootstrap percentile intervals that resample F
    and R blocks separately, with replacement, so each resample keeps the design's balance.

    With ``samples.location`` "low_quartile" the speedup is instead Q1(t_ref) / Q1(t_opt), each
    kernel's lower-quartile time over every block (half of them in each slot, so a slot effect
    cancels as in the mean), its CI bootstrapped the same way: on a CPU, preemption, cache
    pollution and a busy sibling thread only add time, to a share of the launches that moves
    with the machine's load from run to run, and the lower quartile stays clear of them.
    """
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 100:
        raise UsageError(f"n_boot must be an integer >= 100, got {n_boot!r}")
    seed = samples.seed if seed is None else seed
    log_r = np.log(samples.t_slot1_s / samples.t_slot2_s)
    fwd_mask = samples.forward
    lf, lr = log_r[fwd_mask], log_r[~fwd_mask]
    if lf.size < 2 or lr.size < 2:
        raise KpairError(f"ABBA needs at least 2 forward and 2 reverse blocks; got {lf.size} F "
                         f"and {lr.size} R")
    mf, mr = float(lf.mean()), float(lr.mean())
    rng = np.random.default_rng([seed, _BOOT_STREAM])
    bf, br = _boot_means(rng, lf, n_boot), _boot_means(rng, lr, n_boot)
    s_lo, s_hi = (float(v) for v in np.exp(np.percentile((bf - br) / 2, [2.5, 97.5])))
    b_lo, b_hi = (float(v) for v in np.exp(np.percentile((bf + br) / 2, [2.5, 97.5])))
    speedup = math.exp((mf - mr) / 2)
    if samples.location == "low_quartile":
        speedup, (s_lo, s_hi) = _low_quartile(samples, rng, n_boot)
    return AbbaResult(
        mode=samples.mode,
        speedup=speedup,
        ci95=(s_lo, s_hi),
        slot_bias=math.exp((mf + mr) / 2),
        slot_bias_ci95=(b_lo, b_hi),
        fwd=math.exp(mf),
        rev=math.exp(mr),
        blocks=len(samples),
        forward_blocks=int(lf.size),
        reverse_blocks=int(lr.size),
        stopped_by=samples.stopped_by,
        rel_ci_halfwidth=(s_hi - s_lo) / 2 / speedup,
        seed=int(seed),
        ref_median_s=float(np.median(samples.t_ref_s)),
        opt_median_s=float(np.median(samples.t_opt_s)),
        n_boot=n_boot,
        location=samples.location,
    )


def _low_quartile(samples: Samples, rng: np.random.Generator, n_boot: int
                  ) -> tuple[float, tuple[float, float]]:
    """Q1(t_ref) / Q1(t_opt) over every block and its bootstrap percentile CI (F and R blocks
    resampled separately, as ``analyze`` does)."""
    t_ref, t_opt = samples.t_ref_s, samples.t_opt_s
    f, r = np.flatnonzero(samples.forward), np.flatnonzero(~samples.forward)
    rows = np.concatenate([f[rng.integers(0, f.size, (n_boot, f.size))],
                           r[rng.integers(0, r.size, (n_boot, r.size))]], axis=1)
    boot = np.quantile(t_ref[rows], 0.25, axis=1) / np.quantile(t_opt[rows], 0.25, axis=1)
    lo, hi = (float(v) for v in np.percentile(boot, [2.5, 97.5]))
    return float(np.quantile(t_ref, 0.25) / np.quantile(t_opt, 0.25)), (lo, hi)


# --------------------------------------------------------------------------- stopping


@dataclass(frozen=True)
class MeasureState:
    """What the stopping rule sees after a round. ``result`` is None until it can be analysed."""

    blocks: int
    elapsed_s: float
    result: AbbaResult | None


@dataclass(frozen=True)
class StoppingRule:
    """Stop on a tight enough CI (after ``min_blocks``), on ``max_blocks`` or on the time cap.

    The time cap is checked from the first analysable round on, even before ``min_blocks``: a
    cap that a slow kernel can overrun many times over is not a cap. A stopped run says why,
    and its CI says how much it knows.
    """

    min_blocks: int = 32
    max_blocks: int = 2000
    rel_ci_halfwidth: float = 0.005
    time_cap_s: float = 30.0

    def __post_init__(self):
        if not 4 <= self.min_blocks <= self.max_blocks:
            raise UsageError(f"need 4 <= min_blocks <= max_blocks, got {self.min_blocks} and "
                             f"{self.max_blocks}")
        if not self.rel_ci_halfwidth > 0 or not self.time_cap_s > 0:
            raise UsageError("rel_ci_halfwidth and time_cap_s must be positive")

    def split(self, replicates: int) -> StoppingRule:
        """The rule of one of ``replicates`` replicates: a share of the blocks and time, and a
        CI target that makes the replicate-level interval about as tight as this rule's."""
        if replicates <= 1:
            return self
        min_blocks = max(8, math.ceil(self.min_blocks / replicates))
        return StoppingRule(min_blocks=min_blocks,
                            max_blocks=max(min_blocks, math.ceil(self.max_blocks / replicates)),
                            rel_ci_halfwidth=self.rel_ci_halfwidth * math.sqrt(replicates),
                            time_cap_s=self.time_cap_s / replicates)

    def is_finished(self, state: MeasureState) -> str | None:
        r = state.result
        if r is None:
            return None
        if state.blocks >= self.min_blocks and r.rel_ci_halfwidth <= self.rel_ci_halfwidth:
            return "ci"
        if state.blocks >= self.max_blocks:
            return "max_blocks"
        if state.elapsed_s >= self.time_cap_s:
            return "time_cap"
        return None


# --------------------------------------------------------------------------- the run

#: Between two looks at the CI the block count grows by at least this factor.
CHECK_GROWTH = 1.15


def round_schedule(rng: np.random.Generator, round_blocks: int) -> list[str]:
    """One round: ``round_blocks`` directions, half "F" and half "R", in random order."""
    half = round_blocks // 2
    return [str(d) for d in rng.permutation(np.array(["F"] * half + ["R"] * half))]


def _timed(time_one: Callable[[str], float], which: str, where: str) -> float:
    t = time_one(which)
    try:
        v = float(t)
    except (TypeError, ValueError):
        v = math.nan
    if not (math.isfinite(v) and v > 0):
        raise KpairError(f"time_one returned {t!r} for {which} at {where}; "
                         "timings must be finite positive seconds")
    return v


def measure(
    time_one: Callable[[str], float],
    *,
    rule: StoppingRule | None = None,
    round_blocks: int = 8,
    warmup: int = 2,
    seed: int | None = None,
    aa: bool = False,
    n_boot: int = 2000,
    clock: Callable[[], float] = time.monotonic,
    progress: Callable[[int, AbbaResult | None], None] | None = None,
    location: str = "mean",
) -> tuple[AbbaResult, Samples]:
    """Time ref against opt (or ref against itself with ``aa``) in randomized ABBA rounds.

    ``time_one(which)`` launches "ref" or "opt" once and returns its time in seconds; restoring
    state and flushing caches is the caller's business, outside the timed region. ``warmup``
    untimed calls of each kernel come first. ``progress(blocks, result_or_None)`` is called
    after every round. ``location``: how the blocks are read (``analyze``). Returns the final
    result and the raw samples it was computed from.
    """
    rule = StoppingRule() if rule is None else rule
    if isinstance(round_blocks, bool) or not isinstance(round_blocks, int) \
            or round_blocks < 2 or round_blocks % 2:
        raise UsageError(f"round_blocks must be an even integer >= 2, got {round_blocks!r}")
    if warmup < 0:
        raise UsageError(f"warmup must be >= 0, got {warmup}")
    if seed is None:
        seed = secrets.randbits(32)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**63:
        raise UsageError(f"seed must be an integer in [0, 2**63), got {seed!r}")
    seed = int(seed)
    mode = "A/A" if aa else "A/B"
    other = "ref" if aa else "opt"
    rng = np.random.default_rng(seed)
    start = clock()
    for i in range(warmup):
        _timed(time_one, "ref", f"warm-up {i}")
        _timed(time_one, other, f"warm-up {i}")
    dirs: list[str] = []
    t1: list[float] = []
    t2: list[float] = []
    result: AbbaResult | None = None
    # The bootstrap costs O(n_boot * blocks): run at every round it would cost more host time
    # than a short kernel's launches. So the CI is re-examined at block counts growing by
    # CHECK_GROWTH (a run stops at most that much later than it could have), while the time
    # cap and max_blocks, which need no statistics, are looked at after every round.
    next_check = rule.min_blocks
    while True:
        for d in round_schedule(rng, round_blocks):
            first, second = ("ref", other) if d == "F" else (other, "ref")
            n = len(dirs)
            t1.append(_timed(time_one, first, f"block {n} (slot 1)"))
            t2.append(_timed(time_one, second, f"block {n} (slot 2)"))
            dirs.append(d)
        n, elapsed = len(dirs), clock() - start
        due = n >= next_check or n >= rule.max_blocks or elapsed >= rule.time_cap_s
        if n < 4 or not due:
            if progress is not None:
                progress(n, result)
            continue
        samples = Samples.from_blocks(dirs, t1, t2, mode=mode, seed=seed, location=location)
        result = analyze(samples, n_boot=n_boot)
        next_check = max(n + round_blocks, math.ceil(n * CHECK_GROWTH))
        reason = rule.is_finished(MeasureState(n, elapsed, result))
        if progress is not None:
            progress(n, result)
        if reason is not None:
            # analyze() of the final samples gives exactly this: the bootstrap ignores stopped_by.
            return replace(result, stopped_by=reason), replace(samples, stopped_by=reason)


# --------------------------------------------------------------------------- replicates

#: Student's t, 0.975 quantile, for 1..30 degrees of freedom (then the normal's 1.96).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    return _T975[df - 1] if 1 <= df <= len(_T975) else 1.96


def replicate_seed(seed: int, replicate: int) -> int:
    """The schedule seed of replicate ``replicate`` of a run seeded ``seed``."""
    return (seed + replicate) % 2**63


#: A GPU run's own timing offset: each run (process, module loads, placement) shifts a
#: kernel's time by an amount its replicates share, with a standard deviation of about this
#: many seconds. Estimated from the 7 run means (a publication, 6 re-runs) of 45 operators
#: (H100 and H200, 2026-12-04 to 2026-12-06): the sum of their between-run variance in excess
#: of what the replicates predict, over the sum of 1/t_ref^2 + 1/t_opt^2, is (31 ns)^2; per
#: publication 19-36 ns (benchmarks/results/replicate_structure_h100.json, _h200.json;
#: docs/format.md, "Speed").
#: Negligible for long kernels, it is most of a 4 us kernel's run-to-run spread.
GPU_RUN_OFFSET_S = 30e-9


@dataclass(frozen=True)
class TimingModel:
    """How one backend's timings become a speedup: the measurement policy a ``Device``
    declares (``Device.timing_model()``) and a run reads.

    ``extra_replicates``: whether a run takes replicates past its planned number where they
    are cheap (``another_replicate``): on a GPU, what a re-run re-rolls is mostly the
    placement replicates re-roll too; on the host the load over minutes moves re-runs, which
    no replicate sees, and more replicates would only narrow the interval.
    ``run_offset_s``: the standard deviation, in seconds, of a run's own timing offset that
    every replicate of the run shares (``combine_replicates``; GPUs: ``GPU_RUN_OFFSET_S``;
    the host has none of its own: its term is relative and follows the load, ``run_rel``).
    ``location``: how a run's timed blocks are read (``LOCATIONS``): the ABBA geometric mean
    on a GPU; the host, whose clock is a CPU's, reads lower quartiles."""

    extra_replicates: bool = True
    run_offset_s: float = 0.0
    location: str = "mean"

    def __post_init__(self) -> None:
        if self.location not in LOCATIONS:
            raise ValueError(f"location must be one of {LOCATIONS}, not {self.location!r}")


#: The CUDA and HIP backends' timing (HIP's run offset was measured on NVIDIA cards only).
GPU_TIMING = TimingModel(run_offset_s=GPU_RUN_OFFSET_S)
#: The host backend's timing: CPU clocks, lower quartiles, no extra replicates.
HOST_TIMING = TimingModel(extra_replicates=False, location="low_quartile")

#: The host's run-level term, relative (in log speedup), from how much of the measurement its
#: executors spent waiting for a CPU (``wait``: run-queue time / (run-queue + on-CPU time),
#: the kernel's /proc/PID/schedstat): HOST_RUN_REL_IDLE on an idle machine, rising linearly
#: to HOST_RUN_REL_LOADED at HOST_LOADED_WAIT and above (two CPU hogs on two CPUs gave 0.34).
#: Calibrated on recorded host re-runs (docs/evidence/reproduction-host.md): a fixed
#: 1% covered 99% of idle re-runs (44 runs), 3% covered 95% and 100% of two sets beside two
#: hogs (80 and 24 runs), whose between-run spread no replicate of one run shows (the load over
#: minutes moves it). Where the wait cannot be read, the loaded value.
HOST_RUN_REL_IDLE, HOST_RUN_REL_LOADED, HOST_LOADED_WAIT = 0.01, 0.03, 0.3


def host_run_rel(wait: float | None) -> float:
    """The host's relative run-level term for a measurement whose executors waited for a CPU
    ``wait`` of the time (None: unknown)."""
    if wait is None:
        return HOST_RUN_REL_LOADED
    share = min(1.0, max(0.0, wait) / HOST_LOADED_WAIT)
    return HOST_RUN_REL_IDLE + share * (HOST_RUN_REL_LOADED - HOST_RUN_REL_IDLE)


@dataclass(frozen=True)
class Replicated:
    """A speedup measured in several independent replicates (fresh module loads, each its own
    ABBA run) and read at the replicate level (docs/format.md, "Speed", for the formula).

    ``ci95`` is the 95% *re-run interval*: where the point of another run of the same design
    lands (a prediction interval for a mean of as many replicates); ``mean_ci95`` the
    confidence interval of the speedup itself; ``sd_log`` the spread of the replicates' log
    speedups (between-replicate variation and within-run noise together); ``run_sd_log`` the
    run-level term no replicate of one run can show (``run_offset_s``, 0 without one)."""

    speedup: float
    ci95: tuple[float, float]
    mean_ci95: tuple[float, float]
    sd_log: float
    parts: tuple[AbbaResult, ...]
    run_sd_log: float = 0.0

    def replicate_rows(self) -> list[dict]:
        return [{"speedup": p.speedup, "ci95": list(p.ci95), "slot_bias": p.slot_bias,
                 "blocks": p.blocks, "stopped_by": p.stopped_by} for p in self.parts]


def combine_replicates(parts: Sequence[AbbaResult], *, run_offset_s: float = 0.0,
                       run_rel: float = 0.0) -> Replicated:
    """The replicate-level estimate of ``parts`` (two or more).

    With y_i the log speedup of replicate i (i = 1..R), m their mean and s their standard
    deviation — floored at the replicates' own root-mean-square bootstrap standard error,
    because the spread of R means cannot be below their sampling noise — and u the run-level
    term: a timing offset shared by every replicate of one run, of standard deviation
    ``run_offset_s`` in each kernel's time, so u = run_offset_s * sqrt(1/t_ref^2 +
    1/t_opt^2) in log speedup (t the replicates' mean medians), or the square root of the sum
    of its square and ``run_rel``'s (a term already in log speedup: the host's), a re-run of
    the same design
    gives a mean m' with m' - m ~ N(0, 2 (s^2 / R + u^2)). So: speedup = exp(m); re-run
    interval = exp(m +- t(R-1) sqrt(2 (s^2/R + u^2))); mean CI = exp(m +- t(R-1)
    sqrt(s^2/R + u^2)). Between-run variation the replicates meet (module placement, clocks,
    neighbours) is in s: that is why they reload the code; u is what one run cannot meet."""
    if len(parts) < 2:
        raise KpairError(f"combine_replicates needs at least 2 replicates, got {len(parts)}")
    y = np.log([p.speedup for p in parts])
    r = y.size
    se = np.array([(math.log(p.ci95[1]) - math.log(p.ci95[0])) / (2 * 1.96) for p in parts])
    sd = max(float(np.std(y, ddof=1)), float(np.sqrt(np.mean(se ** 2))))
    t_ref = float(np.mean([p.ref_median_s for p in parts]))
    t_opt = float(np.mean([p.opt_median_s for p in parts]))
    u = run_offset_s * math.sqrt(1 / t_ref ** 2 + 1 / t_opt ** 2) \
        if run_offset_s and t_ref > 0 and t_opt > 0 else 0.0
    u = math.hypot(u, run_rel)
    var = sd ** 2 / r + u ** 2
    m, t = float(y.mean()), t975(r - 1)
    pred, mean = t * math.sqrt(2 * var), t * math.sqrt(var)
    return Replicated(speedup=math.exp(m), ci95=(math.exp(m - pred), math.exp(m + pred)),
                      mean_ci95=(math.exp(m - mean), math.exp(m + mean)), sd_log=sd,
                      parts=tuple(parts), run_sd_log=u)


#: Extra replicates (past the planned R, up to ``RunOptions.max_replicates``) a run may spend
#: at most this many seconds on, in all: they are taken where they are cheap (short kernels,
#: whose replicates take tens of milliseconds and whose placement moves them most).
EXTRA_REPLICATES_S = 1.0


def another_replicate(count: int, *, limit: int, per_replicate_s: float, extra_s: float,
                      budget_s: float | None = None) -> bool:
    """Whether a run that has measured ``count`` replicates (its planned number at least)
    takes one more: fewer than ``limit``, and one more, at ``per_replicate_s`` (the mean so
    far), keeps the time spent on extra ones (``extra_s``) within ``budget_s`` (default
    ``EXTRA_REPLICATES_S``).

    Cost alone decides, never what the replicates measured: a run that stopped once its
    interval looked narrow would stop most often where its replicates happened to agree, and
    publish those narrow intervals (simulated with two placement levels, such a rule covered
    re-runs 90% of the time against 95% for a fixed number; tests/test_measure.py)."""
    budget_s = EXTRA_REPLICATES_S if budget_s is None else budget_s
    return count < limit and extra_s + per_replicate_s <= budget_s


def analyze_replicates(samples: Samples, *, n_boot: int = 2000, run_offset_s: float = 0.0,
                       run_rel: float = 0.0) -> tuple[AbbaResult, Replicated]:
    """The pooled ABBA statistics of every block (slot bias, fwd, rev, counts) and the
    replicate-level speedup, from a samples record alone (pure)."""
    parts = [analyze(samples.part(i), n_boot=n_boot) for i in range(samples.replicates)]
    return analyze(samples, n_boot=n_boot), combine_replicates(
        parts, run_offset_s=run_offset_s, run_rel=run_rel)


def combine(ci95: Sequence[float], control_ci95: Sequence[float]) -> tuple[float, float, float]:
    """Fold the systematic offset an identical binary shows into a speedup interval.

    ``control_ci95`` is the interval of ref against a separately loaded copy of itself, placed
    and launched as opt is: whatever it spans away from 1.0 is what the meter would report
    for no difference at all. Its larger log-distance from 1.0, b = log ``bound``, is an
    error independent of the speedup's own: it joins the interval's log half-width w in
    quadrature, around the interval's log centre c: exp(c +- sqrt(w^2 + b^2)). Returns (lo,
    hi, bound) with bound as a ratio (>= 1)."""
    b = max(abs(math.log(control_ci95[0])), abs(math.log(control_ci95[1])))
    lo, hi = math.log(ci95[0]), math.log(ci95[1])
    c, half = (lo + hi) / 2, math.hypot((hi - lo) / 2, b)
    return math.exp(c - half), math.exp(c + half), math.exp(b)


def difference(combined_ci95: Sequence[float]) -> str:
    """"faster", "slower", or "none" (no measurable difference: the interval holds 1.0)."""
    lo, hi = combined_ci95
    return "faster" if lo > 1.0 else "slower" if hi < 1.0 else "none"
