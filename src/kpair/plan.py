"""Launch plans: a candidate with its own signature (``opt.plan.json``).

A same-layout ``opt`` is one launch of one kernel whose kernarg is ref's. A **plan** is any
number of launches, in order, of kernels with parameter lists of their own. Each parameter is
bound, in the kernel's own order, to one of:

- a **region** of the target (``{"bind": "region", "name": "out", "offset": 0,
  "access": "write"}``): the argument is the region's placed address plus ``offset``;
  ``bytes`` (optional) says how far from ``offset`` the launch reaches (default: the region's
  end); ``access`` says whether the launch may write there;
- a **scratch** buffer the plan declares with a size (``{"bind": "scratch", "name": "tmp"}``);
- a typed **scalar** (``{"bind": "scalar", "kind": "i32", "value": 1024}``).

The target is what a plan must produce: the regions of the captured range, each ``in``
(read, must stay unchanged), ``out`` (written; the judge compares it) or ``inout`` (updated
in place). ``check_plan`` refuses a plan before any launch, naming the launch and the
parameter: a parameter count, size or type other than the code object's own layout, an
unknown region or scratch, a reach past a region's or scratch buffer's end, a write to an
``in`` region, an ``out`` region no launch may write. ``kernarg`` then builds each launch's
argument blob from the layout and the placed addresses.

A launch can instead carry a **raw kernarg** (``kernarg``: the argument blob as hex, as a
capture recorded it; ``params``: that blob's layout) and **relocations** (``{"offset": 16,
"bind": "region", "name": "a", "offset_in_region": 0, "access": "read"}``): each writes the
placed address of a region or scratch buffer, plus ``offset_in_region``, into the pointer
word at ``offset``; every other byte goes as recorded. A captured candidate
(``kpair.bind``) is such a plan. ``check_plan`` checks relocations as it checks named
parameters: a relocation lands on a pointer-sized parameter of ``params`` (a pointer, or
bytes of unknown kind), and where the code object records its own layout, that layout must
be ``params``' (offsets and sizes) — so the word is a pointer-sized parameter there too.

Layouts come from the code object itself (``kpair.harness.plan_layout``): a cubin's
``.nv.info`` records, a fatbin's cubin for the target architecture (or its PTX), a PTX
``.entry``'s parameter list, an AMDGPU metadata note, a host object's DWARF. A layout whose
kinds are unknown (``bytes``) is checked by size only.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from .errors import AbiMismatch, FormatError
from .formats import HexBytes, Invalid, Record, read
from .snapshot.model import (
    CODE_FORMATS,
    SCALAR_FORMATS,
    SCALAR_SIZES,
    Count,
    Dim3,
    LaunchAttribute,
    Param,
    Positive,
    RegionName,
)

SCHEMA = "kpair.plan"
SCHEMA_VERSION = 1
FILENAME = "opt.plan.json"

#: Scalar kinds a plan can pass by value.
SCALAR_KINDS = ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f32", "f64")
Access = Literal["read", "write", "readwrite"]
Role = Literal["in", "out", "inout"]
KernelName = Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]


class PlanError(FormatError):
    """A plan that cannot run on its target: refused before any launch."""


class RegionArg(Record, tag_field="bind", tag="region", omit_defaults=True):
    name: RegionName
    offset: Count = 0
    access: Access = "read"
    bytes: Count | None = None


class ScratchArg(Record, tag_field="bind", tag="scratch", omit_defaults=True):
    name: RegionName
    offset: Count = 0
    bytes: Count | None = None


class ScalarArg(Record, tag_field="bind", tag="scalar"):
    kind: Literal[SCALAR_KINDS]  # type: ignore[valid-type]
    value: int | float

    def __post_init__(self) -> None:
        if self.kind in ("f32", "f64"):
            if isinstance(self.value, bool) or not isinstance(self.value, int | float):
                raise Invalid(f"a {self.kind} value must be a number", "value")
            return
        if not isinstance(self.value, int) or isinstance(self.value, bool):
            raise Invalid(f"a {self.kind} value must be an integer, got {self.value!r}",
                          "value")
        bits = SCALAR_SIZES[self.kind] * 8
        lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if self.kind[0] == "i" \
            else (0, (1 << bits) - 1)
        if not lo <= self.value <= hi:
            raise Invalid(f"{self.value} does not fit a {self.kind} ([{lo}, {hi}])", "value")

    def pack(self) -> bytes:
        value = float(self.value) if self.kind in ("f32", "f64") else self.value
        if self.kind == "f32" and math.isfinite(value) and abs(value) > 3.4028234663852886e38:
            raise Invalid(f"{self.value} does not fit an f32", "value")
        return struct.pack(SCALAR_FORMATS[self.kind], value)


Arg = RegionArg | ScratchArg | ScalarArg


class Relocation(Record, omit_defaults=True):
    """A pointer word of a raw kernarg: at byte ``offset``, the placed address of region
    (or scratch buffer) ``name`` plus ``offset_in_region``; ``access`` as for a region
    parameter."""

    offset: Count
    bind: Literal["region", "scratch"]
    name: RegionName
    offset_in_region: Count = 0
    access: Access = "read"


class Scratch(Record):
    """A buffer the plan needs between launches: placed beside the regions, poisoned before
    every execution of the plan, never judged."""

    name: RegionName
    size: Positive
    align: Positive = 256

    def __post_init__(self) -> None:
        if self.align & (self.align - 1):
            raise Invalid(f"must be a power of two, got {self.align}", "align")


class PlanLaunch(Record, omit_defaults=True):
    """One launch: the code object (a file beside the plan), the kernel, its geometry and
    either one binding per parameter, in the kernel's order (``args``), or a raw kernarg
    with its layout and relocations (``kernarg``, ``params``, ``relocations``).

    ``kind`` "memset" instead sets ``count`` elements of ``element_size`` bytes (1, 2 or 4)
    at ``dst`` to ``value``; ``kind`` "copy" copies ``size`` bytes from ``src`` to ``dst``
    (device to device). ``dst`` and ``src`` bind a region or scratch buffer as a pointer
    parameter does (``bytes``, if given, must be the length); no code object, no kernel."""

    code: str = ""
    kernel: str = ""
    kind: Literal["kernel", "memset", "copy"] = "kernel"
    dst: RegionArg | ScratchArg | None = None
    src: RegionArg | ScratchArg | None = None
    value: Count = 0
    element_size: Literal[1, 2, 4] = 1
    count: Count = 0
    size: Count = 0
    args: tuple[Arg, ...] = ()
    grid: Dim3 = (1, 1, 1)
    block: Dim3 = (1, 1, 1)
    dynamic_shared_bytes: Count = 0
    format: Literal[CODE_FORMATS] | None = None  # type: ignore[valid-type]
    #: Launch attributes as a capture recorded them (a cluster shape, ...), passed on as is.
    attributes: tuple[LaunchAttribute, ...] = ()
    kernarg: HexBytes | None = None
    params: tuple[Param, ...] = ()
    relocations: tuple[Relocation, ...] = ()

    def __post_init__(self) -> None:
        if self.kind != "kernel":
            self._check_data()
            return
        if not self.kernel or len(self.kernel) > 4096:
            raise Invalid("a kernel launch names its kernel (1 to 4096 characters)", "kernel")
        for name in ("dst", "src"):
            if getattr(self, name) is not None:
                raise Invalid(f"{name} goes with a memset or copy launch", name)
        p = self.code
        if not p or p.startswith("/") or "\\" in p or ".." in p.split("/"):
            raise Invalid(f"must be a relative path beside the plan, got {p!r}", "code")
        for name in ("args", "attributes", "params", "relocations"):   # built in code
            if type(getattr(self, name)) is not tuple:
                msgspec.structs.force_setattr(self, name, tuple(getattr(self, name)))
        if self.kernarg is None:
            if self.params or self.relocations:
                raise Invalid("params and relocations go with a raw kernarg", "kernarg")
            return
        if self.args:
            raise Invalid("a launch binds args or carries a raw kernarg, not both", "args")
        if type(self.kernarg) is not HexBytes:   # built in code: written as hex
            msgspec.structs.force_setattr(self, "kernarg", HexBytes(self.kernarg))
        end = 0
        for i, q in enumerate(self.params):
            if q.offset < end:
                raise Invalid("parameters overlap or are out of order", f"params[{i}].offset")
            end = q.offset + q.size
        if end > len(self.kernarg):
            raise Invalid(f"layout ends at byte {end}, the kernarg holds "
                          f"{len(self.kernarg)}", "params")
        seen: set[int] = set()
        for i, r in enumerate(self.relocations):
            if r.offset in seen:
                raise Invalid(f"byte {r.offset} is relocated twice", f"relocations[{i}]")
            seen.add(r.offset)

    def _check_data(self) -> None:
        if self.code or self.kernel or self.args or self.kernarg is not None \
                or self.params or self.relocations:
            raise Invalid(f"a {self.kind} launch has no code object, kernel or kernarg",
                          "kind")
        if self.dst is None:
            raise Invalid(f"a {self.kind} launch names its destination", "dst")
        if self.kind == "memset":
            if self.src is not None or self.size:
                raise Invalid("a memset has no src or size (count elements of "
                              "element_size bytes)", "src")
            if self.count <= 0:
                raise Invalid("a memset sets at least one element", "count")
            if self.value >= 1 << (8 * self.element_size):
                raise Invalid(f"{self.value} does not fit {self.element_size} byte(s)",
                              "value")
            return
        if self.src is None:
            raise Invalid("a copy names its source", "src")
        if self.size <= 0 or self.count or self.value:
            raise Invalid("a copy moves size > 0 bytes (no count or value)", "size")

    @property
    def raw(self) -> bool:
        """Whether the launch carries a raw kernarg (else it binds ``args``)."""
        return self.kernarg is not None

    @property
    def data(self) -> bool:
        """Whether the launch is a memset or a copy (no kernel)."""
        return self.kind != "kernel"

    @property
    def length(self) -> int:
        """Bytes a memset or copy writes at ``dst`` (and a copy reads at ``src``)."""
        return self.count * self.element_size if self.kind == "memset" else self.size

    @property
    def label(self) -> str:
        """The kernel, or "memset" / "copy"."""
        return self.kernel if self.kind == "kernel" else self.kind


class Plan(Record, kw_only=True, tag_field="schema", tag=SCHEMA):
    """``opt.plan.json``: the launches of a candidate with its own signature."""

    schema_version: Literal[1] = SCHEMA_VERSION
    launches: tuple[PlanLaunch, ...]
    scratch: tuple[Scratch, ...] = ()
    note: str = ""

    def __post_init__(self) -> None:
        if not self.launches:
            raise Invalid("a plan has at least one launch", "launches")
        names = [s.name for s in self.scratch]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise Invalid(f"scratch buffer {name!r} is declared twice", f"scratch[{i}]")

    @classmethod
    def read(cls, path: Path) -> Plan:
        return read(path, cls, error=PlanError, schema=SCHEMA, version=SCHEMA_VERSION)


@dataclass(frozen=True)
class TargetRegion:
    """A region a plan binds to: its size, and what the range does with it."""

    size: int
    role: Role


@dataclass(frozen=True)
class Target:
    """What a plan must produce: the range's regions by name."""

    regions: Mapping[str, TargetRegion]

    @classmethod
    def of_dispatch(cls, manifest) -> Target:
        """The one-dispatch range of a snapshot: a region whose post-state differs from its
        pre-state is written (``inout``: the dispatch may also read it), the others are
        ``in``."""
        return cls({r.name: TargetRegion(r.size, "inout" if r.pre.sha256 != r.post.sha256
                                         else "in") for r in manifest.regions})


def _where(i: int, launch: PlanLaunch, j: int | None = None,
           layout: Sequence[Param] | None = None) -> str:
    at = f"launch {i} ({launch.kernel})"
    if j is None:
        return at
    name = layout[j].name if layout is not None and j < len(layout) and layout[j].name else ""
    return f"{at} parameter {j}" + (f" ({name!r})" if name else "")


def check_plan(plan: Plan, target: Target,
               layouts: Sequence[Sequence[Param] | None]) -> None:
    """Refuse ``plan`` on ``target`` (see the module docstring). ``layouts[i]`` is launch
    i's parameter layout as its code object records it, or None where the code object
    records none (then the bindings must still be well formed, and only the run can check
    the rest). Raises AbiMismatch for a layout mismatch, PlanError for a binding fault."""
    if len(layouts) != len(plan.launches):
        raise ValueError("one layout (or None) per launch")
    scratch = {s.name: s for s in plan.scratch}
    clash = sorted(set(scratch) & set(target.regions))
    if clash:
        raise PlanError(f"scratch buffer {clash[0]!r} is named like a region of the range: "
                        "one name, one buffer")
    if all(launch.data for launch in plan.launches):
        raise PlanError("a plan launches at least one kernel (its memsets and copies go "
                        "beside one)")
    written: set[str] = set()
    for i, (launch, layout) in enumerate(zip(plan.launches, layouts, strict=True)):
        if launch.data:
            written |= _check_data(i, launch, target, scratch)
            continue
        if launch.raw:
            written |= _check_raw(i, launch, layout, target, scratch)
            continue
        if layout is not None and len(layout) != len(launch.args):
            raise AbiMismatch(f"{_where(i, launch)} takes {len(layout)} parameters (from its "
                              f"code object), the plan binds {len(launch.args)}")
        for j, arg in enumerate(launch.args):
            where = _where(i, launch, j, layout)
            param = layout[j] if layout is not None else None
            if isinstance(arg, ScalarArg):
                _check_scalar(arg, param, where)
                continue
            _check_pointer(param, where, arg)
            written |= _check_target(arg, where, target, scratch)
    unwritten = sorted(n for n, r in target.regions.items()
                       if r.role != "in" and n not in written)
    if unwritten:
        raise PlanError(f"the range writes {', '.join(map(repr, unwritten))}, which no launch "
                        "of the plan binds for writing")


def _check_raw(i: int, launch: PlanLaunch, layout: Sequence[Param] | None, target: Target,
               scratch: Mapping[str, Scratch]) -> set[str]:
    """Check a raw-kernarg launch; the regions it may write."""
    at = _where(i, launch)
    if layout is not None:
        mine = [(q.offset, q.size) for q in launch.params]
        theirs = [(q.offset, q.size) for q in layout]
        if mine != theirs:
            raise AbiMismatch(f"{at}: the kernarg's layout {mine} (offset, size) is not the "
                              f"code object's {theirs}")
    written: set[str] = set()
    for r in launch.relocations:
        where = f"{at} relocation at byte {r.offset}"
        what = f"{'region' if r.bind == 'region' else 'scratch buffer'} {r.name!r}"
        if r.offset + 8 > len(launch.kernarg):
            raise PlanError(f"{where}: outside the kernarg ({len(launch.kernarg)} bytes)")
        param = holder(launch.params, r.offset) or next(
            (q for q in launch.params if q.offset <= r.offset < q.offset + q.size), None)
        if param is None:
            raise PlanError(f"{where}: no parameter of the kernarg holds a whole pointer "
                            f"word there (the address of {what} must replace one)")
        if not pointer_word(param, r.offset):
            raise AbiMismatch(f"{where}: the parameter there is {param.kind} of {param.size} "
                              f"bytes, not a pointer (the plan writes the address of {what})")
        if layout is not None and not pointer_word(holder(layout, r.offset), r.offset):
            raise AbiMismatch(f"{where}: the code object's parameter there is not "
                              f"pointer-sized (the plan writes the address of {what})")
        arg = (RegionArg(r.name, r.offset_in_region, r.access) if r.bind == "region"
               else ScratchArg(r.name, r.offset_in_region))
        written |= _check_target(arg, where, target, scratch)
    return written


def _check_data(i: int, launch: PlanLaunch, target: Target,
                scratch: Mapping[str, Scratch]) -> set[str]:
    """Check a memset or copy launch: inside its buffers, never writing a live-in region
    nor reading where it writes; the regions it writes."""
    at = f"launch {i} ({launch.kind})"
    n = launch.length
    ends = []
    for role, arg, access in (("dst", launch.dst, "write"), ("src", launch.src, "read")):
        if arg is None:
            continue
        if arg.bytes is not None and arg.bytes != n:
            raise PlanError(f"{at} {role}: binds {arg.bytes} bytes, the {launch.kind} "
                            f"moves {n}")
        bound = (RegionArg(arg.name, arg.offset, access, n) if isinstance(arg, RegionArg)
                 else ScratchArg(arg.name, arg.offset, n))
        ends.append((type(arg), arg.name, arg.offset))
        if role == "dst":
            written = _check_target(bound, f"{at} {role}", target, scratch)
        else:
            _check_target(bound, f"{at} {role}", target, scratch)
    if len(ends) == 2 and ends[0][:2] == ends[1][:2] \
            and abs(ends[0][2] - ends[1][2]) < n:
        raise PlanError(f"{at}: source and destination overlap in {ends[0][1]!r}")
    return written


def holder(params: Sequence[Param], offset: int) -> Param | None:
    """The parameter that holds the 8-byte word at ``offset`` whole, if one does."""
    return next((q for q in params if q.offset <= offset and offset + 8 <= q.offset + q.size),
                None)


def pointer_word(param: Param | None, offset: int) -> bool:
    """Whether the word at ``offset`` of ``param`` (its holder) can be a pointer: the whole
    parameter, 8 bytes of kind ``pointer`` or ``bytes``; or an 8-aligned word of a parameter
    of unknown kind (``bytes``: a struct passed by value, as a library kernel's parameter
    block is, whose fields include pointers)."""
    if param is None or not param.offset <= offset <= param.offset + param.size - 8:
        return False
    if param.offset == offset and param.size == 8:
        return param.kind in ("pointer", "bytes")
    return param.kind == "bytes" and offset % 8 == 0


def _check_target(arg: RegionArg | ScratchArg, where: str, target: Target,
                  scratch: Mapping[str, Scratch]) -> set[str]:
    """A region or scratch binding against the range; the region it writes, if any."""
    if isinstance(arg, RegionArg):
        region = target.regions.get(arg.name)
        if region is None:
            raise PlanError(f"{where}: the range has no region {arg.name!r} "
                            f"(it has {', '.join(sorted(target.regions)) or 'none'})")
        _check_reach(arg, region.size, f"region {arg.name!r}", where)
        if arg.access != "read":
            if region.role == "in":
                raise PlanError(f"{where}: region {arg.name!r} is live-in (the range "
                                f"only reads it), the plan binds it for {arg.access}")
            return {arg.name}
        return set()
    buf = scratch.get(arg.name)
    if buf is None:
        raise PlanError(f"{where}: scratch buffer {arg.name!r} is not declared "
                        f"(the plan declares {', '.join(scratch) or 'none'})")
    _check_reach(arg, buf.size, f"scratch buffer {arg.name!r}", where)
    return set()


def _check_scalar(arg: ScalarArg, param: Param | None, where: str) -> None:
    if param is None:
        return
    if param.kind == "pointer":
        raise AbiMismatch(f"{where} is a pointer, the plan passes a {arg.kind} scalar")
    if param.size != SCALAR_SIZES[arg.kind]:
        raise AbiMismatch(f"{where} is {param.size} bytes, the plan passes a {arg.kind} "
                          f"({SCALAR_SIZES[arg.kind]} bytes)")
    if param.kind != "bytes" and param.kind != arg.kind:
        raise AbiMismatch(f"{where} is {param.kind}, the plan passes {arg.kind}")


def _check_pointer(param: Param | None, where: str, arg: RegionArg | ScratchArg) -> None:
    if param is None:
        return
    what = f"{'region' if isinstance(arg, RegionArg) else 'scratch buffer'} {arg.name!r}"
    if param.kind not in ("pointer", "bytes"):
        raise AbiMismatch(f"{where} is {param.kind}, the plan passes the address of {what}")
    if param.size != SCALAR_SIZES["pointer"]:
        raise AbiMismatch(f"{where} is {param.size} bytes, the plan passes the address of "
                          f"{what} (8 bytes)")


def _check_reach(arg: RegionArg | ScratchArg, size: int, what: str, where: str) -> None:
    if arg.offset >= size:
        raise PlanError(f"{where}: offset {arg.offset} is past the end of {what} "
                        f"({size} bytes)")
    if arg.bytes is not None and arg.offset + arg.bytes > size:
        raise PlanError(f"{where}: reaches {arg.bytes} bytes from offset {arg.offset}, past "
                        f"the end of {what} ({size} bytes)")


def kernarg(launch: PlanLaunch, layout: Sequence[Param], addresses: Mapping[str, int]) -> bytes:
    """Launch ``launch``'s argument blob: each binding packed at its parameter's offset
    (a raw kernarg: the recorded blob with each relocation's address written in).
    ``addresses`` holds the placed address of every region and scratch buffer by name
    (``check_plan`` refuses a scratch buffer named like a region). Call ``check_plan``
    first."""
    if launch.raw:
        blob = bytearray(launch.kernarg)
        for r in launch.relocations:
            struct.pack_into("<Q", blob, r.offset, addresses[r.name] + r.offset_in_region)
        return bytes(blob)
    end = max((p.offset + p.size for p in layout), default=0)
    blob = bytearray(end)
    for param, arg in zip(layout, launch.args, strict=True):
        if isinstance(arg, ScalarArg):
            data = arg.pack()
        else:
            data = struct.pack("<Q", addresses[arg.name] + arg.offset)
        blob[param.offset:param.offset + len(data)] = data
    return bytes(blob)

