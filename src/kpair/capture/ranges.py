"""Range capture: every operation between an NVTX push and its pop, as one range snapshot.

``kpair capture --range NAME -o DIR -- python prog.py`` attaches a ``RangeSession`` instead
of a per-dispatch ``CaptureSession``. The tracer feeds it NVTX pushes and pops (CUPTI's NVTX
domain; ``torch.cuda.nvtx.range(NAME)``) and ``kpair.mark`` begins/ends, kernel launches,
memsets and copies. While a chosen range is open (the first occurrence of its name, or the
``nth``), each operation is recorded in order:

- a kernel launch: its code object, launch, kernarg (as the per-dispatch path rebuilds them);
  a memset (``cuMemsetD8/16/32[Async]``) or a device-to-device copy as an operation of kind
  ``memset``/``copy``; the stream it was issued on;
- the regions it names (kernarg pointer words, a memset's destination, a copy's source and
  destination), narrowed to allocator blocks as for one dispatch. The range's regions are the
  union of these extents (overlapping extents merged). A byte's pre-state is its value the
  first time an operation of the range names it: the context is synchronised and the bytes
  not named before are read, before the operation is issued.

At the range's end the context is synchronised once more and every region read (its
post-state). A region is written when its bytes changed, a memset or copy of the range wrote
it, it holds a declared output, or the allocator handed it out inside the range (no live
block held it when the range began: a second pass of the same forward finds its outputs'
blocks already holding what it writes, so unchanged bytes prove nothing). Roles: a region
not written is ``in``; a written one still allocated at the end (the PyTorch allocator's
snapshot then, or memory outside it) is ``out`` when it holds a declared output
(``kpair.mark(..., outputs=)``; the manifest's ``outputs`` gives each declared tensor's span
inside its region), else ``inout``; a written one whose allocator block was freed before the
end is scratch (its size only).

A range is refused, with the reason in ``capture.json`` (``ranges[]``, status ``refused``),
when an operation cannot be replayed from the snapshot: a host-to-device copy (its source is
host memory the snapshot does not hold), a 2D/3D/peer/batched copy, a 2D memset, a CUDA graph
launch, a launch on a stream being captured into a graph, a kernel whose code object is
unknown; when its regions would exceed the capture's ``max_region_bytes`` (with the size it
reached); when it launches no kernel; or when it never ends. Device-to-host copies change no
device memory and are left out (counted).

The driver, the module registry and the allocator table are passed in (as for
``CaptureSession``), so the state machine runs in tests on a driver that serves memory from a
dict.
"""

from __future__ import annotations

import bisect
import os
import re
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

from .. import __version__
from .._util import human_bytes, utc_now
from ..snapshot import (
    CodeObject,
    DeadSpan,
    Kernarg,
    Launch,
    Manifest,
    Op,
    OutputSpan,
    Param,
    ScratchRegion,
    detect_format,
)
from .chains import PendingRegion, chain_regions, stored_region
from .filters import Filter
from .launches import KernargError, LaunchInfo, kernarg_bytes
from .regions import BlockTable, PointerWord, plan_regions, pointer_params, pointer_words
from .session import CaptureSession, KernelInfo
from .summary import RangeRecord

_NAME = re.compile(r"[^A-Za-z0-9_.\-]")
#: This capturing process, as a range snapshot's provenance names it (``process``): every
#: range of one ``kpair capture`` run carries it, so ``kpair pair --opt-capture`` binds them.
PROCESS = uuid.uuid4().hex
_SIDES = ("dst", "src")


def snapshot_dirname(name: str) -> str:
    """The directory of range ``name``'s snapshot (characters a file name cannot hold: ``_``)."""
    return _NAME.sub("_", name)[:128] or "range"


@dataclass(frozen=True)
class MemoryOp:
    """A memset or a copy as the tracer decoded it. ``kind``: ``memset``, ``copy`` (device to
    device), ``htod``, ``dtoh``, ``copy?`` (unified cuMemcpy: the session asks the driver which
    side is device memory) or ``unsupported`` (2D/3D/peer/batched, graph launch)."""

    api: str
    kind: str
    dst: int = 0
    src: int = 0
    size: int = 0
    value: int = 0
    element_size: int = 1
    stream: int = 0


class _Refused(Exception):
    """This range cannot be captured; the reason goes into capture.json."""


@dataclass(eq=False)   # one recording is itself: compared by identity
class _Recording:
    name: str
    occurrence: int
    thread: int
    source: str
    record: dict
    started: float
    ops: list[dict] = field(default_factory=list)
    #: every extent an operation named: (start, end, name of the first one to name it)
    extents: list[tuple[int, int, str]] = field(default_factory=list)
    #: first-seen bytes: sorted, disjoint (start, bytes)
    pieces: list[tuple[int, bytes]] = field(default_factory=list)
    outputs: list[tuple[int, int]] = field(default_factory=list)
    streams: Counter = field(default_factory=Counter)
    left_out: Counter = field(default_factory=Counter)
    upto: int = 0   # the writer log's seq when the range began
    #: the allocator's blocks when the range began: memory no live block held then was
    #: handed out inside the range (written by it, whatever its bytes)
    begin: BlockTable = field(default_factory=BlockTable)
    #: [dst, dst + size) of every memset and copy of the range: bytes it certainly writes
    writes: list[tuple[int, int]] = field(default_factory=list)

    @property
    def stored(self) -> int:
        return sum(len(b) for _, b in self.pieces)

    def uncovered(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The parts of [lo, hi) no piece holds yet."""
        out, cursor = [], lo
        starts = [s for s, _ in self.pieces]
        i = max(bisect.bisect_right(starts, lo) - 1, 0)
        for s, b in self.pieces[i:]:
            e = s + len(b)
            if e <= cursor:
                continue
            if s >= hi:
                break
            if s > cursor:
                out.append((cursor, min(s, hi)))
            cursor = max(cursor, e)
            if cursor >= hi:
                break
        if cursor < hi:
            out.append((cursor, hi))
        return out

    def add_piece(self, start: int, data: bytes) -> None:
        bisect.insort(self.pieces, (start, data), key=lambda p: p[0])

    def bytes_of(self, lo: int, hi: int) -> bytes:
        """[lo, hi) assembled from the pieces (which cover it)."""
        out = bytearray(hi - lo)
        for s, b in self.pieces:
            e = s + len(b)
            if e <= lo or s >= hi:
                continue
            a, z = max(s, lo), min(e, hi)
            out[a - lo:z - lo] = b[a - s:z - s]
        return bytes(out)


def merge_extents(extents: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Overlapping extents merged (touching ones are separate buffers and stay apart); each
    merged span keeps the name of the extent that was named first."""
    merged: list[list] = []
    for i, (lo, hi, name) in sorted(enumerate(extents), key=lambda x: (x[1][0], -x[1][1])):
        if merged and lo < merged[-1][1]:
            last = merged[-1]
            last[1] = max(last[1], hi)
            if i < last[3]:
                last[2], last[3] = name, i
        else:
            merged.append([lo, hi, name, i])
    return [(lo, hi, name) for lo, hi, name, _ in merged]


def allocated(table: BlockTable, lo: int, hi: int) -> bool:
    """Whether any byte of [lo, hi) is in an allocated block at the range's end. Memory the
    allocator does not know (an empty table, a driver range) counts as allocated."""
    if not table.blocks:
        return True
    i = max(bisect.bisect_right(table._starts, lo) - 1, 0)
    known = False
    for b in table.blocks[i:]:
        if b.start >= hi:
            break
        if b.end <= lo:
            continue
        known = True
        if b.state.startswith("active"):
            return True
    return not known


def _overlapping(table: BlockTable, lo: int, hi: int) -> list:
    i = max(bisect.bisect_right(table._starts, lo) - 1, 0)
    out = []
    for b in table.blocks[i:]:
        if b.start >= hi:
            break
        if b.end > lo:
            out.append(b)
    return out


def fresh(begin: BlockTable, end: BlockTable, lo: int, hi: int) -> bool:
    """Whether [lo, hi) was handed out by the allocator inside the range: no block live when
    the range began held any of it, and the allocator knew it then (a free block) or knows
    it at the end (a segment it made inside the range). Such memory held nothing of the
    program's when the range began: the range writes it, even where it writes the bytes a
    warm-up run left there (the caching allocator hands the same blocks out again, so an
    identical second pass finds its outputs already in place). Without an allocator table
    (memory outside PyTorch's allocator) nothing is fresh."""
    if not begin.blocks:
        return False
    before = _overlapping(begin, lo, hi)
    if any(not b.state or b.state.startswith("active") for b in before):
        return False
    return bool(before) or bool(_overlapping(end, lo, hi))


def dead_bytes(table: BlockTable, lo: int, hi: int,
               keep: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The bytes of [lo, hi) in blocks the allocator holds free at the range's end (memory
    it handed out again inside the range: an intermediate freed before the end), outside
    ``keep`` (the declared outputs' absolute spans): (offset from ``lo``, size) each, merged.
    Memory the allocator does not know is never dead."""
    spans = []
    for b in _overlapping(table, lo, hi):
        if not b.state or b.state.startswith("active"):
            continue
        a, z = max(b.start, lo), min(b.end, hi)
        cuts = sorted((max(k0, a), min(k0 + kn, z)) for k0, kn in keep
                      if k0 < z and a < k0 + kn)
        for c0, c1 in cuts:
            if a < c0:
                spans.append((a, c0))
            a = max(a, c1)
        if a < z:
            spans.append((a, z))
    merged: list[list[int]] = []
    for a, z in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], z)
        else:
            merged.append([a, z])
    return [(a - lo, z - a) for a, z in merged]


def written_first(rec: _Recording, lo: int, hi: int) -> bool:
    """Whether the first operation of the range to name any byte of [lo, hi) is a memset or
    a device-to-device copy that writes all of it (and does not read it): the range wrote
    the region before reading it, as far as capture can tell (a kernel's reads are not seen).
    """
    for a, z, name in rec.extents:
        if z <= lo or a >= hi:
            continue
        index, _, side = name.partition(".")
        op = rec.ops[int(index[2:])] if index[2:].isdigit() and int(index[2:]) < len(rec.ops) \
            else None
        if op is None or op["kind"] not in ("memset", "copy") or side != "dst":
            return False
        if op["kind"] == "copy" and op["src"] < hi and lo < op["src"] + op["size"]:
            return False
        return op["dst"] <= lo and hi <= op["dst"] + op["size"]
    return False


class RangeSession(CaptureSession):
    """Captures the ranges named in ``ranges`` (their ``nth`` occurrence) into
    ``<out>/<name>/``; ``capture.json`` lists them under ``ranges``."""

    def __init__(self, out, ranges: list[str], *, nth: int = 1, driver, registry,
                 blocks=None, max_region_bytes: int, command=None, environment=None,
                 metadata=None, level: int = 1, writers=None, store_bytes: bool = False):
        self.wanted = list(dict.fromkeys(ranges))
        self.nth = nth
        self.range_records: list[dict] = [
            {"name": n, "status": "waiting", "occurrence": nth} for n in self.wanted]
        super().__init__(out, Filter(None, 1, None), driver=driver, registry=registry,
                         blocks=blocks, max_region_bytes=max_region_bytes, command=command,
                         environment=environment, metadata=metadata, level=level,
                         writers=writers, store_bytes=store_bytes)
        self.occurrences: Counter[str] = Counter()
        self.stacks: dict[int, list[tuple[str, _Recording | None]]] = {}
        self.active: list[_Recording] = []
        self._ops: dict[tuple[int, int], list[tuple[_Recording, dict]]] = {}

    # ---------------------------------------------------------------- range events

    def _record_of(self, name: str) -> dict:
        return next(r for r in self.range_records if r["name"] == name)

    def range_begin(self, name: str, thread: int, source: str = "nvtx") -> None:
        with self._lock:
            rec = None
            if name in self.wanted and not self.closed:
                self.occurrences[name] += 1
                record = self._record_of(name)
                if self.occurrences[name] == self.nth and record["status"] == "waiting":
                    record.update(status="capturing", source=source)
                    rec = _Recording(name, self.nth, thread, source, record, time.monotonic(),
                                     upto=self.writers.seq if self.writers is not None else 0,
                                     begin=self.blocks())
                    self.active.append(rec)
            self.stacks.setdefault(thread, []).append((name, rec))

    def range_end(self, name: str | None, thread: int, outputs=(), *, failed: bool = False
                  ) -> None:
        """End the innermost open range of ``thread`` (named ``name`` when given: a mark
        knows its name, an NVTX pop does not)."""
        with self._lock:
            stack = self.stacks.get(thread) or []
            at = len(stack) - 1
            if name is not None:
                while at >= 0 and stack[at][0] != name:
                    at -= 1
            if at < 0:
                return   # a pop with nothing open (pushed before capture began)
            _, rec = stack.pop(at)
            if rec is None or rec not in self.active:
                return
            rec.outputs.extend(outputs)
            self.active.remove(rec)
            if failed:
                self._refuse(rec, "the marked block raised an exception before the range "
                                  "ended")
                return
            try:
                self._finish(rec)
            except _Refused as e:
                self._refuse(rec, str(e))
            except Exception as e:  # a bug here must not take the user's program down
                self._refuse(rec, f"internal error while capturing: {e!r}")

    # ---------------------------------------------------------------- operations

    def launch_enter(self, launch: LaunchInfo, kernel: KernelInfo, correlation: int) -> None:
        with self._lock:
            self.launches += 1
            self.seen[kernel.name] += 1
            if not self.active:
                return
            for rec in list(self.active):
                try:
                    op = self._kernel_op(rec, launch, kernel)
                except _Refused as e:
                    self._refuse(rec, str(e))
                    continue
                except Exception as e:
                    self._refuse(rec, f"internal error while capturing: {e!r}")
                    continue
                self._ops.setdefault((threading.get_ident(), correlation), []).append(
                    (rec, op))

    def launch_exit(self, correlation: int, status: int) -> None:
        with self._lock:
            for rec, op in self._ops.pop((threading.get_ident(), correlation), []):
                if status and rec in self.active:
                    self._refuse(rec, f"operation {op['index']} ({op['label']}) failed to "
                                      f"launch: {self.driver.error_name(status)}")

    def memory_op(self, mop: MemoryOp) -> None:
        with self._lock:
            if not self.active:
                return
            for rec in list(self.active):
                try:
                    self._memory_op(rec, mop)
                except _Refused as e:
                    self._refuse(rec, str(e))
                except Exception as e:
                    self._refuse(rec, f"internal error while capturing: {e!r}")

    def _memory_op(self, rec: _Recording, mop: MemoryOp) -> None:
        kind = mop.kind
        if kind == "copy?":
            dev_dst = self.driver.address_range(mop.dst) is not None
            dev_src = self.driver.address_range(mop.src) is not None
            kind = {(True, True): "copy", (True, False): "htod",
                    (False, True): "dtoh"}.get((dev_dst, dev_src), "hostcopy")
        if kind in ("dtoh", "hostcopy"):
            rec.left_out[mop.api] += 1   # no device memory changes
            return
        if kind == "htod":
            raise _Refused(f"a host-to-device copy ({mop.api}, {mop.size} bytes) inside the "
                           "range: its source is host memory the snapshot does not hold "
                           "(create the inputs before the range begins)")
        if kind == "unsupported":
            raise _Refused(f"{mop.api} inside the range: kpair replays kernels, 1D memsets "
                           "and device-to-device copies only")
        if not mop.size:
            rec.left_out[mop.api] += 1
            return
        if mop.stream and self.driver.stream_capturing(mop.stream):
            raise _Refused(f"{mop.api} on a stream being captured into a CUDA graph")
        index = len(rec.ops)
        words = [PointerWord(0, mop.dst, 0, 0)]
        if kind == "copy":
            words.append(PointerWord(8, mop.src, 1, 0))
        planned = plan_regions(words, self.blocks(), self.driver.address_range)
        covered = {w.value for r in planned for w in r.words}
        if mop.dst not in covered or (kind == "copy" and mop.src not in covered):
            raise _Refused(f"operation {index} ({mop.api}) names memory that is not device "
                           "memory the driver knows")
        for r in planned:
            if any(w.value + mop.size > r.end for w in r.words):
                raise _Refused(f"operation {index} ({mop.api}, {mop.size} bytes) reaches "
                               "past the end of its allocation")
        self._name_extents(rec, [(r.start, r.end, f"op{index}.{_SIDES[r.words[0].param]}")
                                 for r in planned])
        op = {"index": index, "kind": kind, "label": kind, "api": mop.api, "dst": mop.dst,
              "size": mop.size, "stream": mop.stream}
        if kind == "copy":
            op["src"] = mop.src
        else:
            op.update(value=mop.value, element_size=mop.element_size)
        rec.ops.append(op)
        rec.writes.append((mop.dst, mop.dst + mop.size))
        rec.streams[mop.stream] += 1

    def _kernel_op(self, rec: _Recording, launch: LaunchInfo, k: KernelInfo) -> dict:
        index = len(rec.ops)
        label = f"operation {index} ({k.name})"
        if launch.stream and self.driver.stream_capturing(launch.stream):
            raise _Refused(f"{label} is launched on a stream being captured into a CUDA "
                           "graph: synchronising would break that capture")
        found = self.registry.find(k.name, k.module_handles)
        if found is None:
            raise _Refused(f"{label}: no loaded code object holds this kernel (install "
                           "capture before CUDA initialises, with CUDA_MODULE_LOADING=EAGER; "
                           "`kpair capture` does both)")
        try:
            fmt = detect_format(found.image)
        except Exception as e:
            raise _Refused(f"{label}: its code object is in an unknown format ({e})") from None
        try:
            blob, layout, how = kernarg_bytes(launch, k.layout)
        except KernargError as e:
            raise _Refused(f"{label}: {e}") from None
        planned = plan_regions(pointer_words(blob, layout), self.blocks(),
                               self.driver.address_range)
        self._name_extents(rec, [(r.start, r.end, f"op{index}.{r.name}") for r in planned])
        pointers = pointer_params(planned, layout)
        params = tuple(Param(o, s, "pointer" if i in pointers else "bytes", f"arg{i}")
                       for i, (o, s) in enumerate(layout))
        op = {"index": index, "kind": "kernel", "label": k.name, "image": found.image,
              "format": fmt, "kernel": k.name, "demangled": k.demangled, "kernarg": blob,
              "params": params, "api": launch.api, "stream": launch.stream,
              "launch": Launch(launch.grid, launch.block, launch.dynamic_shared_bytes,
                               launch.attributes),
              "module_id": found.module_id, "code_object_match": found.how,
              "kernarg_from": how}
        meta = self.metadata(k.handle, k.name) if self.metadata is not None else None
        if meta:   # a Triton launch: what kpair optimize --range retunes it from (no PTX)
            op["triton"] = {key: v for key, v in meta.items() if key != "ptx"}
        rec.ops.append(op)
        rec.streams[launch.stream] += 1
        return op

    def _name_extents(self, rec: _Recording, extents: list[tuple[int, int, str]]) -> None:
        """Record the extents; read (after a synchronise) the bytes of them no earlier
        operation named: their pre-state. Refuse past ``max_region_bytes``."""
        rec.extents.extend(extents)
        new = merge_extents([(*gap, "") for lo, hi, _ in extents
                             for gap in rec.uncovered(lo, hi)])
        if not new:
            return
        total = rec.stored + sum(hi - lo for lo, hi, _ in new)
        if total > self.max_region_bytes:
            raise _Refused(f"the range's regions reach {total} bytes "
                           f"({human_bytes(total)}), over the capture's max region bytes "
                           f"({human_bytes(self.max_region_bytes)}); raise "
                           "--max-region-bytes to capture it")
        code = self.driver.synchronize()
        if code:
            raise _Refused(f"cuCtxSynchronize before operation {len(rec.ops)} failed: "
                           f"{self.driver.error_name(code)}")
        for lo, hi, _ in new:
            for a, z in rec.uncovered(lo, hi):
                try:
                    rec.add_piece(a, bytes(self.driver.read(a, z - a)))
                except Exception as e:
                    raise _Refused(f"the {z - a} bytes at {a:#x} operation {len(rec.ops)} "
                                   f"names could not be read: {e}") from None

    # ---------------------------------------------------------------- the end

    def _refuse(self, rec: _Recording, reason: str) -> None:
        if rec in self.active:
            self.active.remove(rec)
        rec.record.update(status="refused", reason=reason, ops=len(rec.ops))
        rec.pieces.clear()
        print(f"kpair capture: range {rec.name!r} not captured: {reason}", file=sys.stderr)
        self.write_summary()

    def _finish(self, rec: _Recording) -> None:
        kernels = [op for op in rec.ops if op["kind"] == "kernel"]
        if not kernels:
            raise _Refused("the range launched no kernel" + (
                f" ({len(rec.ops)} memsets/copies only)" if rec.ops else ""))
        code = self.driver.synchronize()
        if code:
            raise _Refused(f"an operation of the range failed: {self.driver.error_name(code)} "
                           "(cuCtxSynchronize at the range's end)")
        table = self.blocks()
        spans = merge_extents(rec.extents)
        posts = []
        for lo, hi, rname in spans:
            try:
                posts.append(bytes(self.driver.read(lo, hi - lo)))
            except Exception as e:
                raise _Refused(f"the post-state of region {rname} could not be read: "
                               f"{e}") from None
        name = snapshot_dirname(rec.name)
        writer = self.pool.writer(self.out / name)
        kept, scratch, roles = [], [], Counter()
        declared_hit = [False] * len(rec.outputs)
        undeclared = []
        dead: list[DeadSpan] = []
        spans_out: list[tuple[str, int, int]] = []
        written_by: dict[str, list[str]] = {}
        for (lo, hi, rname), post in zip(spans, posts, strict=True):
            pre = rec.bytes_of(lo, hi)
            hits = [i for i, (a, n) in enumerate(rec.outputs) if a < hi and lo < a + n]
            made = fresh(rec.begin, table, lo, hi)
            # Written: its bytes changed, a memset or copy of the range wrote it, the
            # allocator handed it out inside the range, or it holds a declared output. The
            # bytes alone do not tell: a range run a second time on the same tensors finds
            # its outputs' blocks already holding what it writes there.
            why = [w for w, yes in (
                ("changed", pre != post), ("allocated inside", made),
                ("declared output", bool(hits)),
                ("memset/copy", any(a < hi and lo < z for a, z in rec.writes))) if yes]
            written = bool(why)
            if why:
                written_by[rname] = why
            if not written:
                role = "in"
            elif not allocated(table, lo, hi):
                scratch.append(ScratchRegion(rname, lo, hi - lo))
                roles["scratch"] += 1
                continue
            else:
                for i in hits:
                    declared_hit[i] = True
                    a, n = rec.outputs[i]
                    start = max(a, lo)
                    spans_out.append((rname, start - lo, min(a + n, hi) - start))
                role = "out" if hits else "inout"
                if rec.outputs:
                    # With declared outputs only they are live-out, byte by byte too: what
                    # the allocator holds free at the end is dead (the block of an
                    # intermediate freed inside the range, merged into a region with an
                    # output that reused part of it). Zeroed in the post-state as every
                    # replay zeroes it.
                    gone = dead_bytes(table, lo, hi, [rec.outputs[i] for i in hits])
                    if gone:
                        post = bytearray(post)
                        for off, n in gone:
                            post[off:off + n] = bytes(n)
                        post = bytes(post)
                        dead += [DeadSpan(rname, off, n) for off, n in gone]
                if role == "inout" and rec.outputs:
                    # Issue 47's rule: with declared outputs only they are live-out. A
                    # region written before it is read (handed out inside the range, or a
                    # memset or copy covering it is the first operation to name it) is
                    # scratch; one capture cannot tell stays inout, judged as updated in
                    # place, and is named in the notes.
                    if made or written_first(rec, lo, hi):
                        scratch.append(ScratchRegion(rname, lo, hi - lo))
                        roles["scratch"] += 1
                        continue
                    undeclared.append(rname)
            roles[role] += 1
            kept.append((rname, lo, hi, pre, post, role))
        chains = chain_regions(self.writers, rec.upto,
                               [PendingRegion(n, lo, pre) for n, lo, _, pre, _, _ in kept],
                               table, self.registry, writer.chain)
        regions = [stored_region(writer, n, lo, pre, post, chains.get(n), role=role,
                                 post_digest_over=self.post_digest_over)
                   for n, lo, hi, pre, post, role in kept]
        pending = self.keep_pending(chains, {n: pre for n, _, _, pre, _, _ in kept})
        ops, codes = [], {}
        for op in rec.ops:
            stream = op["stream"]
            if op["kind"] == "kernel":
                key = id(op["image"])
                if key not in codes:
                    codes[key] = writer.put(op["image"])
                ops.append(Op(CodeObject(codes[key], op["format"], op["kernel"]), op["launch"],
                              Kernarg(writer.put(op["kernarg"]), op["params"]),
                              stream=stream or None))
            elif op["kind"] == "memset":
                ops.append(Op(kind="memset", dst=op["dst"], size=op["size"],
                              value=op["value"], element_size=op["element_size"],
                              stream=stream or None))
            else:
                ops.append(Op(kind="copy", dst=op["dst"], src=op["src"], size=op["size"],
                              stream=stream or None))
        first = next(o for o in ops if o.kind == "kernel")
        kept_names = {n for n, *_ in kept}   # a region turned scratch has no dead bytes
        env = self.environment()
        notes = [f"declared output at {a:#x} ({n} bytes) is in no region an operation of the "
                 "range named" for (a, n), hit in zip(rec.outputs, declared_hit, strict=True)
                 if not hit]
        notes += [f"region {n} is written but no declared output, and capture cannot tell "
                  "that the range writes it before reading it: kept as inout (judged)"
                  for n in undeclared]
        provenance = {
            "captured_by": f"kpair {__version__} capture --range", "command": self.command,
            "time": utc_now(), "range": rec.name, "occurrence": rec.occurrence,
            "marked_by": rec.source, "process": PROCESS, "pid": os.getpid(),
            "ops": [{"kind": op["kind"], "api": op["api"], "stream": hex(op["stream"]),
                     **({"kernel_demangled": op["demangled"], "module_id": op["module_id"],
                         "code_object_match": op["code_object_match"],
                         "kernarg_from": op["kernarg_from"]} if op["kind"] == "kernel"
                        else {}), **({"triton": op["triton"]} if op.get("triton") else {})}
                    for op in rec.ops],
            "streams": [hex(s) for s in rec.streams],
            "declared_outputs": [{"address": hex(a), "size": n} for a, n in rec.outputs],
            "written": written_by,
            "left_out": dict(rec.left_out), "notes": notes}
        manifest = Manifest(backend="cuda", arch=env.get("arch", "unknown"), code=first.code,
                            launch=first.launch, kernarg=first.kernarg, regions=tuple(regions),
                            environment=env, provenance=provenance, ops=tuple(ops),
                            scratch=tuple(scratch),
                            **({"outputs": tuple(OutputSpan(*o) for o in spans_out)}
                               if spans_out else {}),
                            **({"dead": tuple(d for d in dead if d.region in kept_names)}
                               if dead else {}))
        writer.finish(manifest)
        region_bytes = sum(r.size for r in regions)
        rec.record.update({
            "status": "captured", "snapshot": name, "ops": len(ops),
            "kernels": len(kernels), "memsets": sum(o.kind == "memset" for o in ops),
            "copies": sum(o.kind == "copy" for o in ops), "streams": len(rec.streams),
            "regions": len(regions), "scratch": len(scratch), "roles": dict(roles),
            "region_bytes": region_bytes,
            "scratch_bytes": sum(s.size for s in scratch), "state_bytes": 2 * region_bytes,
            "stored_bytes": writer.new_bytes, "deduped_bytes": writer.deduped_bytes,
            "regenerated": len(chains),
            "capture_s": round(time.monotonic() - rec.started, 4)})
        if pending:
            rec.record["chain_pre"] = pending
        if notes:
            rec.record["notes"] = notes
        rec.pieces.clear()
        self.write_summary()

    # ---------------------------------------------------------------- summary

    def summary_record(self):
        summary = super().summary_record()
        ranges = [RangeRecord(**r) for r in self.range_records]
        done = [r for r in self.range_records if r["status"] == "captured"]
        totals = summary.totals.replace(**{key: sum(r.get(key, 0) for r in done) for key in (
            "region_bytes", "state_bytes", "stored_bytes", "deduped_bytes")})
        return summary.replace(ranges=ranges, totals=totals,
                               captured=len(done),
                               failed=sum(r.status == "refused" for r in ranges))

    def close(self, exit_status: int | None = None) -> dict:
        with self._lock:
            for rec in list(self.active):
                self._refuse(rec, "the range was still open when the program ended")
            for r in self.range_records:
                if r["status"] == "waiting":
                    seen = self.occurrences[r["name"]]
                    r.update(status="not-seen", reason=(
                        f"the range {r['name']!r} was never opened" if not seen else
                        f"the range opened {seen} time(s); occurrence {self.nth} never came"))
            self.closed = True
            self.exit_status = exit_status
            return self.write_summary()


__all__ = ["MemoryOp", "RangeSession", "allocated", "merge_extents", "snapshot_dirname"]
