"""Who wrote each allocation: the per-block writer log behind regenerable regions.

While a capture session traces a program, every launch (and every memset, device-to-device
copy or host-to-device copy) is fed here with the allocator blocks its pointer words hit and,
where the tracer knows it, the blocks it wrote (their digests changed across the launch; a
launch fed without ``wrote`` is taken to have written every block it hit). Per block, the log
keeps the ordered list of launches that wrote it since the block appeared (``appeared``: a
new allocation at that address forgets the old one's writers).

``chain(block)`` applies the rule of issue 48: a block whose writers form a chain rooted only
in launches that read no block (seeded generators, fills, memsets, aranges), through launches
whose inputs are themselves regenerable blocks, is regenerable; the chain is its writers in
order. Each writer must have written that block alone (re-running it would write others),
every block it read must still hold what it read (not written, nor reallocated, since), and
a host-to-device copy into the block since it appeared makes it host data: never a chain.
``chains(blocks)`` applies the rule over a snapshot's blocks at once (a chain may read only
blocks of the same snapshot that are themselves regenerable), ready for
``kpair.snapshot.SnapshotWriter.chain``.

The rule is necessary, not sufficient: a first writer that fills only part of its block
leaves the rest as it was, which a replay (zero-filled, then the chain) does not reproduce.
Capture confirms each chain by running it again (``kpair.regen.regenerate`` on the captured
placement, or as ``kpair.record`` does on the host) before it stores the block as one.
Pure: keys are any hashable block identity (``Block.start`` in the tracer); tested without a
GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Iterable
from dataclasses import dataclass, field

from .launches import KernargError, LaunchInfo, kernarg_bytes
from .regions import Block, BlockTable, pointer_words

__all__ = ["MAX_WRITES", "Chain", "LaunchRecord", "LiveBlocks", "WriterLog"]

#: A block written more often than this since it appeared is no longer followed (host data
#: until it appears again): its chain would be long to store and to run, and the log of a
#: long program (a training loop) must not grow without end.
MAX_WRITES = 256


@dataclass(frozen=True)
class LaunchRecord:
    """One traced operation, as small as a single-dispatch launch record: the kernel's name
    and handle, its code object (the tracer's id for the module image), the kernarg bytes as
    launched and the geometry; ``kind`` "memset" or "copy" for the driver's own operations
    (then ``detail`` holds their fields: dst, src, size, value, element_size)."""

    kernel_name: str
    code: str = ""
    kernarg: bytes = b""
    grid: tuple[int, int, int] = (1, 1, 1)
    block: tuple[int, int, int] = (1, 1, 1)
    dynamic_shared_bytes: int = 0
    kernel: int = 0
    kind: str = "kernel"
    detail: tuple[tuple[str, int], ...] = ()
    #: the kernarg's parameters, (offset, size) each, as the tracer rebuilt it
    layout: tuple[tuple[int, int], ...] = ()
    #: launch attributes as captured (``LaunchAttribute``s: a cluster shape)
    attributes: tuple = ()


@dataclass(frozen=True)
class Chain:
    """A regenerable block: the launches that make it, in order, and the other blocks they
    read (each regenerable in the same snapshot)."""

    ops: tuple[LaunchRecord, ...]
    reads: tuple[Hashable, ...] = ()


@dataclass
class _Write:
    seq: int
    record: LaunchRecord
    wrote: frozenset
    reads: tuple[tuple[Hashable, int], ...]   # (block, its generation when read)


@dataclass
class _Block:
    generation: int = 0
    writes: list[_Write] = field(default_factory=list)
    host: bool = False   # a host-to-device copy wrote it since it appeared


class WriterLog:
    """Per block, the ordered launches that wrote it since it appeared."""

    def __init__(self):
        self._blocks: dict[Hashable, _Block] = {}
        self._seq = 0

    def _block(self, key: Hashable) -> _Block:
        return self._blocks.setdefault(key, _Block())

    def appeared(self, key: Hashable) -> None:
        """A new allocation at ``key`` (the allocator handed the memory out again): its
        writers so far were another tensor's."""
        b = self._block(key)
        b.generation += 1
        b.writes, b.host = [], False

    def host_write(self, key: Hashable) -> None:
        """Bytes copied from the host into ``key``: host data, never regenerable until the
        block appears again."""
        self._seq += 1
        self._block(key).host = True

    @property
    def seq(self) -> int:
        """Operations fed so far: ``chains(..., upto=seq)`` later sees the log as it is now."""
        return self._seq

    def fresh(self, key: Hashable) -> bool:
        """Nothing wrote ``key`` since it appeared (nor the host)."""
        b = self._blocks.get(key)
        return b is None or (not b.writes and not b.host)

    def launch(self, record: LaunchRecord, hits: Iterable[Hashable],
               wrote: Iterable[Hashable] | None = None, *, guess: bool = False) -> None:
        """A launch in program order: ``hits`` the blocks its pointer words reach, ``wrote``
        those it changed (None: every block it hits); the others it read. ``guess`` (with
        ``wrote`` None): where some of the hits are fresh (nothing wrote them since they
        appeared), the launch is taken to have written those alone and read the others: an
        out-of-place kernel writes the new tensor it was given. The guess is checked later
        (a chain is confirmed against the captured bytes' sha256 before anyone relies on it)."""
        hits = frozenset(hits)
        if guess and wrote is None:
            fresh = frozenset(k for k in hits if self.fresh(k))
            wrote = fresh or None
        self._seq += 1
        written = hits if wrote is None else frozenset(wrote) & hits
        reads = tuple(sorted(((k, self._block(k).generation) for k in hits - written),
                             key=repr))
        entry = _Write(self._seq, record, written, reads)
        for k in written:
            b = self._block(k)
            if b.host:
                continue   # not followed until it appears again
            b.writes.append(entry)
            if len(b.writes) > MAX_WRITES:
                b.writes, b.host = [], True

    def unseen(self) -> None:
        """A launch whose arguments could not be read: it may have written any block, so no
        block known so far is followed any more (until it appears again)."""
        self._seq += 1
        for b in self._blocks.values():
            b.host = True

    def feed(self, launch: LaunchInfo, kernel, blocks: BlockTable, *,
             wrote: Iterable[Hashable] | None = None, guess: bool = False) -> None:
        """One traced launch as the tracer sees it at entry (``LaunchInfo``, the session's
        ``KernelInfo``, the allocator's ``BlockTable``): its kernarg rebuilt, the blocks its
        pointer words hit (keyed by ``Block.start``), fed to ``launch``. A launch whose
        kernarg cannot be rebuilt is ``unseen``."""
        try:
            blob, layout, _ = kernarg_bytes(launch, kernel.layout)
        except KernargError:
            self.unseen()
            return
        hits = set()
        for word in pointer_words(blob, layout):
            found = blocks.find(word.value)
            if found is not None:
                hits.add(found.start)
        code = ",".join(hex(h) for h in kernel.module_handles if h)
        self.launch(LaunchRecord(kernel.name, code, blob, tuple(launch.grid),
                                 tuple(launch.block), launch.dynamic_shared_bytes,
                                 kernel.handle, layout=tuple(map(tuple, layout)),
                                 attributes=tuple(launch.attributes)),
                    hits, wrote, guess=guess)

    def memset(self, key: Hashable, dst: int, size: int, value: int,
               element_size: int) -> None:
        """A memset of ``size`` bytes at ``dst``, inside block ``key``: it reads nothing."""
        self.launch(LaunchRecord("memset", kind="memset", detail=(
            ("dst", dst), ("size", size), ("value", value), ("element_size", element_size))),
            {key}, {key})

    def copy(self, dst_key: Hashable, src_key: Hashable, dst: int, src: int,
             size: int) -> None:
        """A device-to-device copy from block ``src_key`` into block ``dst_key``."""
        self.launch(LaunchRecord("copy", kind="copy", detail=(
            ("dst", dst), ("src", src), ("size", size))), {dst_key, src_key}, {dst_key})

    def writers(self, key: Hashable) -> list[LaunchRecord]:
        """The launches that wrote ``key`` since it appeared, in order."""
        b = self._blocks.get(key)
        return [] if b is None else [w.record for w in b.writes]

    def chain(self, key: Hashable, within: Collection[Hashable] | None = None
              ) -> list[LaunchRecord] | None:
        """The launches that regenerate ``key`` (its writers in order), or None when the
        rule does not hold; ``within``: the blocks a chain may read (a snapshot's; None:
        any block the log knows)."""
        found = self._chain(key, within, set(), None)
        return None if found is None else list(found.ops)

    def chains(self, blocks: Collection[Hashable], *, upto: int | None = None
               ) -> dict[Hashable, Chain]:
        """Every block of ``blocks`` (a snapshot's) that is regenerable within them;
        ``upto``: the log as it was when ``seq`` was ``upto`` (a range's start: the
        launches of the range itself make no chain of its pre-state)."""
        out = {}
        for key in blocks:
            found = self._chain(key, blocks, set(), upto)
            if found is not None:
                out[key] = found
        return out

    def _chain(self, key: Hashable, within: Collection[Hashable] | None,
               visiting: set, upto: int | None) -> Chain | None:
        b = self._blocks.get(key)
        if b is None or b.host or key in visiting:
            return None
        writes = b.writes if upto is None else [w for w in b.writes if w.seq <= upto]
        if not writes or (within is not None and key not in within):
            return None
        visiting = visiting | {key}
        reads: dict[Hashable, None] = {}
        for w in writes:
            if w.wrote != {key}:
                return None   # re-running it would write other blocks too
            for other, generation in w.reads:
                q = self._blocks[other]
                if q.generation != generation or q.host:
                    return None   # reallocated or overwritten from the host since
                if any(w.seq <= later.seq and (upto is None or later.seq <= upto)
                       for later in q.writes):
                    return None   # it no longer holds what this launch read
                if self._chain(other, within, visiting, upto) is None:
                    return None
                reads[other] = None
        return Chain(tuple(w.record for w in writes), tuple(reads))


def _live(block: Block) -> bool:
    return not block.state or block.state.startswith("active")


class LiveBlocks:
    """The allocator's blocks as the tracer looks them up for every launch, cheaply: a cached
    ``BlockTable``, refreshed (one allocator snapshot, ``source()``) only when an address
    misses it or lands in a block the cache holds as free. Each refresh tells ``log`` which
    blocks appeared (new, resized, or allocated again since the cache saw them free). A block
    freed and handed out again at the same place and size between two refreshes is not seen
    to appear: its new writers extend the old ones' list, which the sha256 check of every
    chain catches where it matters. Memory outside the allocator's blocks that the driver
    knows (``driver_range``) is its own block, keyed by the allocation's start."""

    def __init__(self, source: Callable[[], BlockTable], log: WriterLog,
                 driver_range: Callable[[int], tuple[int, int] | None] | None = None):
        self.source, self.log, self.driver_range = source, log, driver_range
        self.table = BlockTable()
        self.refreshes = 0
        #: driver allocations outside the allocator's blocks, found once (no refresh later)
        self.outside = BlockTable()

    def refresh(self) -> None:
        new = self.source()
        old = {b.start: b for b in self.table.blocks}
        for b in new.blocks:
            o = old.get(b.start)
            if _live(b) and (o is None or o.size != b.size or not _live(o)):
                self.log.appeared(b.start)
        self.table = new
        self.refreshes += 1

    def find(self, address: int) -> Block | None:
        b = self.table.find(address)
        if b is not None and _live(b):
            return b
        b = self.outside.find(address)
        if b is not None:
            return b
        rng = self.driver_range(address) if self.driver_range is not None else True
        if rng is None:
            return None   # not device memory: a scalar that looks like an address
        self.refresh()
        b = self.table.find(address)
        if b is None and isinstance(rng, tuple):
            b = Block(rng[0], rng[1], rng[0], rng[1], "driver-range")
            self.outside = BlockTable([*self.outside.blocks, b])
        return b
