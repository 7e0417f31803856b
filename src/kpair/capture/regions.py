"""Which memory a dispatch can reach: kernarg pointer words narrowed to allocation extents.

Every aligned 8-byte word of the kernarg (inside one parameter) that points into device
memory names a region. The region is the smallest extent known to hold what the pointer
addresses: in a PyTorch process, the caching allocator's *block* (its memory snapshot knows
each block's exact start and size); elsewhere the driver's allocation range. Storing blocks
instead of whole allocator segments (20 MiB and more each) is what keeps snapshots small;
both sizes are reported so the saving can be checked. Pure logic: the driver query and the
allocator snapshot come in as a function and a list, so this is tested without a GPU.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

#: Words below this or at/above this are never device addresses (small integers, sizes,
#: packed scalars, non-canonical values): no driver query is spent on them.
_MIN_ADDRESS, _MAX_ADDRESS = 1 << 16, 1 << 57


@dataclass(frozen=True)
class Block:
    """An extent of device memory: ``start``/``size``, and the segment (allocation) it is in."""

    start: int
    size: int
    segment_start: int
    segment_size: int
    source: str  # "torch-block" or "driver-range"
    state: str = ""

    @property
    def end(self) -> int:
        return self.start + self.size


def allocator_blocks(snapshot: dict) -> list[Block]:
    """Blocks of a ``torch.cuda.memory._snapshot()`` result, sorted by address.

    Each segment (one cudaMalloc or one expandable mapping) is tiled by blocks in address
    order; older snapshots lack a block's ``address``, so it is also derived by summing sizes.
    """
    blocks = []
    for seg in snapshot.get("segments", []):
        seg_start, seg_size = int(seg["address"]), int(seg["total_size"])
        cursor = seg_start
        for b in seg.get("blocks", []):
            start, size = int(b.get("address", cursor)), int(b["size"])
            cursor = start + size
            if size > 0:
                blocks.append(Block(start, size, seg_start, seg_size, "torch-block",
                                    str(b.get("state", ""))))
    blocks.sort(key=lambda b: b.start)
    return blocks


class BlockTable:
    """Sorted, non-overlapping blocks with lookup by address."""

    def __init__(self, blocks: Iterable[Block] = ()):
        self.blocks = sorted(blocks, key=lambda b: b.start)
        self._starts = [b.start for b in self.blocks]

    def find(self, address: int) -> Block | None:
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0 and address < self.blocks[i].end:
            return self.blocks[i]
        return None


@dataclass(frozen=True)
class PointerWord:
    """A kernarg word that may be a pointer: its byte offset, value and parameter index."""

    offset: int
    value: int
    param: int
    param_offset: int


def pointer_words(kernarg: bytes, layout: Sequence[tuple[int, int]] | None) -> list[PointerWord]:
    """Aligned 8-byte words lying wholly inside one parameter (or anywhere, without layout).

    Keeping words inside one parameter avoids reading two adjacent 4-byte scalars as one
    pointer; structs passed by value (cuBLAS's 736-byte parameter) are scanned word by word.
    """
    spans = list(layout) if layout is not None else [(0, len(kernarg))]
    words = []
    for index, (start, size) in enumerate(spans):
        first = -(-start // 8) * 8
        for off in range(first, start + size - 7, 8):
            if off + 8 > len(kernarg):
                break
            (value,) = struct.unpack_from("<Q", kernarg, off)
            if _MIN_ADDRESS <= value < _MAX_ADDRESS:
                words.append(PointerWord(off, value, index, off - start))
    return words


@dataclass
class PlannedRegion:
    """A region to store: its extent, the unnarrowed segment, and the words pointing into it."""

    start: int
    size: int
    segment_start: int
    segment_size: int
    source: str
    words: list[PointerWord] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.start + self.size

    @property
    def name(self) -> str:
        """``arg3`` for a pointer parameter, ``arg3.w16`` for a word 16 bytes into a struct."""
        w = self.words[0]
        return f"arg{w.param}" if w.param_offset == 0 else f"arg{w.param}.w{w.param_offset}"


def plan_regions(words: Sequence[PointerWord], table: BlockTable,
                 driver_range: Callable[[int], tuple[int, int] | None]) -> list[PlannedRegion]:
    """One region per distinct extent the words point into; overlapping extents merged.

    A word inside an allocator block takes the block; otherwise ``driver_range`` (the
    driver's allocation holding it) decides, and a word it does not recognise is no pointer.
    """
    found: dict[tuple[int, int], PlannedRegion] = {}
    for w in words:
        block = table.find(w.value)
        if block is None:
            rng = driver_range(w.value)
            if rng is None:
                continue
            block = Block(rng[0], rng[1], rng[0], rng[1], "driver-range")
        key = (block.start, block.size)
        region = found.get(key)
        if region is None:
            region = found[key] = PlannedRegion(block.start, block.size, block.segment_start,
                                                block.segment_size, block.source)
        region.words.append(w)
    merged: list[PlannedRegion] = []
    for r in sorted(found.values(), key=lambda r: (r.start, -r.size)):
        last = merged[-1] if merged else None
        if last is not None and r.start < last.end:
            end = max(last.end, r.end)
            last.size = end - last.start
            last.segment_start = min(last.segment_start, r.segment_start)
            last.segment_size = max(last.segment_start + last.segment_size,
                                    r.segment_start + r.segment_size) - last.segment_start
            last.words.extend(r.words)
            last.words.sort(key=lambda w: w.offset)
            if r.source != last.source:
                last.source = "merged"
        else:
            r.words.sort(key=lambda w: w.offset)
            merged.append(r)
    return merged


def segment_bytes(regions: Iterable[PlannedRegion]) -> int:
    """Bytes of the distinct segments holding ``regions``: what storing whole allocator
    segments (the state before narrowing) would have cost."""
    spans = sorted({(r.segment_start, r.segment_start + r.segment_size) for r in regions})
    total, end = 0, -1
    for lo, hi in spans:
        if lo >= end:
            total += hi - lo
        elif hi > end:
            total += hi - end
        end = max(end, hi)
    return total


def pointer_params(regions: Iterable[PlannedRegion],
                   layout: Sequence[tuple[int, int]]) -> set[int]:
    """Indices of parameters that are exactly one 8-byte pointer into a region."""
    out = set()
    for r in regions:
        for w in r.words:
            if w.param_offset == 0 and w.param < len(layout) and layout[w.param][1] == 8:
                out.add(w.param)
    return out
