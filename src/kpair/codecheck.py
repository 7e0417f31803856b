"""What a code object says about one kernel, read without loading it: the checks of pair time.

``check_kernel(image, fmt, kernel, manifest, role)`` refuses, before a harness is written, a
code object that cannot run on the snapshot's dispatch — the error a run would otherwise
give minutes later:

- the wrong format for the backend, or the wrong architecture (``ArchitectureMismatch``):
  host ELF machine against the snapshot's ``arch``; an AMDGPU target against a gfx one;
- the kernel symbol missing (``SymbolNotFound``): a defined function in ``.dynsym`` (host
  shared objects), in ``.symtab`` (CUDA cubin), an ``.entry`` (PTX), the metadata note
  (AMDGPU);
- a parameter layout other than the snapshot's kernarg (``AbiMismatch``), where the binary
  records one: the ``EIATTR_KPARAM_INFO`` records of a cubin's ``.nv.info.<kernel>``
  section, the explicit arguments of an AMDGPU metadata note, a host shared object's DWARF
  when it was built with ``-g`` (``elfabi``: count and kind of every parameter; a host
  symbol must also be a function in ``.text``). A stripped host object says nothing.

What the binary does not say (a fatbin's members, a stripped object) is left to the run,
which checks again with the driver's own view. pyelftools reads the ELF files.
"""

from __future__ import annotations

import io
import re
import struct

from .amd.codeobject import read_code_object
from .elfabi import check_params
from .errors import AbiMismatch, ArchitectureMismatch, FormatError, SymbolNotFound

#: Code object formats each backend loads.
FORMATS = {"host": ("elf-so",), "cuda": ("cubin", "fatbin", "ptx"), "hip": ("hsaco",)}

_EIFMT_SVAL = 0x04
_EIATTR_KPARAM_INFO = (0x17, 0x45)  # and its v2 of newer toolchains: same payload


def check_kernel(image: bytes, fmt: str, kernel: str, manifest, role: str) -> None:
    """Refuse ``image`` as the ``role`` ("ref", "opt") code object of a pair on the snapshot
    ``manifest`` when its format, architecture, kernel symbol or parameter layout is wrong
    (see the module docstring)."""
    backend = manifest.backend
    if fmt not in FORMATS.get(backend, (fmt,)):
        raise ArchitectureMismatch(f"{role}: the {backend} backend loads "
                                   f"{' / '.join(FORMATS[backend])} code objects, not {fmt}")
    want = [(p.offset, p.size) for p in manifest.kernarg.params]
    if fmt == "elf-so":
        _check_host(image, kernel, manifest.arch, role)

        check_params(image, kernel, manifest.kernarg.params, role)
    elif fmt == "cubin":
        _check_cubin(image, kernel, want, role)
    elif fmt == "ptx":
        _check_ptx(image, kernel, role)
    elif fmt == "hsaco":
        _check_hsaco(image, kernel, want, role)


def _elf(image: bytes, role: str):
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        return ELFFile(io.BytesIO(image))
    except (ELFError, ValueError, struct.error) as e:
        raise FormatError(f"{role}: not a readable ELF file ({e})") from None


def _defined_functions(elf, section: str) -> set[str] | None:
    """Names of the functions ``section`` (a symbol table) defines; None without one."""
    from elftools.common.exceptions import ELFError

    try:
        table = elf.get_section_by_name(section)
        if table is None or not hasattr(table, "iter_symbols"):
            return None
        return {s.name for s in table.iter_symbols()
                if s["st_info"]["type"] in ("STT_FUNC", "STT_GNU_IFUNC")
                and s["st_shndx"] != "SHN_UNDEF"}
    except (ELFError, ValueError, struct.error):
        return None


#: ELF machines by the names the host backend gives its architectures.
_MACHINES = {"EM_X86_64": "x86_64", "EM_AARCH64": "aarch64", "EM_PPC64": "ppc64le",
             "EM_RISCV": "riscv64", "EM_386": "i386"}


def _check_host(image: bytes, kernel: str, arch: str, role: str) -> None:
    elf = _elf(image, role)
    machine = elf["e_machine"]
    built = _MACHINES.get(machine, str(machine))
    if built != arch:
        raise ArchitectureMismatch(f"{role} code object is built for {built}; the snapshot "
                                   f"was captured on {arch}")
    names = _defined_functions(elf, ".dynsym")
    if names is not None and kernel not in names:
        raise SymbolNotFound(f"{role} kernel {kernel!r} is not exported by the code object"
                             + _near(kernel, names))


def _check_cubin(image: bytes, kernel: str, want: list[tuple[int, int]], role: str) -> None:
    elf = _elf(image, role)
    names = _defined_functions(elf, ".symtab")
    if names is not None and kernel not in names:
        raise SymbolNotFound(f"{role} kernel {kernel!r} is not in the cubin" + _near(kernel, names))
    info = elf.get_section_by_name(f".nv.info.{kernel}")
    if info is None:
        return
    layout = _kparams(info.data())
    if layout is not None and layout != want:
        raise AbiMismatch(f"{role} kernel {kernel!r} takes parameters {layout} (offset, size; "
                          f"from the cubin's .nv.info), the snapshot's kernarg has {want}")


def _kparams(data: bytes) -> list[tuple[int, int]] | None:
    """The (offset, size) of each parameter, in ordinal order, from a ``.nv.info.<kernel>``
    section's KPARAM_INFO records; None when the records cannot be read."""
    params: dict[int, tuple[int, int]] = {}
    at = 0
    try:
        while at + 4 <= len(data):
            fmt, attr, value = struct.unpack_from("<BBH", data, at)
            at += 4
            if fmt != _EIFMT_SVAL:
                continue  # NVAL, BVAL, HVAL: the value is in the 4-byte header
            payload = data[at:at + value]
            at += value
            if attr in _EIATTR_KPARAM_INFO and len(payload) >= 12:
                _, ordinal, offset, packed = struct.unpack_from("<IHHI", payload)
                params[ordinal] = (offset, (packed >> 18) & 0x3FFF)
    except struct.error:
        return None
    if at != len(data) or sorted(params) != list(range(len(params))):
        return None
    return [params[i] for i in range(len(params))]


def _check_ptx(image: bytes, kernel: str, role: str) -> None:
    text = image.decode("utf-8", errors="replace")
    entries = set(re.findall(r"\.entry\s+([A-Za-z_$.][\w$.]*)", text))
    if entries and kernel not in entries:
        raise SymbolNotFound(f"{role} kernel {kernel!r} is not an .entry of the PTX"
                             + _near(kernel, entries))


def _check_hsaco(image: bytes, kernel: str, want: list[tuple[int, int]], role: str) -> None:
    meta = read_code_object(image).kernel(kernel)  # SymbolNotFound names the kernels there
    layout = meta.param_layout()
    if layout != want:
        raise AbiMismatch(f"{role} kernel {kernel!r} takes explicit arguments {layout} (offset, "
                          f"size; from the code object's metadata), the snapshot's kernarg "
                          f"has {want}")


def _near(kernel: str, names: set[str]) -> str:
    """A hint naming the code object's functions (a few, those like ``kernel`` first)."""
    if not names:
        return " (it defines no function)"
    close = sorted(names, key=lambda n: (kernel.lower() not in n.lower(), len(n), n))[:5]
    more = f", ... {len(names)} in all" if len(names) > 5 else ""
    return f" (functions there: {', '.join(close)}{more})"


__all__ = ["FORMATS", "check_kernel"]
