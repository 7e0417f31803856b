"""The records of snapshot format v2 (v1 read as well) and their JSON mapping.

A snapshot describes one kernel dispatch completely enough to replay it elsewhere:
the code object, the kernel name, the launch geometry and attributes, the kernarg blob
with its layout, and every memory region the kernarg can reach, before and after the
launch. ``docs/format.md`` is the contract and ``docs/schemas/snapshot.schema.json`` its
machine-readable half. The records are ``kpair.formats`` structs: types and ranges are
declared on the fields; the rules that span fields (a blob as large as its region, params in
order inside the kernarg, regions apart) live in each record's ``__post_init__``, so a record
built in code obeys the same rules as one read from disk. ``Manifest.from_json`` is the strict
reader and names the offending field (``regions[2].pre.size``) in every error it raises.
"""

from __future__ import annotations

import struct
from typing import Annotated, Any, Literal

import msgspec

from ..dtypes import DTYPE_HINTS
from ..errors import SnapshotFormatError
from ..formats import Address, HexBytes, Invalid, Record, check_version, convert

SCHEMA = "kpair.snapshot"
SCHEMA_VERSION = 2
#: Every version the reader takes: v1 has no regenerable regions (``Region.regen``); a
#: manifest is written as v1 unless it has one, so older readers keep reading it.
SCHEMA_VERSIONS = (1, 2)

#: Parameter kinds of a kernarg layout. Scalars carry a C type so the host backend can call
#: the function; GPU backends only need offset and size ("bytes" = opaque, e.g. a struct).
PARAM_KINDS = (
    "pointer", "bytes",
    "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f32", "f64",
)
#: The little-endian ``struct`` format of every kind with a fixed size (all but "bytes").
SCALAR_FORMATS = {"i8": "<b", "u8": "<B", "i16": "<h", "u16": "<H", "i32": "<i", "u32": "<I",
                  "i64": "<q", "u64": "<Q", "f32": "<f", "f64": "<d", "pointer": "<Q"}
SCALAR_SIZES = {kind: struct.calcsize(fmt) for kind, fmt in SCALAR_FORMATS.items()}


CODE_FORMATS = ("elf-so", "cubin", "fatbin", "ptx", "hsaco")

_EM_CUDA, _EM_AMDGPU = 190, 224
_FATBIN_MAGIC = 0xBA55ED50

Count = Annotated[int, msgspec.Meta(ge=0)]
Positive = Annotated[int, msgspec.Meta(ge=1)]
Dim3 = tuple[Positive, Positive, Positive]
Sha256 = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$",
                                     description="sha256 of the raw bytes, lowercase hex")]
Digest64 = Annotated[str, msgspec.Meta(
    pattern="^[0-9a-f]{16}$",
    description="digest64 (kpair.backends.base, key 0) of the raw bytes, 16 lowercase hex "
                "digits: what a device computes where the memory is")]
RegionName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_.\-]{1,128}$")]
ParamKind = Literal[PARAM_KINDS]  # type: ignore[valid-type]
DtypeHint = Literal[DTYPE_HINTS]  # type: ignore[valid-type]
CodeFormat = Literal[CODE_FORMATS]  # type: ignore[valid-type]
ROLES = ("in", "out", "inout")
Role = Literal[ROLES]  # type: ignore[valid-type]


def _coerce(record: msgspec.Struct, name: str, kind: type) -> None:
    """Give a field built in code (a list, a plain int) the type its JSON spelling needs.

    Frozen records refuse ``setattr``; this runs only in ``__post_init__``, before anyone
    else can see the record.
    """
    value = getattr(record, name)
    if type(value) is not kind:
        msgspec.structs.force_setattr(record, name, kind(value))


class BlobRef(Record):
    """A content-addressed blob: ``path`` relative to the snapshot, raw ``size`` and ``sha256``."""

    path: str
    size: Count
    sha256: Sha256
    compression: Literal["zstd", "none"] = "zstd"

    def __post_init__(self) -> None:
        p = self.path
        if not p or p.startswith("/") or "\\" in p or ".." in p.split("/"):
            raise Invalid(f"must be a relative path inside the snapshot, got {p!r}", "path")


class Param(Record):
    """One kernel parameter: its byte ``offset`` and ``size`` in the kernarg blob."""

    offset: Count
    size: Positive
    kind: ParamKind = "bytes"
    name: str = ""

    def __post_init__(self) -> None:
        expected = SCALAR_SIZES.get(self.kind)
        if expected is not None and expected != self.size:
            raise Invalid(f"kind {self.kind} has size {expected}, got {self.size}", "size")


class LaunchAttribute(Record):
    """A launch attribute (CUDA ``CUlaunchAttribute``): numeric id, name, raw value bytes."""

    id: Count
    name: str
    value: HexBytes

    def __post_init__(self) -> None:
        _coerce(self, "value", HexBytes)


class Launch(Record):
    """Launch geometry: ``grid`` in blocks, ``block`` in threads, dynamic shared memory."""

    grid: Dim3 = (1, 1, 1)
    block: Dim3 = (1, 1, 1)
    dynamic_shared_bytes: Count = 0
    attributes: tuple[LaunchAttribute, ...] = ()

    def __post_init__(self) -> None:
        for name in ("grid", "block", "attributes"):
            _coerce(self, name, tuple)

    def override(self, changes: dict) -> Launch:
        """This launch with ``grid``/``block``/``dynamic_shared_bytes`` replaced (opt override)."""
        o = convert(changes, LaunchOverride, error=SnapshotFormatError, field="launch_override")
        given = {f: getattr(o, f) for f in o.__struct_fields__}
        return msgspec.structs.replace(
            self, **{f: v for f, v in given.items() if v is not msgspec.UNSET})


class LaunchOverride(Record):
    """What a harness may change about the captured launch for the opt kernel."""

    grid: Dim3 | msgspec.UnsetType = msgspec.UNSET
    block: Dim3 | msgspec.UnsetType = msgspec.UNSET
    dynamic_shared_bytes: Count | msgspec.UnsetType = msgspec.UNSET


class OmittedRegion(Record, omit_defaults=True):
    """Memory the dispatch reaches that capture left out of the snapshot: the kernarg words
    of region ``name`` point there, but its bytes are not stored. ``max_region_bytes`` is the
    per-region cap capture ran with: a region larger than it was left out by the cap (and
    ``kpair capture --max-region-bytes`` keeps it); otherwise ``reason`` says why."""

    name: str
    address: Address
    size: Count
    reason: str
    max_region_bytes: Count | None = None

    def __post_init__(self) -> None:
        _coerce(self, "address", Address)

    @property
    def over_cap(self) -> bool:
        """Left out by the size cap (older snapshots record the cap in ``reason`` only)."""
        if self.max_region_bytes is None:
            return "per-region cap" in self.reason
        return self.size > self.max_region_bytes


class Kernarg(Record):
    """The kernel argument blob exactly as launched, and its parameter layout."""

    blob: BlobRef
    params: tuple[Param, ...]

    def __post_init__(self) -> None:
        _coerce(self, "params", tuple)
        end = 0
        for i, p in enumerate(self.params):
            if p.offset < end:
                raise Invalid("parameters overlap or are out of order", f"params[{i}].offset")
            end = p.offset + p.size
        if end > self.blob.size:
            raise Invalid(f"layout ends at byte {end}, blob holds {self.blob.size}", "params")


class CodeObject(Record):
    """The binary that holds the kernel (``format``: elf-so, cubin, fatbin, ptx, hsaco)."""

    blob: BlobRef
    format: CodeFormat
    kernel_name: str


OP_KINDS = ("kernel", "memset", "copy")


class Op(Record, omit_defaults=True):
    """One operation of a range. ``kind`` "kernel" (the default, not written): its code
    object, launch and kernarg (as launched). "memset": ``size`` bytes at ``dst`` set to
    ``value`` repeated in elements of ``element_size`` bytes. "copy": ``size`` bytes from
    ``src`` to ``dst``, device to device. ``dst``/``src`` are captured addresses inside the
    snapshot's regions or scratch (a replay moves them as it moves kernarg pointers).
    ``stream``: the stream the program issued it on (what capture saw; a replay runs every
    operation on its one stream, in order)."""

    code: CodeObject | None = msgspec.field(default=None, name="code_object")
    launch: Launch | None = None
    kernarg: Kernarg | None = None
    kind: Literal[OP_KINDS] = "kernel"  # type: ignore[valid-type]
    dst: Address | None = None
    src: Address | None = None
    size: Count = 0
    value: Count = 0
    element_size: Literal[1, 2, 4] = 1
    stream: Address | None = None

    def __post_init__(self) -> None:
        for name in ("dst", "src", "stream"):
            if getattr(self, name) is not None:
                _coerce(self, name, Address)
        kernel = self.kind == "kernel"
        for name in ("code", "launch", "kernarg"):
            if (getattr(self, name) is None) == kernel:
                field = "code_object" if name == "code" else name
                raise Invalid(f"a {self.kind} operation {'needs' if kernel else 'has no'} "
                              f"{field}", field)
        if kernel:
            if self.dst is not None or self.src is not None or self.size:
                raise Invalid("a kernel operation has no dst, src or size", "kind")
            return
        if self.dst is None or not self.size:
            raise Invalid(f"a {self.kind} operation needs dst and a size of 1 or more", "dst")
        if (self.src is None) == (self.kind == "copy"):
            raise Invalid(f"a {self.kind} operation {'needs' if self.kind == 'copy' else 'has no'}"
                          " src", "src")
        if self.kind == "memset":
            if self.size % self.element_size:
                raise Invalid(f"{self.size} bytes is not a whole number of "
                              f"{self.element_size}-byte elements", "size")
            if self.value >= 1 << (8 * self.element_size):
                raise Invalid(f"{self.value} does not fit {self.element_size} byte(s)", "value")

    @property
    def label(self) -> str:
        """The kernel's name, or ``memset``/``copy``."""
        return self.code.kernel_name if self.code is not None else self.kind


class Regen(Record, omit_defaults=True):
    """A region's pre-state as the operations that made it (schema v2): the region is
    zero-filled, then ``ops`` run in order on the placed regions; the result must hold
    ``size`` bytes of digest ``sha256``. ``digests[j]`` (when recorded) is the region's sha256
    after ``ops[j]``, so a replay that diverges names the operation. ``reads`` names the other
    regions the operations read: each is itself regenerable in the same snapshot, and is
    regenerated first. Operations that read nothing (seeded generators, fills) root a chain.
    ``digest64`` (optional) is the same bytes' ``digest64`` (key 0), and ``digests64[j]`` the
    region's after ``ops[j]``: a replay checks the region by them on the device, where its
    memory is, instead of reading it back (older snapshots without them: by sha256)."""

    ops: tuple[Op, ...]
    sha256: Sha256
    size: Positive
    reads: tuple[RegionName, ...] = ()
    digests: tuple[Sha256, ...] = ()
    digest64: Digest64 | None = None
    digests64: tuple[Digest64, ...] = ()

    def __post_init__(self) -> None:
        for name in ("ops", "reads", "digests", "digests64"):
            _coerce(self, name, tuple)
        if self.digests64:
            if self.digest64 is None:
                raise Invalid("per-operation digests64 need the region's digest64",
                              "digest64")
            if len(self.digests64) != len(self.ops):
                raise Invalid(f"{len(self.digests64)} digests64 for {len(self.ops)} "
                              "operations", "digests64")
            if self.digests64[-1] != self.digest64:
                raise Invalid("the last operation's digest64 must be the region's digest64",
                              "digests64")
        if not self.ops:
            raise Invalid("a chain has at least one operation", "ops")
        if self.digests:
            if len(self.digests) != len(self.ops):
                raise Invalid(f"{len(self.digests)} digests for {len(self.ops)} operations",
                              "digests")
            if self.digests[-1] != self.sha256:
                raise Invalid("the last operation's digest must be the region's sha256",
                              "digests")
        if len(set(self.reads)) != len(self.reads):
            raise Invalid("a region is named twice", "reads")


_HOLDS = {"regen": "chain makes", "post_digest": "digests are of"}


class StateDigest(Record):
    """A region's post-state kept as digests only, no bytes (schema v2, ``Region.post_digest``):
    ``size`` bytes of sha256 ``sha256`` and ``digest64`` (key 0). A replay reproduces it by
    ``digest64`` computed on the device; what needs the bytes refuses it, naming it."""

    size: Positive
    sha256: Sha256
    digest64: Digest64


class Region(Record, omit_defaults=True):
    """A memory region the kernel can reach: captured ``address``, ``size``, pre/post state.

    The pre-state is a blob (``pre``) or, from schema v2, a chain of operations that
    regenerates it (``regen``); exactly one of the two. ``post`` may be left out only beside
    ``regen``: the region is unchanged (its post-state is its pre-state). From schema v2 the
    post-state may instead be kept as digests only (``post_digest``, a ``StateDigest``: a
    written region larger than capture's ``--post-digest-over``). The properties ``pre`` and
    ``post`` give the pre- and post-state's reference (a ``BlobRef``, the ``Regen`` or the
    ``StateDigest``: each has ``size`` and ``sha256``)."""

    name: RegionName
    address: Address
    size: Positive
    pre_blob: BlobRef | None = msgspec.field(default=None, name="pre")
    post_blob: BlobRef | None = msgspec.field(default=None, name="post")
    dtype: DtypeHint | None = None
    #: In a range: "in" (no operation writes it: live-in), "out" (written; declared an
    #: output) or "inout" (written, updated in place). None: not said (a single dispatch).
    role: Role | None = None
    regen: Regen | None = None
    post_digest: StateDigest | None = None

    def __post_init__(self) -> None:
        _coerce(self, "address", Address)
        if not 0 <= self.address < 2**64:
            raise Invalid(f"{self.address:#x} is not a 64-bit address", "address")
        if (self.pre_blob is None) == (self.regen is None):
            raise Invalid("a region's pre-state is a blob (pre) or a chain (regen), exactly "
                          "one of them", "pre" if self.pre_blob is None else "regen")
        if self.post_blob is not None and self.post_digest is not None:
            raise Invalid("a region's post-state is a blob (post) or digests (post_digest), "
                          "not both", "post_digest")
        if self.post_blob is None and self.post_digest is None and self.regen is None:
            raise Invalid("a region without a chain needs its post-state blob", "post")
        for key, ref in (("pre", self.pre_blob), ("post", self.post_blob),
                         ("regen", self.regen), ("post_digest", self.post_digest)):
            if ref is not None and ref.size != self.size:
                raise Invalid(f"{_HOLDS.get(key, 'blob holds')} "
                              f"{ref.size} bytes, region is {self.size}", f"{key}.size")

    @property
    def pre(self) -> BlobRef | Regen:
        """The pre-state: its blob, or the chain that regenerates it."""
        return self.pre_blob if self.pre_blob is not None else self.regen

    @property
    def post(self) -> BlobRef | Regen | StateDigest:
        """The post-state: its blob, its digests, or (left out) the pre-state's reference."""
        if self.post_blob is not None:
            return self.post_blob
        return self.post_digest if self.post_digest is not None else self.pre

    @property
    def post_is_digest(self) -> bool:
        """The post-state was kept as digests only: no bytes of it are stored."""
        return self.post_digest is not None

    @property
    def regenerable(self) -> bool:
        return self.regen is not None

    @property
    def end(self) -> int:
        return self.address + self.size


class ScratchRegion(Record):
    """Memory a range uses only inside itself (``scratch``): its place and size, no bytes.
    A replay maps it and poisons it before every execution; nobody judges it."""

    name: RegionName
    address: Address
    size: Positive

    def __post_init__(self) -> None:
        _coerce(self, "address", Address)
        if not 0 <= self.address < 2**64:
            raise Invalid(f"{self.address:#x} is not a 64-bit address", "address")

    @property
    def end(self) -> int:
        return self.address + self.size


class OutputSpan(Record):
    """A range's declared output (``kpair.mark(..., outputs=)``): ``size`` bytes at
    ``offset`` into region ``region`` (role ``out``). The region is the allocator block that
    holds the tensor; the span is the tensor's own bytes, what a judge compares and what
    binds two ranges' outputs (their blocks may differ in size)."""

    region: RegionName
    offset: Count
    size: Positive


class DeadSpan(Record):
    """Bytes of a written region that a range which declares its outputs leaves in no live
    allocation: memory the allocator handed out again inside the range (an intermediate
    freed before the end, whose block later held part of an output) and no declared output
    holds. Nothing reads them after the range; a replay zeroes them after every execution,
    ref's and a candidate's alike, so neither is held to what the other left there (the
    stored post-state holds zeros there too)."""

    region: RegionName
    offset: Count
    size: Positive


class Manifest(Record, kw_only=True, tag_field="schema", tag=SCHEMA):
    """``snapshot.json``: everything about one dispatch except the bytes (those are blobs)."""

    schema_version: Literal[SCHEMA_VERSIONS] = 1  # type: ignore[valid-type]
    backend: str
    arch: str
    complete: bool = True
    code: CodeObject = msgspec.field(name="code_object")
    launch: Launch
    kernarg: Kernarg
    regions: tuple[Region, ...]
    environment: dict[str, Any] = msgspec.field(default_factory=dict)
    provenance: dict[str, Any] = msgspec.field(default_factory=dict)
    # Written only when capture left memory out (then ``complete`` is false): a complete
    # snapshot's manifest reads exactly as before the field existed.
    omitted_regions: tuple[OmittedRegion, ...] | msgspec.UnsetType = msgspec.UNSET
    # A range (several operations in order): written only for one. Its first kernel is the
    # top-level code object, launch and kernarg, so a reader of one dispatch sees the first.
    ops: tuple[Op, ...] | msgspec.UnsetType = msgspec.UNSET
    scratch: tuple[ScratchRegion, ...] | msgspec.UnsetType = msgspec.UNSET
    #: A range's declared outputs as spans of its ``out`` regions (written only for one
    #: that declares any).
    outputs: tuple[OutputSpan, ...] | msgspec.UnsetType = msgspec.UNSET
    #: Bytes of written regions dead at a range's end (written only for a range that has
    #: any): zeroed after every execution.
    dead: tuple[DeadSpan, ...] | msgspec.UnsetType = msgspec.UNSET

    def __post_init__(self) -> None:
        _coerce(self, "regions", tuple)
        self._check_chains()
        self._check_outputs()
        self._check_dead()
        if self.ops is not msgspec.UNSET:
            _coerce(self, "ops", tuple)
            if not self.ops:
                raise Invalid("a range has at least one operation", "ops")
            # The first kernel operation is the top-level one (memsets and copies may
            # come before it).
            i, first = next(((i, o) for i, o in enumerate(self.ops) if o.kind == "kernel"),
                            (0, self.ops[0]))
            if (first.code, first.launch, first.kernarg) != (self.code, self.launch,
                                                             self.kernarg):
                raise Invalid(f"ops[{i}] (the first kernel) must be the top-level "
                              "code_object, launch and kernarg", f"ops[{i}]")
        spans = [(r.address, r.end, r.name) for r in self.regions]
        if self.scratch is not msgspec.UNSET:
            _coerce(self, "scratch", tuple)
            spans += [(s.address, s.end, s.name) for s in self.scratch]
            taken = {r.name for r in self.regions}
            for i, s in enumerate(self.scratch):
                if s.name in taken:
                    raise Invalid(f"duplicate name {s.name!r}", f"scratch[{i}].name")
                taken.add(s.name)
            ordered_all = sorted(spans)
            for a, b in zip(ordered_all, ordered_all[1:], strict=False):
                if b[0] < a[1] and (a[2] in taken - {r.name for r in self.regions}
                                    or b[2] in taken - {r.name for r in self.regions}):
                    raise Invalid(f"{a[2]!r} and {b[2]!r} overlap", "scratch")
        if self.omitted_regions is not msgspec.UNSET:
            _coerce(self, "omitted_regions", tuple)
            if self.omitted_regions and self.complete:
                raise Invalid("a snapshot that lists omitted regions is not complete",
                              "complete")
        names: set[str] = set()
        for i, reg in enumerate(self.regions):
            if reg.name in names:
                raise Invalid(f"duplicate region name {reg.name!r}", f"regions[{i}].name")
            names.add(reg.name)
        ordered = sorted(self.regions, key=lambda x: x.address)
        for a, b in zip(ordered, ordered[1:], strict=False):
            if b.address < a.end:
                raise Invalid(f"regions {a.name!r} and {b.name!r} overlap", "regions")

    def _check_spans(self, field: str, roles: tuple[str, ...], what: str) -> None:
        """Each span of ``field`` (``outputs``, ``dead``) lies inside one region whose role is
        one of ``roles``."""
        regions = {r.name: r for r in self.regions}
        for i, o in enumerate(getattr(self, field)):
            r = regions.get(o.region)
            if r is None:
                raise Invalid(f"names {o.region!r}, which is no region of this snapshot",
                              f"{field}[{i}].region")
            if r.role not in roles:
                raise Invalid(f"region {o.region!r} {what} but its role is {r.role!r}, not "
                              + " or ".join(map(repr, roles)), f"{field}[{i}].region")
            if o.offset + o.size > r.size:
                raise Invalid(f"{o.size} bytes at offset {o.offset} reach past the end of "
                              f"region {o.region!r} ({r.size} bytes)", f"{field}[{i}].size")

    def _check_outputs(self) -> None:
        """Each declared output lies inside one region of role ``out``."""
        if self.outputs is msgspec.UNSET:
            return
        _coerce(self, "outputs", tuple)
        self._check_spans("outputs", ("out",), "holds a declared output")

    def _check_dead(self) -> None:
        """Each dead span lies inside one written region (role ``out`` or ``inout``) and
        overlaps no declared output."""
        if self.dead is msgspec.UNSET:
            return
        _coerce(self, "dead", tuple)
        self._check_spans("dead", ("out", "inout"), "has dead bytes")
        for i, d in enumerate(self.dead):
            for o in self.output_spans:
                if o.region == d.region and o.offset < d.offset + d.size \
                        and d.offset < o.offset + o.size:
                    raise Invalid(f"bytes [{d.offset}, +{d.size}) of region {d.region!r} "
                                  "are dead and a declared output", f"dead[{i}]")

    @property
    def dead_spans(self) -> tuple[DeadSpan, ...]:
        """Dead bytes of written regions (none: an empty tuple)."""
        return () if self.dead is msgspec.UNSET else self.dead

    @property
    def output_spans(self) -> tuple[OutputSpan, ...]:
        """The declared outputs (none: an empty tuple)."""
        return () if self.outputs is msgspec.UNSET else self.outputs

    def _check_chains(self) -> None:
        """Regenerable regions and digest post-states need v2 (a record built in code gets
        it), and each chain reads only regenerable regions of this snapshot, never itself,
        with no cycle."""
        chains = {r.name: (i, r.regen) for i, r in enumerate(self.regions)
                  if r.regen is not None}
        if (chains or any(r.post_digest is not None for r in self.regions)) \
                and self.schema_version < 2:
            msgspec.structs.force_setattr(self, "schema_version", 2)
        if not chains:
            return
        names = {r.name for r in self.regions}
        for name, (i, regen) in chains.items():
            for k, other in enumerate(regen.reads):
                at = f"regions[{i}].regen.reads[{k}]"
                if other == name:
                    raise Invalid("a chain cannot read the region it makes", at)
                if other not in names:
                    raise Invalid(f"names {other!r}, which is no region of this snapshot", at)
                if other not in chains:
                    raise Invalid(f"reads {other!r}, which is not regenerable (stored as "
                                  "bytes): a chain reads only regenerable regions", at)
        self.regen_order()   # refuses a cycle

    def regen_order(self) -> list[int]:
        """Indices of the regenerable regions, each after every region its chain reads."""
        chains = {r.name: (i, r.regen) for i, r in enumerate(self.regions)
                  if r.regen is not None}
        order: list[int] = []
        state: dict[str, int] = {}   # 1: on the path, 2: placed

        def visit(name: str, path: tuple[str, ...]) -> None:
            if state.get(name) == 2:
                return
            i, regen = chains[name]
            if state.get(name) == 1:
                raise Invalid("chains read each other in a cycle: " + " -> ".join(
                    (*path, name)), f"regions[{i}].regen.reads")
            state[name] = 1
            for other in regen.reads:
                if other in chains:
                    visit(other, (*path, name))
            state[name] = 2
            order.append(i)

        for name in chains:
            visit(name, ())
        return order

    @property
    def operations(self) -> tuple[Op, ...]:
        """Every operation in order: a single dispatch is the one-operation range."""
        if self.ops is msgspec.UNSET:
            return (Op(self.code, self.launch, self.kernarg),)
        return self.ops

    @property
    def scratch_regions(self) -> tuple[ScratchRegion, ...]:
        return () if self.scratch is msgspec.UNSET else self.scratch

    @property
    def is_range(self) -> bool:
        return self.ops is not msgspec.UNSET

    def region(self, name: str) -> Region:
        for r in self.regions:
            if r.name == name:
                return r
        raise KeyError(name)

    @classmethod
    def from_json(cls, obj: Any, *, path: object = None) -> Manifest:
        """The strict reader: ``obj`` is the parsed ``snapshot.json`` found at ``path``."""
        version = obj.get("schema_version") if isinstance(obj, dict) else None
        check_version(obj, SCHEMA, version if version in SCHEMA_VERSIONS else SCHEMA_VERSION,
                      path=path, error=SnapshotFormatError)
        if version == 1:
            for i, r in enumerate(obj.get("regions") or ()):
                for key, what in (("regen", "a regenerable region"),
                                  ("post_digest", "a post-state kept as digests")):
                    if isinstance(r, dict) and key in r:
                        raise SnapshotFormatError(f"{what} needs schema_version 2",
                                                  path=path, field=f"regions[{i}].{key}")
        return convert(obj, cls, path=path, error=SnapshotFormatError)


def detect_format(image: bytes) -> str:
    """The code object format of ``image``, from its magic bytes."""
    if image[:4] == b"\x7fELF" and len(image) >= 20:
        endian = "<" if image[5] == 1 else ">"
        (machine,) = struct.unpack_from(endian + "H", image, 18)
        return {_EM_CUDA: "cubin", _EM_AMDGPU: "hsaco"}.get(machine, "elf-so")
    if len(image) >= 4 and struct.unpack_from("<I", image)[0] == _FATBIN_MAGIC:
        return "fatbin"
    if b".version" in image[:4096] and b".target" in image[:4096]:
        return "ptx"
    raise SnapshotFormatError("unrecognised code object (not ELF, fatbin or PTX)")
