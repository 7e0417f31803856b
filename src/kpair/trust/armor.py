"""Memory armour: guard canaries around every region and poison in the bytes ref writes.

The layout is pure: ``guard_bands`` (where the canaries go: bytes beside a region that no
region covers and that the device mapped), ``band_violation`` (what changed in one), the
poison pattern (``pattern``, ``poisoned_image``) and what of it a run left (``left_mask``,
``poison_left``). ``Armor`` writes them through a ``Device`` around launches: the replay
calls one of its hook sets per launch, ``armor.guarded`` (fresh canaries before, checked
after), ``armor.poisoned`` (the same, plus fresh poison in every planned write-only range) or
``armor.poisoned_pre`` (the same, for a launch whose planned regions hold their pre-state).
Which launches get poison is the caller's choice at each launch, never a mode of the armour.
Placed scratch the launched code does not own (``Replay.foreign_scratch``: a buffer placed for
another plan, a range's scratch for a plan, a plan's for ref) is guard territory for that
launch: the replay hands it to ``before``, and it is canaried and checked with the bands, in
the same fill and the same check (a write there is a ``guard_bands`` violation, side
"scratch", naming the buffer).
Canaries are checked where the memory is (``Device.check_fills``); a band is read back to
the host only when it changed, to say where.

Launches on the captured pre-state (opt's repeats, the timed ones, the timing windows, ref's
rejudging) take one of two poisons per region in turn, one quiet-NaN word and one arbitrary
word, drawn anew for each candidate; ref's control runs under each before the candidate's first
launch (``kpair.trust.audit``), so a poison under which ref itself changes its answer (bytes
that look write-only to two discovery fills but are read for other values) never judges opt.
Launches on a mutated input get a fresh word each. Poison in a few ranges is a device fill per
range. A data-dependent write pattern has millions of ranges: there a poisoned launch reads
the region, poisons it on the host and writes it back (``poison_into``: about 0.05 s per
100 MB where the runs share one alignment mod 4, 0.8 s where they do not; 2026-12-07), except
on the pre-state: the armour holds the pre-state with each of the two poisons where the device
keeps copies (``Device.hold``), copies one in before each launch (``Device.put``; device to
device on a GPU) and checks after the launch that the held copy is intact, so a kernel that
writes its answer into it fails as one that writes out of bounds.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..backends.base import Device, Held

#: Guard bytes per side of a region at most (they are read back after every launch); an
#: unmapped byte is never touched.
GUARD_CAP = 64 << 10
#: Without mapped_ranges(), gaps shorter than this lie in pages both neighbours map.
SAFE_GAP = 4096
_FILL_RUNS = 64     # more poison runs than this: read-modify-write the region instead
#: Poisoned copies of a fragmented region's pre-state held per candidate, their bytes at most.
HELD_WORDS = 2
HELD_CAP = 4 << 30
#: The quiet-NaN family of poison (and of the first discovery fill): NaN as float32, and in the
#: high half as float16/bfloat16; the low 16 bits are drawn.
QUIET_NAN = 0x7FC00000


class Runs:
    """Sorted, disjoint ``[start, end)`` byte runs of one region, held as arrays (a
    data-dependent write pattern has millions of them); iterating yields ``(start, end)``.
    The arithmetic over them works on whole-region byte arrays, never a Python loop per run,
    and never an index per byte (a region can hold hundreds of MB)."""

    def __init__(self, starts, ends):
        self.starts = np.asarray(starts, np.int64)
        self.ends = np.asarray(ends, np.int64)
        self._layout: tuple[int, np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return int(self.starts.size)

    def __iter__(self):
        return zip(self.starts.tolist(), self.ends.tolist(), strict=True)

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, (Runs, list, tuple)) \
            else NotImplemented

    def __repr__(self) -> str:
        return f"Runs({list(self)[:4]}{'...' if len(self) > 4 else ''})"

    @property
    def nbytes(self) -> int:
        return int((self.ends - self.starts).sum())

    def layout(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        """(in a run, offset from the run's start mod 4) for every byte of a ``size``-byte
        region: a bool and a uint8 array (cached for the last size)."""
        if self._layout is None or self._layout[0] != size:
            edge = np.zeros(size + 1, np.int8)
            edge[self.starts] += 1
            edge[self.ends] -= 1
            inside = np.cumsum(edge[:-1], dtype=np.int8).astype(bool)
            lengths = (self.ends - self.starts)
            first = np.repeat((self.starts & 3).astype(np.uint8), lengths)
            here = np.tile(np.arange(4, dtype=np.uint8), -(-size // 4))[:size]
            phase = np.zeros(size, np.uint8)
            phase[inside] = (here[inside] - first) & 3
            self._layout = (size, inside, phase)
        return self._layout[1], self._layout[2]

    @functools.cached_property
    def alignment(self) -> int | None:
        """The start of every run mod 4 where they all share one (None otherwise)."""
        shifts = np.unique(self.starts & 3)
        return int(shifts[0]) if shifts.size == 1 else None


def mask_runs(mask: np.ndarray) -> Runs:
    """The runs of True in a boolean mask."""
    m = np.asarray(mask, bool)
    if not m.size:
        return Runs([], [])
    bounds = np.concatenate(([0], np.flatnonzero(m[1:] != m[:-1]) + 1, [m.size]))
    starts, ends = bounds[:-1], bounds[1:]
    on = m[starts]
    return Runs(starts[on], ends[on])


def _runs(runs: Runs | Sequence[tuple[int, int]]) -> Runs:
    if isinstance(runs, Runs):
        return runs
    pairs = list(runs)
    return Runs([s for s, _ in pairs], [e for _, e in pairs])


def pattern(word: int, size: int) -> np.ndarray:
    """``size`` bytes of the little-endian 32-bit ``word`` repeated (Device.fill's layout)."""
    return np.tile(np.frombuffer(word.to_bytes(4, "little"), np.uint8), -(-size // 4))[:size]


def poison_into(buf: np.ndarray, runs: Runs, word: int) -> None:
    """Write ``word`` into ``buf`` (a region's bytes) over every run, from each run's start.
    Runs that all start at one alignment a mod 4 (the usual case) take the word rotated by a
    and tiled over the region; others an image indexed by each byte's offset in its run."""
    inside, phase = runs.layout(buf.size)
    if (a := runs.alignment) is not None:
        image = pattern(int.from_bytes(np.roll(pattern(word, 4), a).tobytes(), "little"),
                        buf.size)
    else:
        image = pattern(word, 4)[phase]
    np.copyto(buf, image, where=inside)


def poisoned_image(runs: Runs | Sequence[tuple[int, int]], word: int, size: int
                   ) -> np.ndarray:
    """A region's poison: each run filled with ``word`` from the run's start."""
    out = np.zeros(size, np.uint8)
    poison_into(out, _runs(runs), word)
    return out


def left_mask(runs: Runs | Sequence[tuple[int, int]], word: int, expected: bytes,
              actual: bytes) -> np.ndarray:
    """Bytes of whole poison words (4 bytes from each run's start; a run's tail counts as one)
    that opt left exactly as poisoned, where the answer is not the poison itself. Whole words:
    a written value matches one poison *byte* by chance once in 256 bytes, a word practically
    never."""
    exp, act = np.frombuffer(expected, np.uint8), np.frombuffer(actual, np.uint8)
    if actual == expected:   # a byte left as poisoned would be the answer itself
        return np.zeros(exp.size, bool)
    inside, phase = _runs(runs).layout(exp.size)
    im = pattern(word, 4)[phase]
    # A word starts where a run's offset is 0 mod 4; byte k of it is in it when it lies in a
    # run with offset k mod 4 (a run starting in between has offset 0 there).
    head = inside & (phase == 0)
    member = [inside[k:] & (phase[k:] == k) for k in (1, 2, 3)]

    def whole(eq: np.ndarray) -> np.ndarray:
        out = head & eq
        for k, m in zip((1, 2, 3), member, strict=True):
            out[:-k] &= ~m | eq[k:]
        return out

    start = whole(act == im) & ~whole(exp == im)
    left = start.copy()
    for k, m in zip((1, 2, 3), member, strict=True):
        left[k:] |= start[:-k] & m
    return left


def poison_left(runs: Runs | Sequence[tuple[int, int]], word: int, expected: bytes,
                actual: bytes) -> tuple[int, int | None]:
    """(bytes, first offset) of the poison opt left as it was."""
    if actual == expected:  # a memcmp: a byte left as poisoned would be the answer itself
        return 0, None
    left = np.flatnonzero(left_mask(runs, word, expected, actual))
    return int(left.size), (int(left[0]) if left.size else None)


@dataclass(frozen=True)
class Band:
    """Guard bytes ``[address, address + size)`` beside ``region``: ``side`` is "before" or
    "after"; ``offset`` is the band's first byte relative to the region's first byte."""

    region: str
    side: str
    address: int
    size: int
    offset: int


def guard_bands(regions: Sequence[tuple[str, int, int]],
                mapped: Sequence[tuple[int, int]] | None, cap: int = GUARD_CAP) -> list[Band]:
    """Bands around every (name, address, size) region, in the mapped bytes no region covers.

    A gap between two regions is split between them; a region's band never exceeds ``cap``.
    ``mapped`` None: only gaps shorter than SAFE_GAP between two regions are used."""
    regs = sorted(regions, key=lambda r: r[1])
    if mapped is None:
        spans, edges = [(regs[0][1], regs[-1][1] + regs[-1][2])] if regs else [], False
    else:
        spans, edges = sorted(mapped), True
    bands: list[Band] = []
    for lo, hi in spans:
        inside = [r for r in regs if lo <= r[1] and r[1] + r[2] <= hi]
        for i, (name, start, size) in enumerate(inside):
            end = start + size
            prev_end = inside[i - 1][1] + inside[i - 1][2] if i else (lo if edges else None)
            next_start = inside[i + 1][1] if i + 1 < len(inside) else (hi if edges else None)
            if prev_end is not None and (edges or start - prev_end < SAFE_GAP):
                gap = start - prev_end
                before = min(cap, gap // 2 if i else gap)
                if before > 0:
                    bands.append(Band(name, "before", start - before, before, -before))
            if next_start is not None and (edges or next_start - end < SAFE_GAP):
                gap = next_start - end
                after = min(cap, gap - gap // 2 if i + 1 < len(inside) else gap)
                if after > 0:
                    bands.append(Band(name, "after", end, after, size))
    return bands


def band_violation(band: Band, seen: bytes, word: int) -> dict | None:
    """Where canary bytes of ``band`` were overwritten, as offsets from the region's start,
    widened to the 4-byte words (aligned to the region) they lie in: a written value can
    leave a byte that happens to equal the canary's."""
    if seen == (word.to_bytes(4, "little") * -(-band.size // 4))[:band.size]:
        return None
    got = np.frombuffer(seen, np.uint8)
    bad = np.flatnonzero(got != pattern(word, band.size))
    if not bad.size:
        return None
    words = np.unique((band.offset + bad) // 4)
    lo = max(int(words[0]) * 4, band.offset)
    hi = min(int(words[-1]) * 4 + 3, band.offset + band.size - 1)
    nbytes = sum(min(w * 4 + 3, hi) - max(w * 4, lo) + 1 for w in words.tolist())
    return {"region": band.region, "side": band.side, "bytes": nbytes,
            "first_offset": lo, "last_offset": hi}


def describe_violation(v: dict) -> str:
    lo, hi = v["first_offset"], v["last_offset"]
    span = f"{lo:+d}" if lo == hi else f"{lo:+d}..{hi:+d}"
    if v["side"] == "held copy":
        return (f"kpair's poisoned copy of region {v['region']} changed: a kernel wrote "
                "into memory kpair holds outside the captured regions")
    if v["side"] == "scratch":
        name = v["region"].removeprefix("scratch:")
        return (f"{v['bytes']} byte{'s' * (v['bytes'] != 1)} into scratch buffer {name} "
                f"(offsets {span} from its start), which the launched code does not declare "
                "(placed for other code)")
    where = "before the start" if v["side"] == "before" else "past the end"
    return (f"{v['bytes']} byte{'s' * (v['bytes'] != 1)} {where} of region {v['region']} "
            f"(offsets {span} from its start)")


# ------------------------------------------------------------------ one-sided error


class _Hooks:
    """What ``Replay`` calls around one launch: ``before`` and ``after``."""

    def __init__(self, armor: Armor, poison: bool, pre: bool = False, again: bool = False):
        self.armor, self.poison, self.pre, self.again = armor, poison, pre, again

    def before(self, foreign: Sequence[tuple[str, int, int, int]] = ()) -> None:
        self.armor._before(self.poison, self.pre, self.again, foreign)

    def after(self) -> None:
        self.armor._after()


class Armor:
    """Canaries and poison, written around each launch with words drawn from ``rng``.

    ``plan`` (region -> (address, size, write-only runs)) is what ``poisoned`` launches get
    poison in; it is set once the write-only bytes are known. ``pre`` (region -> captured
    pre-state) is what ``poisoned_pre`` launches start from: they take one of ``HELD_WORDS``
    poisons per region in turn (``words()``), the same for every such launch of a candidate,
    so that ref's control can run under each (``control_launches``). Launches on another state
    get a fresh word each. After each launch ``last`` holds the guard violations it caused and
    ``poisoned_regions()`` the poison it was given. ``renew()`` draws new poisons for the
    pre-state (a new candidate gets new words) and ``restore(words)`` takes back earlier ones.
    """

    def __init__(self, device: Device, bands: list[Band], rng: np.random.Generator,
                 pre: Mapping[str, bytes] | None = None):
        self.device, self.bands, self.rng = device, bands, rng
        self.pre = pre if pre is not None else {}
        self.plan: dict[str, tuple[int, int, Runs]] = {}
        self.poison_words: dict[str, int] = {}   # of the last launch
        self.last: list[dict] = []                 # guard violations of the last launch
        #: Placed scratch the launch does not own, canaried as bands (side "scratch"); off
        #: where the guard bands are skipped.
        self.foreign: list[Band] = []
        self.guard_scratch = True
        self.canary, self._n = 0, 0
        self._words: dict[str, list[int]] = {}     # region -> the pre-state's poison words
        self._held: dict[str, dict[int, Held | None]] = {}   # region -> word -> copy
        self._turn = 0
        self._put: list[tuple[str, Held]] = []     # held copies put before the last launch
        #: (address, size, held) compares to run with the next launch's canary check, in one
        #: pass (``Device.check_many``); their results, in order, in ``compared`` after it.
        self.pending: list[tuple[int, int, Held]] = []
        self.compared: list[tuple[int, int | None] | None] = []
        self.guarded = _Hooks(self, poison=False)
        self.poisoned = _Hooks(self, poison=True)
        self.poisoned_pre = _Hooks(self, poison=True, pre=True)
        #: The poison of the launch before, again (both kernels of a timed block get the same;
        #: ref, after opt failed under a poison, to learn whether that poison changes its own
        #: answer).
        self.poisoned_again = _Hooks(self, poison=True, pre=True, again=True)
        self.poisoned_state_again = _Hooks(self, poison=True, again=True)

    def _poison_word(self) -> int:
        # Alternate a quiet-NaN family (NaN as f32, and in the high half as f16/bf16) with
        # arbitrary bits: an unwritten element fails a tolerance check either way.
        self._n += 1
        w = int(self.rng.integers(1, 2**32))
        return QUIET_NAN | (w & 0xFFFF) if self._n % 2 else w

    def words(self) -> dict[str, list[int]]:
        """region -> the poison words launches on the pre-state get in turn (drawn on first
        use)."""
        self._draw()
        return {name: list(w) for name, w in self._words.items()}

    def _draw(self) -> None:
        for name in self.plan:
            if name not in self._words:
                self._words[name] = [self._poison_word() for _ in range(HELD_WORDS)]

    def renew(self, quiet_nan: bool = False) -> dict[str, list[int]]:
        """Draw new poisons for launches on the pre-state (``quiet_nan``: every word of that
        family, the discovery's first fill); the words they replace."""
        old = self.words()
        self.restore({name: [QUIET_NAN | int(self.rng.integers(0, 2**16))
                             for _ in range(HELD_WORDS)] for name in self.plan}
                     if quiet_nan else {})
        return old

    def restore(self, words: dict[str, list[int]]) -> None:
        """Launches on the pre-state take ``words`` (from ``renew`` or ``words``) again."""
        for copies in self._held.values():
            for held in copies.values():
                if held is not None:
                    self.device.drop(held)
        self._words = {name: list(w) for name, w in words.items()}
        self._held, self._put = {}, []

    def _before(self, poison: bool, pre: bool, again: bool = False,
                foreign: Sequence[tuple[str, int, int, int]] = ()) -> None:
        self.canary = int(self.rng.integers(1, 2**32))
        self.foreign = [Band(f"scratch:{name}", "scratch", address, size, offset)
                        for name, address, size, offset in foreign] \
            if self.guard_scratch else []
        self.device.fill_many([(b.address, b.size) for b in (*self.bands, *self.foreign)],
                              self.canary)
        last, self.poison_words, self._put = self.poison_words, {}, []
        if not poison:
            return
        if pre and not again:
            self._turn += 1
        if pre:
            self._draw()
        for name, (address, size, runs) in self.plan.items():
            if again and name in last:
                word = last[name]
            elif pre:
                word = self._words[name][self._turn % HELD_WORDS]
            else:
                word = self._poison_word()
            if len(runs) <= _FILL_RUNS:
                self.device.fill_many([(address + s, e - s) for s, e in runs], word)
            elif pre and (held := self._held_copy(name, word)) is not None:
                self.device.put(address, held)
                self._put.append((name, held))
            else:
                cur = np.frombuffer(self.device.read(address, size), np.uint8).copy()
                poison_into(cur, runs, word)
                self.device.write(address, cur.tobytes())
            self.poison_words[name] = word

    def control_launches(self) -> int:
        """How many different poisoned pre-states the launches that follow get in turn (launch
        k gets the words' k mod HELD_WORDS), so ref's control runs under each."""
        return HELD_WORDS if self.plan else 0

    def _held_copy(self, name: str, word: int) -> Held | None:
        """Region ``name``'s pre-state with ``word`` in its write-only runs, held on the
        device (made on first use); None where there is no room for it (the launch then reads,
        poisons and writes the region)."""
        copies = self._held.setdefault(name, {})
        if word not in copies:
            address, size, runs = self.plan[name]
            made = sum(h.size for c in self._held.values() for h in c.values() if h)
            held = None
            if name in self.pre and made + size <= HELD_CAP:
                image = np.frombuffer(self.pre[name], np.uint8).copy()
                poison_into(image, runs, word)
                held = self.device.hold(image.tobytes())
            copies[word] = held
        return copies[word]

    def _after(self) -> None:
        # Checked where the memory is (Device.check_fills); only a band that changed is read.
        # The caller's ``pending`` compares go in the same pass.
        self.last, pending, self.pending, self.compared = [], self.pending, [], []
        for name, held in self._put:
            if not self.device.intact(held):
                self.last.append({"region": name, "side": "held copy", "bytes": held.size,
                                  "first_offset": 0, "last_offset": held.size - 1})
        bands = [*self.bands, *self.foreign]
        spans = [(b.address, b.size) for b in bands]
        if pending:
            found, self.compared = self.device.check_many(spans, self.canary, pending)
        elif not bands:
            return
        else:
            found = self.device.check_fills(spans, self.canary)
        for b, (bad, _) in zip(bands, found, strict=True):
            v = band_violation(b, self.device.read(b.address, b.size), self.canary) \
                if bad else None
            if v is not None:
                self.last.append(v)

    def poisoned_regions(self) -> dict[str, tuple[int, Runs]]:
        """region -> (word, runs) of the poison written before the last launch."""
        return {n: (w, self.plan[n][2]) for n, w in self.poison_words.items()}
