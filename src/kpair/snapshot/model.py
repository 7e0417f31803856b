"""The records of snapshot format v1, as frozen dataclasses, with their JSON mapping.

A snapshot describes one kernel dispatch completely enough to replay it elsewhere:
the code object, the kernel name, the launch geometry and attributes, the kernarg blob
with its layout, and every memory region the kernarg can reach, before and after the
launch. ``docs/format.md`` is the contract; ``from_json`` is the strict reader of it and
names the offending field (``regions[2].address``) in every error it raises.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from typing import Any

from ..errors import SnapshotFormatError

SCHEMA = "kpair.snapshot"
SCHEMA_VERSION = 1

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

#: Element types a region may declare (``Region.dtype``); reports decode values with them.
DTYPE_HINTS = ("float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64",
               "uint8", "uint16", "uint32", "uint64", "bool")

_SHA = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")


class _Reader:
    """Typed access into a JSON object that reports the dotted path of a bad field."""

    def __init__(self, obj: Any, where: str, path: object):
        if not isinstance(obj, dict):
            raise SnapshotFormatError("expected a JSON object", path=path, field=where or None)
        self.obj, self.where, self.path = obj, where, path

    def _f(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def fail(self, key: str, message: str) -> SnapshotFormatError:
        return SnapshotFormatError(message, path=self.path, field=self._f(key))

    def get(self, key: str, types: type | tuple[type, ...], default: Any = ...) -> Any:
        if key not in self.obj:
            if default is ...:
                raise self.fail(key, "missing")
            return default
        value = self.obj[key]
        allowed = types if isinstance(types, tuple) else (types,)
        if isinstance(value, bool) and bool not in allowed:
            raise self.fail(key, f"expected {_tname(types)}, got a boolean")
        if not isinstance(value, types):
            raise self.fail(key, f"expected {_tname(types)}, got {type(value).__name__}")
        return value

    def int(self, key: str, *, minimum: int = 0, default: Any = ...) -> int:
        value = self.get(key, int, default)
        if value is not default and value < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {value}")
        return value

    def address(self, key: str) -> int:
        text = self.get(key, str)
        try:
            value = int(text, 16)
        except ValueError:
            raise self.fail(key, f"expected a hex address like '0x7f00', got {text!r}") from None
        if not text.startswith("0x") or not 0 <= value < 2**64:
            raise self.fail(key, f"expected a 64-bit hex address like '0x7f00', got {text!r}")
        return value

    def child(self, key: str) -> _Reader:
        return _Reader(self.get(key, dict), self._f(key), self.path)

    def items(self, key: str, default: Any = ...) -> list[_Reader]:
        values = self.get(key, list, default)
        return [_Reader(v, f"{self._f(key)}[{i}]", self.path) for i, v in enumerate(values)]

    def triple(self, key: str) -> tuple[int, int, int]:
        value = self.get(key, list)
        if len(value) != 3 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                                      for v in value):
            raise self.fail(key, f"expected three positive integers, got {value!r}")
        return tuple(value)  # type: ignore[return-value]

    def no_extra(self, allowed: set[str]) -> None:
        extra = sorted(set(self.obj) - allowed)
        if extra:
            raise self.fail(extra[0], "unknown field (schema v1 does not define it)")


def _tname(types: type | tuple[type, ...]) -> str:
    types = types if isinstance(types, tuple) else (types,)
    names = {dict: "object", list: "array", str: "string", int: "integer", float: "number",
             bool: "boolean"}
    return " or ".join(names.get(t, t.__name__) for t in types)


@dataclass(frozen=True)
class BlobRef:
    """A content-addressed blob: ``path`` relative to the snapshot, raw ``size`` and ``sha256``."""

    path: str
    size: int
    sha256: str
    compression: str = "zstd"

    def to_json(self) -> dict:
        return {"path": self.path, "size": self.size, "sha256": self.sha256,
                "compression": self.compression}

    @classmethod
    def from_json(cls, r: _Reader) -> BlobRef:
        r.no_extra({"path", "size", "sha256", "compression"})
        path = r.get("path", str)
        if path.startswith("/") or "\\" in path or ".." in path.split("/") or not path:
            raise r.fail("path", f"must be a relative path inside the snapshot, got {path!r}")
        sha = r.get("sha256", str)
        if not _SHA.match(sha):
            raise r.fail("sha256", "expected 64 lowercase hex digits")
        compression = r.get("compression", str, "zstd")
        if compression not in ("zstd", "none"):
            raise r.fail("compression", f"expected 'zstd' or 'none', got {compression!r}")
        return cls(path, r.int("size"), sha, compression)


@dataclass(frozen=True)
class Param:
    """One kernel parameter: its byte ``offset`` and ``size`` in the kernarg blob."""

    offset: int
    size: int
    kind: str = "bytes"
    name: str = ""

    def to_json(self) -> dict:
        out: dict[str, Any] = {"offset": self.offset, "size": self.size, "kind": self.kind}
        if self.name:
            out["name"] = self.name
        return out

    @classmethod
    def from_json(cls, r: _Reader) -> Param:
        r.no_extra({"offset", "size", "kind", "name"})
        kind = r.get("kind", str, "bytes")
        if kind not in PARAM_KINDS:
            raise r.fail("kind", f"unknown kind {kind!r} (one of {', '.join(PARAM_KINDS)})")
        size = r.int("size", minimum=1)
        if kind in SCALAR_SIZES and SCALAR_SIZES[kind] != size:
            raise r.fail("size", f"kind {kind} has size {SCALAR_SIZES[kind]}, got {size}")
        return cls(r.int("offset"), size, kind, r.get("name", str, ""))


@dataclass(frozen=True)
class LaunchAttribute:
    """A launch attribute (CUDA ``CUlaunchAttribute``): numeric id, name, raw value bytes."""

    id: int
    name: str
    value: bytes

    def to_json(self) -> dict:
        return {"id": self.id, "name": self.name, "value": self.value.hex()}

    @classmethod
    def from_json(cls, r: _Reader) -> LaunchAttribute:
        r.no_extra({"id", "name", "value"})
        try:
            value = bytes.fromhex(r.get("value", str))
        except ValueError:
            raise r.fail("value", "expected hex bytes") from None
        return cls(r.int("id"), r.get("name", str), value)


@dataclass(frozen=True)
class Launch:
    """Launch geometry: ``grid`` in blocks, ``block`` in threads, dynamic shared memory."""

    grid: tuple[int, int, int] = (1, 1, 1)
    block: tuple[int, int, int] = (1, 1, 1)
    dynamic_shared_bytes: int = 0
    attributes: tuple[LaunchAttribute, ...] = ()

    def to_json(self) -> dict:
        return {"grid": list(self.grid), "block": list(self.block),
                "dynamic_shared_bytes": self.dynamic_shared_bytes,
                "attributes": [a.to_json() for a in self.attributes]}

    @classmethod
    def from_json(cls, r: _Reader) -> Launch:
        r.no_extra({"grid", "block", "dynamic_shared_bytes", "attributes"})
        return cls(r.triple("grid"), r.triple("block"), r.int("dynamic_shared_bytes"),
                   tuple(LaunchAttribute.from_json(a) for a in r.items("attributes", [])))

    def override(self, changes: dict) -> Launch:
        """This launch with ``grid``/``block``/``dynamic_shared_bytes`` replaced (opt override)."""
        r = _Reader(changes, "launch_override", None)
        r.no_extra({"grid", "block", "dynamic_shared_bytes"})
        return Launch(r.triple("grid") if "grid" in changes else self.grid,
                      r.triple("block") if "block" in changes else self.block,
                      r.int("dynamic_shared_bytes", default=self.dynamic_shared_bytes),
                      self.attributes)


@dataclass(frozen=True)
class Region:
    """A memory region the kernel can reach: captured ``address``, ``size``, pre/post state."""

    name: str
    address: int
    size: int
    pre: BlobRef
    post: BlobRef
    dtype: str | None = None

    @property
    def end(self) -> int:
        return self.address + self.size

    def to_json(self) -> dict:
        out: dict[str, Any] = {"name": self.name, "address": hex(self.address),
                               "size": self.size, "pre": self.pre.to_json(),
                               "post": self.post.to_json()}
        if self.dtype:
            out["dtype"] = self.dtype
        return out

    @classmethod
    def from_json(cls, r: _Reader) -> Region:
        r.no_extra({"name", "address", "size", "pre", "post", "dtype"})
        name = r.get("name", str)
        if not _NAME.match(name):
            raise r.fail("name", f"region names use letters, digits, '_', '.', '-': {name!r}")
        size = r.int("size", minimum=1)
        pre, post = BlobRef.from_json(r.child("pre")), BlobRef.from_json(r.child("post"))
        for key, ref in (("pre", pre), ("post", post)):
            if ref.size != size:
                raise r.fail(f"{key}.size", f"blob holds {ref.size} bytes, region is {size}")
        dtype = r.get("dtype", str, None)
        if dtype is not None and dtype not in DTYPE_HINTS:
            raise r.fail("dtype", f"unknown dtype {dtype!r} (one of {', '.join(DTYPE_HINTS)})")
        return cls(name, r.address("address"), size, pre, post, dtype)


@dataclass(frozen=True)
class Kernarg:
    """The kernel argument blob exactly as launched, and its parameter layout."""

    blob: BlobRef
    params: tuple[Param, ...]

    def to_json(self) -> dict:
        return {"blob": self.blob.to_json(), "params": [p.to_json() for p in self.params]}

    @classmethod
    def from_json(cls, r: _Reader) -> Kernarg:
        r.no_extra({"blob", "params"})
        blob = BlobRef.from_json(r.child("blob"))
        params = tuple(Param.from_json(p) for p in r.items("params"))
        end = 0
        for i, p in enumerate(params):
            if p.offset < end:
                raise SnapshotFormatError("parameters overlap or are out of order", path=r.path,
                                          field=f"{r.where}.params[{i}].offset")
            end = p.offset + p.size
        if end > blob.size:
            raise r.fail("params", f"layout ends at byte {end}, blob holds {blob.size}")
        return cls(blob, params)


@dataclass(frozen=True)
class CodeObject:
    """The binary that holds the kernel (``format``: elf-so, cubin, fatbin, ptx, hsaco)."""

    blob: BlobRef
    format: str
    kernel_name: str

    def to_json(self) -> dict:
        return {"blob": self.blob.to_json(), "format": self.format,
                "kernel_name": self.kernel_name}

    @classmethod
    def from_json(cls, r: _Reader) -> CodeObject:
        r.no_extra({"blob", "format", "kernel_name"})
        fmt = r.get("format", str)
        if fmt not in CODE_FORMATS:
            raise r.fail("format", f"unknown code object format {fmt!r}")
        return cls(BlobRef.from_json(r.child("blob")), fmt, r.get("kernel_name", str))


CODE_FORMATS = ("elf-so", "cubin", "fatbin", "ptx", "hsaco")

_EM_CUDA, _EM_AMDGPU = 190, 224
_FATBIN_MAGIC = 0xBA55ED50


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




@dataclass(frozen=True)
class Manifest:
    """``snapshot.json``: everything about one dispatch except the bytes (those are blobs)."""

    backend: str
    arch: str
    code: CodeObject
    launch: Launch
    kernarg: Kernarg
    regions: tuple[Region, ...]
    environment: dict = field(default_factory=dict)
    provenance: dict = field(default_factory=dict)
    complete: bool = True
    schema_version: int = SCHEMA_VERSION

    def region(self, name: str) -> Region:
        for r in self.regions:
            if r.name == name:
                return r
        raise KeyError(name)

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "schema_version": self.schema_version,
                "backend": self.backend, "arch": self.arch, "complete": self.complete,
                "code_object": self.code.to_json(), "launch": self.launch.to_json(),
                "kernarg": self.kernarg.to_json(),
                "regions": [r.to_json() for r in self.regions],
                "environment": self.environment, "provenance": self.provenance}

    @classmethod
    def from_json(cls, obj: Any, *, path: object = None) -> Manifest:
        r = _Reader(obj, "", path)
        if r.get("schema", str) != SCHEMA:
            raise r.fail("schema", f"expected {SCHEMA!r}")
        version = r.get("schema_version", int)
        if version != SCHEMA_VERSION:
            raise r.fail("schema_version", f"version {version} is not supported by this kpair "
                         f"(it reads version {SCHEMA_VERSION}); upgrade kpair")
        r.no_extra({"schema", "schema_version", "backend", "arch", "complete", "code_object",
                    "launch", "kernarg", "regions", "environment", "provenance"})
        regions = tuple(Region.from_json(x) for x in r.items("regions"))
        names = set()
        for i, reg in enumerate(regions):
            if reg.name in names:
                raise SnapshotFormatError(f"duplicate region name {reg.name!r}", path=path,
                                          field=f"regions[{i}].name")
            names.add(reg.name)
        ordered = sorted(regions, key=lambda x: x.address)
        for a, b in zip(ordered, ordered[1:], strict=False):
            if b.address < a.end:
                raise SnapshotFormatError(f"regions {a.name!r} and {b.name!r} overlap",
                                          path=path, field="regions")
        return cls(backend=r.get("backend", str), arch=r.get("arch", str),
                   code=CodeObject.from_json(r.child("code_object")),
                   launch=Launch.from_json(r.child("launch")),
                   kernarg=Kernarg.from_json(r.child("kernarg")), regions=regions,
                   environment=r.get("environment", dict, {}),
                   provenance=r.get("provenance", dict, {}),
                   complete=r.get("complete", bool, True), schema_version=version)
