"""Regenerable regions of a CUDA capture: the writer log's chains turned into ``Region.regen``.

A capture session (one dispatch, or a range) is about to store a region's pre-state. When
the tracer's ``WriterLog`` holds a chain for the allocator block the region is (the region
is exactly one block), and every operation of that chain can be recorded (its code object
is among the module images the tracer saw), the region is stored as that chain plus the
captured pre-state's sha256 and ``digest64`` (a replay checks the region by it on the GPU)
instead of its bytes (``kpair.snapshot.SnapshotWriter.chain``).
A chain may read only other regions of the same snapshot that are themselves stored as
chains; a region whose chain cannot be recorded drops the chains that read it.

Capture cannot run a chain again where it was made (that memory holds the program's
tensors), so each chain is confirmed afterwards: ``kpair capture`` regenerates them on the
device once the program has ended (``verify``) and stores as bytes every region whose chain
does not make its captured sha256. Until then the captured bytes of each chained region
wait in the capture's pool (``pending``), and are dropped once verified. ``stored_region``
builds each region as capture stores it, a large written region's post-state kept as
digests only (``--post-digest-over``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..snapshot import ChainOp, Launch, Op, Param, Regen, Region, detect_format
from ..snapshot.store import state_digest
from .modules import ModuleRegistry
from .regions import BlockTable
from .writers import LaunchRecord, WriterLog

__all__ = ["DEFAULT_POST_DIGEST_OVER", "PendingRegion", "chain_regions", "stored_region"]

#: ``kpair capture --post-digest-over``'s default: a written region larger than this keeps
#: its post-state as digests only (``Region.post_digest``), no bytes.
DEFAULT_POST_DIGEST_OVER = 64 << 20


@dataclass(frozen=True)
class PendingRegion:
    """A region about to be stored: its name, captured address and pre-state bytes."""

    name: str
    address: int
    pre: bytes

    @property
    def end(self) -> int:
        return self.address + len(self.pre)


def stored_region(writer, name: str, address: int, pre: bytes, post: bytes,
                  regen: Regen | None = None, *, role: str | None = None,
                  dtype: str | None = None, post_digest_over: int | None = None) -> Region:
    """The ``Region`` a capture stores for ``pre`` and ``post`` (``writer``: the snapshot's
    ``SnapshotWriter``): the pre-state as ``regen`` (its chain) or a blob; the post-state left
    out when unchanged beside a chain, kept as digests only (``writer.digest``: size, sha256,
    digest64, no blob) when the region was written and is larger than ``post_digest_over``
    bytes (None: never), else a blob."""
    size = len(pre)
    written = post != pre
    if written and post_digest_over is not None and size > post_digest_over:
        after: dict = {"post_digest": writer.digest(post)}
    elif regen is not None and not written:
        after = {}
    else:
        after = {"post_blob": writer.put(post)}
    if regen is not None:
        return Region(name, address, size, dtype=dtype, role=role, regen=regen, **after)
    return Region(name, address, size, writer.put(pre), dtype=dtype, role=role, **after)


def _handles(code: str) -> tuple[int, ...]:
    return tuple(int(h, 16) for h in code.split(",") if h)


def _op(record: LaunchRecord, registry: ModuleRegistry, allowed: Sequence[PendingRegion]
        ) -> ChainOp | Op | None:
    """The chain operation for ``record`` (None: its code object is unknown)."""
    if record.kind == "memset":
        d = dict(record.detail)
        return Op(kind="memset", dst=d["dst"], size=d["size"], value=d["value"],
                  element_size=d["element_size"])
    if record.kind == "copy":
        d = dict(record.detail)
        return Op(kind="copy", dst=d["dst"], src=d["src"], size=d["size"])
    found = registry.find(record.kernel_name, _handles(record.code))
    if found is None:
        return None
    try:
        fmt = detect_format(found.image)
    except Exception:  # an image kpair cannot read: no chain through it
        return None
    params = []
    for i, (offset, size) in enumerate(record.layout):
        kind = "bytes"
        if size == 8 and offset + 8 <= len(record.kernarg):
            (value,) = struct.unpack_from("<Q", record.kernarg, offset)
            if any(c.address <= value < c.end for c in allowed):
                kind = "pointer"
        params.append(Param(offset, size, kind, f"arg{i}"))
    return ChainOp(found.image, fmt, record.kernel_name,
                   Launch(record.grid, record.block, record.dynamic_shared_bytes,
                          record.attributes), record.kernarg, tuple(params))


def chain_regions(log: WriterLog | None, upto: int, candidates: Sequence[PendingRegion],
                  table: BlockTable, registry: ModuleRegistry,
                  chain: Callable[..., Regen]) -> dict[str, Regen]:
    """Region name -> its ``Regen`` (``chain`` is the snapshot writer's ``chain``) for every
    candidate stored as a chain: exactly one allocator block of ``table``, regenerable in
    ``log`` as it was at ``upto`` within the candidates, each operation recordable."""
    if log is None or not candidates:
        return {}
    by_key = {}
    for c in candidates:
        block = table.find(c.address)
        if block is not None and block.start == c.address and block.end == c.end:
            by_key[c.address] = c
    found = log.chains(set(by_key), upto=upto)
    ops: dict[int, list] = {}
    for key, ch in found.items():
        allowed = [by_key[key]] + [by_key[k] for k in ch.reads]
        built = [_op(r, registry, allowed) for r in ch.ops]
        if all(b is not None for b in built):
            ops[key] = built
    # A chain reading a region that is stored as bytes is dropped, until none is left.
    while True:
        drop = [k for k in ops if any(r not in ops for r in found[k].reads)]
        if not drop:
            break
        for k in drop:
            del ops[k]
    out = {}
    for key, built in ops.items():
        c = by_key[key]
        d = state_digest(c.pre)   # sha256 and digest64 side by side, over the one copy
        out[c.name] = chain(built, d.sha256, len(c.pre),
                            reads=[by_key[k].name for k in found[key].reads],
                            digest64=d.digest64)
    return out
