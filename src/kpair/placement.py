"""Pure placement arithmetic: spans to map, and pointer patching for uniform relocation.

When captured addresses cannot be had, every region moves by one ``delta``. Pointers that
the kernel will follow live in two places: the kernarg blob and the regions' own contents
(pointer arrays, structs of pointers). Every aligned 8-byte word in either that falls inside
the captured span ``[lo, hi)`` is shifted by ``delta``; the counts are reported so a user
can see how much of a replay rests on this rule.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def granular_spans(ranges: Sequence[tuple[int, int]], granule: int) -> list[tuple[int, int]]:
    """Merge [start, end) ranges into sorted, disjoint spans aligned to ``granule``."""
    spans: list[list[int]] = []
    for lo, hi in sorted(ranges):
        lo, hi = lo // granule * granule, -(-hi // granule) * granule
        if spans and lo <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], hi)
        else:
            spans.append([lo, hi])
    return [(lo, hi) for lo, hi in spans]


def span_of(ranges: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """The smallest [lo, hi) holding every range."""
    return min(lo for lo, _ in ranges), max(hi for _, hi in ranges)


def patch_pointers(data: bytes, base: int, lo: int, hi: int, delta: int) -> tuple[bytes, int]:
    """Shift every 8-byte word of ``data`` that points into [lo, hi) by ``delta``.

    ``base`` is the captured address of ``data[0]`` (0 for a kernarg blob), so words are taken
    at addresses aligned to 8 — where a compiler puts a pointer. Returns (patched, count).
    """
    if delta == 0 or len(data) < 8:
        return data, 0
    skip = (-base) % 8
    n = (len(data) - skip) // 8
    if n <= 0:
        return data, 0
    words = np.frombuffer(data, dtype="<u8", count=n, offset=skip)
    hit = (words >= np.uint64(lo)) & (words < np.uint64(hi))
    count = int(hit.sum())
    if not count:
        return data, 0
    out = bytearray(data)
    patched = words.copy()
    # uint64 arithmetic wraps, which is what a negative delta needs.
    patched[hit] += np.uint64(delta % 2**64)
    out[skip:skip + 8 * n] = patched.tobytes()
    return bytes(out), count


def holds_pointers(data: bytes, base: int, lo: int, hi: int, *, chunk: int = 1 << 17) -> bool:
    """Whether ``data`` (a region at ``base``) holds an 8-byte word that points into
    [lo, hi) (the words ``patch_pointers`` would shift): such a region is neither filled,
    poisoned nor mutated. Scanned ``chunk`` words at a time into one cache-sized buffer, up
    to the first such word (a checked run scans every region's pre- and post-state)."""
    skip = (-base) % 8
    n = (len(data) - skip) // 8
    if n <= 0 or hi <= lo:
        return False
    words = np.frombuffer(data, "<u8", count=n, offset=skip)
    low, span = np.uint64(lo), np.uint64(hi - lo)
    scratch = np.empty(min(chunk, n), np.uint64)
    for at in range(0, n, chunk):
        part = words[at:at + chunk]
        shifted = scratch[:part.size]
        np.subtract(part, low, out=shifted)   # wraps below lo: only [lo, hi) lands < span
        if (shifted < span).any():
            return True
    return False
