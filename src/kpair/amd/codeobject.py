"""What an AMDGPU code object (hsaco) says about its kernels, read from its metadata note.

A code object is an ELF file whose ``NT_AMDGPU_METADATA`` note (type 32, owner "AMDGPU")
holds a msgpack map: ``amdhsa.target`` and, per kernel in ``amdhsa.kernels``, its name, the
symbol of its kernel descriptor, every kernel argument (offset, size, value kind) and its
resource use. ``read_code_object(image)`` returns that as a ``CodeObjectInfo``; pyelftools
finds the note and msgspec decodes it, so no ELF or msgpack is parsed by hand here.

Arguments whose value kind starts with ``hidden_`` (block counts, group sizes, global
offsets, the printf and hostcall buffers, ...) are not written by the caller: the runtime
fills them for every dispatch. ``KernelMeta.explicit`` are the caller's arguments, the
ones a snapshot's kernarg layout describes.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import msgspec
from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from ..errors import FormatError, SymbolNotFound
from .target import TargetId

NT_AMDGPU_METADATA = 32
_EM_AMDGPU = "EM_AMDGPU"
#: EF_AMDGPU_MACH values of the processors kpair is tested with, for code objects without
#: ``amdhsa.target`` (code object v3); v4 and later always carry the target in the note.
_MACH = {0x2F: "gfx906", 0x30: "gfx908", 0x3F: "gfx90a", 0x40: "gfx940", 0x4B: "gfx941",
         0x4C: "gfx942", 0x4F: "gfx950", 0x36: "gfx1030", 0x41: "gfx1100"}
#: ELF ABI version → code object version (ELFABIVERSION_AMDGPU_HSA_V3 = 1, ...).
_CODE_OBJECT_VERSION = {1: 3, 2: 4, 3: 5, 4: 6}


@dataclass(frozen=True)
class KernelArg:
    offset: int
    size: int
    value_kind: str
    name: str = ""
    type_name: str = ""
    address_space: str = ""

    @property
    def hidden(self) -> bool:
        return self.value_kind.startswith("hidden_")


@dataclass(frozen=True)
class KernelMeta:
    """One entry of ``amdhsa.kernels``."""

    name: str
    symbol: str
    args: tuple[KernelArg, ...]
    kernarg_segment_size: int
    kernarg_segment_align: int
    group_segment_fixed_size: int
    private_segment_fixed_size: int
    sgpr_count: int
    vgpr_count: int
    agpr_count: int
    wavefront_size: int
    max_flat_workgroup_size: int
    uses_dynamic_stack: bool
    raw: dict

    @property
    def explicit(self) -> tuple[KernelArg, ...]:
        return tuple(a for a in self.args if not a.hidden)

    @property
    def hidden(self) -> tuple[KernelArg, ...]:
        return tuple(a for a in self.args if a.hidden)

    @property
    def explicit_size(self) -> int:
        """Bytes of the kernarg segment the caller writes (the end of the last explicit arg)."""
        return max((a.offset + a.size for a in self.explicit), default=0)

    def param_layout(self) -> list[tuple[int, int]]:
        return [(a.offset, a.size) for a in self.explicit]


@dataclass(frozen=True)
class CodeObjectInfo:
    target: TargetId
    target_text: str
    code_object_version: int | None
    kernels: tuple[KernelMeta, ...]
    metadata: dict

    def kernel(self, name: str) -> KernelMeta:
        """The kernel called ``name`` (or whose descriptor symbol is ``name``/``name.kd``)."""
        for k in self.kernels:
            if name in (k.name, k.symbol, k.symbol.removesuffix(".kd")):
                return k
        known = ", ".join(k.name for k in self.kernels) or "none"
        raise SymbolNotFound(f"kernel {name!r} is not in the code object (kernels: {known})")


def read_code_object(image: bytes) -> CodeObjectInfo:
    """Parse the metadata note of an AMDGPU code object; FormatError names what is wrong."""
    try:
        elf = ELFFile(io.BytesIO(image))
        machine = elf["e_machine"]
        if machine != _EM_AMDGPU:
            raise FormatError(f"not an AMDGPU code object (ELF machine {machine})")
        raw_note = _metadata_note(elf)
        flags, abi = elf["e_flags"], elf["e_ident"]["EI_ABIVERSION"]
    except (ELFError, ValueError, KeyError) as e:
        raise FormatError(f"not a readable ELF code object: {e}") from None
    if raw_note is None:
        raise FormatError("the code object has no NT_AMDGPU_METADATA note (code object v2 "
                          "or stripped); kpair reads v3 and later")
    try:
        meta = msgspec.msgpack.decode(raw_note)
    except msgspec.DecodeError as e:
        raise FormatError(f"the AMDGPU metadata note is not valid msgpack: {e}") from None
    if not isinstance(meta, dict):
        raise FormatError("the AMDGPU metadata note is not a map")
    text = meta.get("amdhsa.target") or _target_from_flags(flags)
    kernels = tuple(_kernel(k, i) for i, k in enumerate(meta.get("amdhsa.kernels") or ()))
    return CodeObjectInfo(TargetId.parse(text), text, _CODE_OBJECT_VERSION.get(abi), kernels,
                          meta)


def _metadata_note(elf: ELFFile) -> bytes | None:
    for section in elf.iter_sections():
        if section["sh_type"] != "SHT_NOTE":
            continue
        for note in section.iter_notes():
            if note["n_name"] == "AMDGPU" and note["n_type"] == NT_AMDGPU_METADATA:
                desc = note["n_desc"]
                return desc if isinstance(desc, bytes) else desc.encode("latin-1")
    return None


def _target_from_flags(flags: int) -> str:
    mach = _MACH.get(flags & 0xFF)
    if mach is None:
        raise FormatError(f"no amdhsa.target in the metadata and unknown EF_AMDGPU_MACH "
                          f"{flags & 0xFF:#x}")
    return mach


def _kernel(k: object, index: int) -> KernelMeta:
    where = f"amdhsa.kernels[{index}]"
    if not isinstance(k, dict):
        raise FormatError("expected a map", field=where)

    def get(key: str, kind: type, default: object = ...):
        value = k.get(key, default)
        if value is ...:
            raise FormatError("missing", field=f"{where}.{key}")
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise FormatError(f"expected {kind.__name__}, got {value!r}",
                              field=f"{where}.{key}")
        return value

    args = []
    for j, a in enumerate(get(".args", list, [])):
        if not isinstance(a, dict) or not {".offset", ".size", ".value_kind"} <= a.keys():
            raise FormatError("expected .offset, .size and .value_kind",
                              field=f"{where}.args[{j}]")
        args.append(KernelArg(int(a[".offset"]), int(a[".size"]), str(a[".value_kind"]),
                              str(a.get(".name", "")), str(a.get(".type_name", "")),
                              str(a.get(".address_space", ""))))
    return KernelMeta(
        name=get(".name", str), symbol=get(".symbol", str), args=tuple(args),
        kernarg_segment_size=get(".kernarg_segment_size", int),
        kernarg_segment_align=get(".kernarg_segment_align", int, 8),
        group_segment_fixed_size=get(".group_segment_fixed_size", int),
        private_segment_fixed_size=get(".private_segment_fixed_size", int),
        sgpr_count=get(".sgpr_count", int), vgpr_count=get(".vgpr_count", int),
        agpr_count=get(".agpr_count", int, 0), wavefront_size=get(".wavefront_size", int),
        max_flat_workgroup_size=get(".max_flat_workgroup_size", int),
        uses_dynamic_stack=bool(k.get(".uses_dynamic_stack", False)), raw=dict(k))
