"""A captured candidate bound to ref's range: ``kpair pair SNAP --opt-capture SNAP2``.

SNAP2 is another range captured in the same process over the same memory (an eager
forward and its ``torch.compile`` forward, or two ``kpair.record`` ranges over the same
numpy arrays). ``bind_capture(ref, cand)`` makes a launch plan of SNAP2's operations that
runs on SNAP's regions. Each region of SNAP2 is bound, in this order:

1. **by identity**: the same memory as a SNAP region (SNAP2's address range lies inside it)
   holding the same pre-state bytes. A live-in region is read there; a written one is
   updated there, which SNAP must write too (a plan that writes SNAP's live-in is
   refused by ``check_plan``). A region SNAP2 only reads that partly overlaps one SNAP
   region is bound by the overlap where the bytes there agree: SNAP2's pointers, memsets
   and copies into it must land inside the overlap (else refused). A region both write
   that is no declared output of either (a library's workspace, a running statistic), the
   same memory exactly, is bound there whatever SNAP2 found in it: the plan starts from
   SNAP's pre-state, as ref does.
2. **outputs**: where both ranges declare their outputs as spans (``Manifest.outputs``:
   the tensor inside its allocator block), the k-th span of SNAP2 is bound to the k-th of
   SNAP (by name where both name the same regions), equal in size (the blocks around them
   may differ): SNAP2's pointers, memsets and copies into the block are moved relative to
   the output's start, and one outside the span is refused. Otherwise SNAP2's written
   regions left are bound to SNAP's live-out regions left through the declared outputs
   (role ``out``: by name, or the one declared output of each), or, when neither declares
   one, the one live-out of each; sizes must be equal.
   SNAP2's other written regions, once its outputs are declared, are written-then-dead:
   plan scratch of their size, poisoned before every execution.
3. SNAP2's scratch regions become plan scratch of their size.
4. A region SNAP2 only reads that no region of SNAP holds, or that lies in a region SNAP
   writes (the allocator handed the same memory to both ranges), found holding one byte
   value throughout (a library's zeroed workspace), becomes plan scratch of its size that
   a memset, the plan's first launch, sets to that value: it carries nothing of the
   program's. Other bytes SNAP2 reads where SNAP writes a declared output are refused.

What is left is refused (``BindError``, exit 4) naming the region and why: different bytes
(same memory, other pre-state), different size (overlapping memory or outputs of other
sizes), no counterpart. "The same memory" is the address range in the capturing process:
a region's own address for a GPU capture, the caller's array for a ``kpair.record`` range
(its provenance's ``process_regions``); two ranges whose provenance names two processes are
refused.

The plan's launches are SNAP2's operations as captured: their code objects (stored beside
the plan), geometry, and each kernarg as a raw blob whose pointer words into SNAP2's
regions and scratch are relocations to what they are bound to (``kpair.plan``). A memset
or device-to-device copy of SNAP2 is a plan memset or copy launch on the bound buffers:
``check_plan`` refuses one that writes SNAP's live-in (a region bound by identity that SNAP
only reads) or reaches past a buffer. A pointer
into a SNAP2 region that is not a whole pointer-sized parameter (a field of a struct passed
by value) cannot be relocated: refused.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ._util import make_dirs, write_bytes_atomic, write_text_atomic
from .errors import KpairError
from .plan import (
    FILENAME,
    Plan,
    PlanLaunch,
    RegionArg,
    Relocation,
    Scratch,
    ScratchArg,
    holder,
    pointer_word,
)

#: Code object file extensions (as a harness names them).
_EXT = {"elf-so": ".so", "cubin": ".cubin", "fatbin": ".fatbin", "ptx": ".ptx",
        "hsaco": ".co"}


class BindError(KpairError):
    """A region of the captured candidate bound to nothing in ref's range (or a candidate
    that cannot be bound at all): refused before anything is written."""

    exit_code = 4


@dataclass(frozen=True)
class Binding:
    """Where one region of SNAP2 went: a SNAP region (``to`` "region", at ``offset`` in it)
    or a plan scratch buffer (``to`` "scratch"), and by which rule (``why``)."""

    region: str
    to: str
    name: str
    offset: int
    access: str
    why: str
    #: A region bound by its declared outputs: the (offset, size) spans of SNAP2's region
    #: that are bound; its byte ``k`` inside one is byte ``offset + k`` of ``name``
    #: (``offset`` may be negative: the blocks around the outputs differ), and nothing
    #: outside them may be addressed.
    spans: tuple[tuple[int, int], ...] = ()

    def describe(self) -> str:
        if self.spans:
            where = ", ".join(f"[{a}, +{n}) at {self.name}+{self.offset + a}"
                              for a, n in self.spans)
        else:
            where = (f"{self.name}" + (f"+{self.offset}" if self.offset else "")
                     if self.to == "region" else f"scratch {self.name}")
        return f"{self.region} -> {where} ({self.why})"

    def locate(self, k: int, n: int, what: str) -> int:
        """Where SNAP2's ``n`` bytes at byte ``k`` of this region land in ``name``;
        BindError for bytes outside the bound spans."""
        if self.spans and not any(a <= k and k + n <= a + m for a, m in self.spans):
            raise BindError(f"{what} addresses byte {k} of {self.region!r}, outside the "
                            "bytes of it that are bound, " + ", ".join(
                                f"[{a}, +{m})" for a, m in self.spans)
                            + f" ({self.why})")
        return self.offset + k


@dataclass(frozen=True)
class BoundCapture:
    """The plan of a bound capture, its code objects by file name, and every binding."""

    plan: Plan
    code: dict[str, bytes]
    bindings: tuple[Binding, ...]
    notes: tuple[str, ...] = field(default=())

    def write(self, directory: str | Path) -> Path:
        """Write ``opt.plan.json`` and its code objects into ``directory``; the plan's path."""
        directory = Path(directory)
        make_dirs(directory)
        for rel, image in self.code.items():
            make_dirs((directory / rel).parent)
            write_bytes_atomic(directory / rel, image)
        path = directory / FILENAME
        write_text_atomic(path, json.dumps(self.plan.to_json(), indent=1) + "\n")
        return path


def _spans(manifest) -> dict[str, tuple[int, int]]:
    """Each region's and scratch region's memory in the capturing process: (start, size)."""
    known = manifest.provenance.get("process_regions") \
        if isinstance(manifest.provenance, dict) else None
    known = known if isinstance(known, dict) else {}
    out = {}
    for r in (*manifest.regions, *manifest.scratch_regions):
        at = known.get(r.name)
        ok = isinstance(at, list | tuple) and len(at) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in at) and at[1] == r.size
        out[r.name] = (at[0], at[1]) if ok else (r.address, r.size)
    return out


def _written(r) -> bool:
    return r.role in ("out", "inout") if r.role is not None else r.pre.sha256 != r.post.sha256


def _show(span: tuple[int, int]) -> str:
    return f"[{span[0]:#x}, +{span[1]})"


def bind_capture(ref, cand) -> BoundCapture:
    """Bind the range of Snapshot ``cand`` (SNAP2) to the range of Snapshot ``ref`` (SNAP):
    the plan (see the module docstring). Raises BindError naming what is left unbound."""
    m1, m2 = ref.manifest, cand.manifest
    if (m1.backend, m1.arch) != (m2.backend, m2.arch):
        raise BindError(f"the captured candidate is for {m2.backend}/{m2.arch}, the range "
                        f"for {m1.backend}/{m1.arch}")
    p1 = m1.provenance.get("process") if isinstance(m1.provenance, dict) else None
    p2 = m2.provenance.get("process") if isinstance(m2.provenance, dict) else None
    if p1 and p2 and p1 != p2:
        raise BindError("the captured candidate was recorded in another process than the "
                        "range: their regions cannot be identified by address (capture both "
                        "in one process, over the same memory)")
    s1, s2 = _spans(m1), _spans(m2)
    regions1 = {r.name: (i, r) for i, r in enumerate(m1.regions)}
    pre_cache: dict[tuple[int, str], bytes] = {}

    def pre(snap, i: int) -> bytes | None:
        """Region i's pre-state bytes; None where they are not stored as bytes (a
        regenerable region not made yet): then only whole regions compare, by sha256."""
        key = (id(snap), str(i))
        if key not in pre_cache:
            known = getattr(snap, "known_pre", snap.pre)
            pre_cache[key] = known(i)
        return pre_cache[key]

    bindings: dict[str, Binding] = {}
    fills: dict[str, int] = {}   # SNAP2 regions bound to scratch that a memset sets first
    bound_ref: set[str] = set()

    def filled(name: str, value: int | None, where: str) -> bool:
        """SNAP2's region ``name`` found holding the byte ``value`` throughout (None: not
        so) bound to plan scratch of its own, set to that value by a memset before the
        plan's first launch (and timed with it): it carries nothing of the program's."""
        if value is None:
            return False
        bindings[name] = Binding(name, "scratch", name, 0, "readwrite",
                                 f"{where}, every byte {value:#04x} when SNAP2 read it: plan "
                                 "scratch set so by a memset first")
        fills[name] = value
        return True
    refusals: list[str] = []
    left_written = []
    for j, r2 in enumerate(m2.regions):
        lo2, n2 = s2[r2.name]
        home = next((r for r in m1.regions if s1[r.name][0] <= lo2
                     and lo2 + n2 <= s1[r.name][0] + s1[r.name][1]), None)
        writes = _written(r2)
        if home is not None:
            i, _ = regions1[home.name]
            lo1, n1 = s1[home.name]
            if (lo1, n1) == (lo2, n2):
                same = r2.pre.sha256 == home.pre.sha256
            else:
                mine, theirs = pre(cand, j), pre(ref, i)
                same = mine is not None and theirs is not None \
                    and mine == theirs[lo2 - lo1:lo2 - lo1 + n2]
            # A buffer both ranges write (a library's workspace, a running statistic) is one
            # buffer even where SNAP2 found it as SNAP left it: the plan starts from SNAP's
            # pre-state as ref does, and the judge compares what both leave there.
            shared = writes and _written(home) and (lo1, n1) == (lo2, n2) \
                and r2.role != "out" and home.role != "out"
            if same and not writes and _written(home):
                # SNAP2 reads, as it was before the range, memory SNAP writes: the two ranges
                # met in memory the allocator handed to both (SNAP2's zeroed workspace where
                # SNAP's output or intermediate lies). What ref overwrites is no input (the
                # judge poisons it): one byte value throughout is the candidate's own
                # scratch set by a memset; other bytes are an input only where SNAP updates
                # the region in place, never under a declared output.
                if filled(r2.name, _one_byte(pre(cand, j)), f"memory SNAP's {home.name!r} "
                          "writes"):
                    continue
                if home.role == "out":
                    refusals.append(f"{r2.name}: reads what SNAP's output {home.name!r} held "
                                    f"before the range ({_show((lo2, n2))}), which ref "
                                    "overwrites: no input")
                    continue
            if (same and (not writes or _written(home))) or shared:
                access = "read" if not writes else (
                    "readwrite" if r2.role in ("inout", None) else "write")
                bindings[r2.name] = Binding(
                    r2.name, "region", home.name, lo2 - lo1, access,
                    "same memory, same bytes" if same else "same memory, written by both")
                if writes:
                    bound_ref.add(home.name)
                continue
            if not same and not writes:
                refusals.append(f"{r2.name}: different bytes (SNAP2 reads {_show((lo2, n2))} "
                                f"with other bytes than SNAP's {home.name!r} holds there)")
                continue
        if writes:
            left_written.append(r2)
            continue
        overs = [r for r in m1.regions if s1[r.name][0] < lo2 + n2
                 and lo2 < s1[r.name][0] + s1[r.name][1]]
        over = overs[0] if overs else None
        if len(overs) == 1:   # partly SNAP's: bound by the overlap where its bytes agree
            i, _ = regions1[over.name]
            lo1, n1 = s1[over.name]
            a, b = max(lo1, lo2), min(lo1 + n1, lo2 + n2)
            mine, theirs = pre(cand, j), pre(ref, i)
            if mine is not None and theirs is not None \
                    and mine[a - lo2:b - lo2] == theirs[a - lo1:b - lo1]:
                bindings[r2.name] = Binding(
                    r2.name, "region", over.name, lo2 - lo1, "read",
                    "same memory, same bytes where they overlap", ((a - lo2, b - a),))
                continue
        if over is not None:
            refusals.append(f"{r2.name}: different size (SNAP2 reads {_show((lo2, n2))}, "
                            f"SNAP's {over.name!r} is {_show(s1[over.name])})")
            continue
        # A library's zeroed workspace (cuBLAS keeps its split-K semaphores at zero between
        # calls): SNAP2 finds it holding one byte value and leaves it so.
        if filled(r2.name, _one_byte(pre(cand, j)), "held by no region of SNAP"):
            continue
        refusals.append(f"{r2.name}: no counterpart (SNAP2 reads {_show((lo2, n2))}; "
                        "no region of SNAP holds that memory)")
    outs1 = [r for r in m1.regions if _written(r) and r.name not in bound_ref]
    declared2 = [r for r in left_written if r.role == "out"]
    declared1 = [r for r in outs1 if r.role == "out"]
    pairs: list[tuple] = []
    if m1.output_spans and m2.output_spans:
        _bind_spans(m1, m2, left_written, outs1, bindings, bound_ref, refusals)
    elif declared2:
        by_name = {r.name: r for r in declared1}
        rest1 = list(declared1)
        for r2 in declared2:
            r1 = by_name.get(r2.name) or (rest1[0] if len(declared2) == 1 == len(rest1)
                                           else None)
            if r1 is None or r1 not in rest1:
                refusals.append(f"{r2.name}: no counterpart (a declared output of SNAP2; "
                                "SNAP declares " + (", ".join(repr(r.name) for r in rest1)
                                                    or "no output left") + ")")
                continue
            rest1.remove(r1)
            pairs.append((r2, r1, "declared output"))
        for r2 in left_written:
            if r2.role != "out":
                bindings[r2.name] = Binding(r2.name, "scratch", r2.name, 0, "readwrite",
                                            "written, not a declared output")
    elif len(left_written) == 1 and len(outs1) == 1:
        pairs.append((left_written[0], outs1[0], "the one live-out of each"))
    elif left_written:
        names = ", ".join(repr(r.name) for r in left_written)
        refusals.append(f"{names}: no counterpart (SNAP2 writes {len(left_written)} "
                        f"region(s) and declares no output; SNAP has {len(outs1)} live-out "
                        "region(s) left: declare SNAP2's outputs, role 'out', to pair them)")
    for r2, r1, why in pairs:
        if r2.size != r1.size:
            refusals.append(f"{r2.name}: different size (SNAP2's output is {r2.size} bytes, "
                            f"SNAP's {r1.name!r} is {r1.size})")
            continue
        bindings[r2.name] = Binding(r2.name, "region", r1.name, 0,
                                    "readwrite" if r2.role == "inout" else "write", why)
        bound_ref.add(r1.name)
    if refusals:
        raise BindError("the captured candidate leaves regions unbound: "
                        + "; ".join(refusals))
    unwritten = [r.name for r in outs1 if r.name not in bound_ref]
    if unwritten:
        raise BindError(f"SNAP's live-out region(s) {', '.join(map(repr, unwritten))} "
                        "written by no region of the captured candidate")
    taken = {r.name for r in (*m1.regions, *m1.scratch_regions)}   # a plan buffer is its own
    scratch: list[Scratch] = []
    names: dict[str, str] = {}

    def scratch_name(name: str) -> str:
        out, k = name, 1
        while out in taken:
            out, k = f"{name}.{k}", k + 1
        taken.add(out)
        return out

    for b in list(bindings.values()):
        if b.to == "scratch":
            names[b.region] = scratch_name(b.region)
            bindings[b.region] = Binding(b.region, "scratch", names[b.region], 0, b.access,
                                         b.why)
            scratch.append(Scratch(names[b.region], m2.region(b.region).size))
    for sc in m2.scratch_regions:
        names[sc.name] = scratch_name(sc.name)
        bindings[sc.name] = Binding(sc.name, "scratch", names[sc.name], 0, "readwrite",
                                    "scratch of SNAP2")
        scratch.append(Scratch(names[sc.name], sc.size))
    launches, code = _launches(cand, m2, bindings)
    launches[:0] = [PlanLaunch(kind="memset", dst=ScratchArg(names[r], 0), value=v,
                               element_size=1, count=m2.region(r).size)
                    for r, v in fills.items()]
    plan = Plan(launches=tuple(launches), scratch=tuple(scratch),
                note=f"captured candidate of {len(launches)} operation(s), bound by kpair.bind")
    return BoundCapture(plan, code, tuple(bindings.values()))


def _bind_spans(m1, m2, left_written, outs1, bindings: dict[str, Binding],
                bound_ref: set[str], refusals: list[str]) -> None:
    """Both ranges declare their outputs as spans (the tensors inside their allocator
    blocks): the k-th of SNAP2 is bound to the k-th of SNAP, equal in size; SNAP2's other
    written regions become plan scratch."""
    o1s, o2s = m1.output_spans, m2.output_spans
    if len(o1s) != len(o2s):
        refusals.append(f"outputs: no counterpart (SNAP2 declares {len(o2s)} output(s), SNAP "
                        f"{len(o1s)})")
        return
    left = {r.name: r for r in left_written}
    free1 = {r.name for r in outs1}
    placed: dict[str, tuple[str, int, tuple[tuple[int, int], ...]]] = {}
    names1, names2 = [o.region for o in o1s], [o.region for o in o2s]
    if sorted(names1) == sorted(names2) and len(set(names1)) == len(names1):
        o1s = tuple(o1s[names1.index(n)] for n in names2)   # the same names: by name
    for k, (o2, o1) in enumerate(zip(o2s, o1s, strict=True)):
        if o2.size != o1.size:
            refusals.append(f"{o2.region}: different size (SNAP2's output is {o2.size} "
                            f"bytes, SNAP's {o1.region!r} is {o1.size})"
                            + (f", declared output {k} of each" if len(o2s) > 1 else ""))
            continue
        if o2.region not in left or o1.region not in free1:
            refusals.append(f"{o2.region}: declared output {k} of SNAP2 (in "
                            f"{o2.region!r}) or of SNAP (in {o1.region!r}) lies in a region "
                            "already bound by identity")
            continue
        delta = o1.offset - o2.offset
        prev = placed.get(o2.region)
        if prev is not None and prev[:2] != (o1.region, delta):
            refusals.append(f"{o2.region}: holds declared outputs that SNAP holds apart "
                            "(another region or another distance): one region, one place")
            continue
        placed[o2.region] = (o1.region, delta,
                             (prev[2] if prev else ()) + ((o2.offset, o2.size),))
    for name, (to, delta, spans) in placed.items():
        if spans == ((0, left[name].size),):
            spans = ()   # the whole region: nothing outside the output to refuse
        bindings[name] = Binding(name, "region", to, delta,
                                 "readwrite" if left[name].role == "inout" else "write",
                                 "declared output", spans)
        bound_ref.add(to)
    for r2 in left_written:
        if r2.name not in placed:
            bindings[r2.name] = Binding(r2.name, "scratch", r2.name, 0, "readwrite",
                                        "written, not a declared output")


def _one_byte(data: bytes | None) -> int | None:
    """The byte value every byte of ``data`` holds; None for mixed, unknown or empty data."""
    if not data or data.count(data[:1]) != len(data):
        return None
    return data[0]


def _launches(cand, m2, bindings: dict[str, Binding]) -> tuple[list[PlanLaunch], dict]:
    """SNAP2's operations as raw-kernarg launches, every pointer word into a SNAP2 region
    or scratch region relocated to its binding."""
    spans = sorted((r.address, r.end, r.name) for r in (*m2.regions, *m2.scratch_regions))
    code: dict[str, bytes] = {}
    launches = []
    first = next((i for i, op in enumerate(m2.operations) if op.kind == "kernel"), None)
    if first is None:
        raise BindError("SNAP2 launches no kernel (a plan launches at least one)")
    for i, op in enumerate(m2.operations):
        if op.kind != "kernel":   # a memset or a copy: its addresses bound like pointers
            launches.append(_data_launch(i, op, spans, bindings))
            continue
        field_ = "code_object.blob" if i == first else f"ops[{i}].code_object.blob"
        image = cand.read_blob(op.code.blob, field_)
        rel = f"code/{hashlib.sha256(image).hexdigest()[:16]}{_EXT[op.code.format]}"
        code[rel] = image
        blob = cand.kernarg() if i == first else cand.read_blob(op.kernarg.blob,
                                                                f"ops[{i}].kernarg.blob")
        relocations = _relocations(i, op, blob, spans, bindings)
        launches.append(PlanLaunch(
            code=rel, kernel=op.code.kernel_name, grid=op.launch.grid, block=op.launch.block,
            dynamic_shared_bytes=op.launch.dynamic_shared_bytes, format=op.code.format,
            attributes=tuple(op.launch.attributes),
            kernarg=blob, params=tuple(op.kernarg.params), relocations=tuple(relocations)))
    return launches, code


def _data_launch(i: int, op, spans: Sequence[tuple[int, int, str]],
                 bindings: dict[str, Binding]) -> PlanLaunch:
    """SNAP2's memset or copy ``op`` as a plan launch on what its buffers are bound to."""

    def bound(address: int, role: str) -> RegionArg | ScratchArg:
        hit = next((s for s in spans if s[0] <= address and address + op.size <= s[1]), None)
        if hit is None:
            raise BindError(f"SNAP2 operation {i} ({op.kind}) {role} "
                            f"{_show((address, op.size))} lies inside no region or scratch "
                            "region of SNAP2")
        lo, _, name = hit
        b = bindings[name]
        at = b.locate(address - lo, op.size, f"SNAP2 operation {i} ({op.kind}) {role}")
        if b.to == "scratch":
            return ScratchArg(b.name, at)
        return RegionArg(b.name, at, "write" if role == "dst" else "read")

    dst = bound(op.dst, "dst")
    if op.kind == "memset":
        return PlanLaunch(kind="memset", dst=dst, value=op.value,
                          element_size=op.element_size, count=op.size // op.element_size)
    return PlanLaunch(kind="copy", dst=dst, src=bound(op.src, "src"), size=op.size)


def _relocations(i: int, op, blob: bytes, spans: Sequence[tuple[int, int, str]],
                 bindings: dict[str, Binding]) -> list[Relocation]:
    out = []
    for at in range(0, len(blob) - 7, 8):
        value = struct.unpack_from("<Q", blob, at)[0]
        hit = next((s for s in spans if s[0] <= value < s[1]), None)
        if hit is None:
            continue
        lo, _, name = hit
        if not pointer_word(holder(op.kernarg.params, at), at):
            raise BindError(f"SNAP2 operation {i} ({op.code.kernel_name}) kernarg byte {at} "
                            f"holds an address in region {name!r} where no pointer word is "
                            "(a scalar parameter, or across parameters): it cannot be "
                            "relocated")
        b = bindings[name]
        where = b.locate(value - lo, 1, f"SNAP2 operation {i} ({op.code.kernel_name}) "
                                        f"kernarg byte {at}")
        out.append(Relocation(offset=at, bind="region" if b.to == "region" else "scratch",
                              name=b.name, offset_in_region=where,
                              access=b.access if b.to == "region" else "read"))
    return out


def identity_plan(snap) -> BoundCapture:
    """The range of Snapshot ``snap`` as a plan on its own regions: every operation as
    captured, each pointer word relocated to the region (or scratch region) it points
    into. What an A/A harness of a range pairs with its ref (``kpair optimize --range``)."""
    m = snap.manifest
    written = {r.name for r in m.regions if _written(r)}
    bindings = {r.name: Binding(r.name, "region", r.name, 0,
                                "readwrite" if r.name in written else "read", "ref itself")
                for r in m.regions}
    bindings.update({s.name: Binding(s.name, "scratch", s.name, 0, "readwrite",
                                     "scratch of ref") for s in m.scratch_regions})
    launches, code = _launches(snap, m, bindings)
    plan = Plan(launches=tuple(launches),
                scratch=tuple(Scratch(s.name, s.size) for s in m.scratch_regions),
                note=f"ref's own {len(launches)} operation(s) as a plan (kpair.bind)")
    return BoundCapture(plan, code, tuple(bindings.values()))


__all__ = ["BindError", "Binding", "BoundCapture", "bind_capture", "identity_plan"]
