"""PTX as an edit path that keeps ref's ABI: ref's PTX found, a candidate's parameter list
checked against ref's before anything launches, the candidate assembled with ``ptxas``.

``entry_params(ptx, kernel)`` parses an ``.entry``'s parameter list into ``PtxParam``s
(name, PTX type, size, alignment, and the offset the CUDA ABI gives it: each parameter at
the next multiple of its alignment). ``cubin_params(cubin, kernel)`` reads the same layout
from a cubin's ``.nv.info.<kernel>`` section (EIATTR_KPARAM_INFO records). ``check_abi``
compares either with ref's layout (the snapshot's kernarg: offset and size per parameter)
and raises ``AbiMismatch`` naming the first parameter that differs. ``assemble(ptx, arch,
options)`` runs ptxas with options from a fixed list (``PTXAS_OPTIONS``: optimisation level,
register limit, cache defaults) — never an output path or anything that reads a file.
``ref_ptx`` and ``sass`` find ref's code as text, where the tools exist.

CUDA tools are looked for in ``$KPAIR_CUDA_BIN``, on PATH, in /usr/local/cuda/bin and in
the Triton installation's own ``backends/nvidia/bin`` (Triton ships ptxas, cuobjdump and
nvdisasm), found without importing Triton.
"""

from __future__ import annotations

import importlib.util
import io
import os
import re
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import AbiMismatch, BackendUnavailable, KpairError, UsageError

#: Sizes of PTX's fundamental types (bytes).
TYPE_SIZES = {**{f".{k}{n}": n // 8 for k in "bsuf" for n in (8, 16, 32, 64)},
              ".b128": 16, ".f16x2": 4, ".bf16": 2, ".bf16x2": 4, ".pred": 1}
TYPE_SIZES.pop(".f8")
#: ptxas options a candidate may ask for (regular expressions over one argument each).
PTXAS_OPTIONS = (r"-O[0-3]", r"--opt-level=[0-3]", r"(--maxrregcount|-maxrregcount)=\d{1,3}",
                 r"--(def-load-cache|force-load-cache)=(ca|cg|cs|lu|cv)",
                 r"--(def-store-cache|force-store-cache)=(wb|cg|cs|wt)",
                 r"-(dlcm|flcm)=(ca|cg|cs|lu|cv)", r"-(dscm|fscm)=(wb|cg|cs|wt)",
                 r"--allow-expensive-optimizations(=(true|false))?", r"--fmad=(true|false)",
                 r"--extensible-whole-program", r"--disable-optimizer-constants",
                 r"--suppress-stack-size-warning", r"-lineinfo", r"--generate-line-info")
_OPTION = re.compile("|".join(f"(?:{o})" for o in PTXAS_OPTIONS))
_ENTRY = re.compile(r"\.entry\s+([A-Za-z_$%][\w$%]*)\s*\(([^)]*)\)", re.S)
_EIATTR_KPARAM_INFO = 0x17


@dataclass(frozen=True)
class PtxParam:
    """One kernel parameter as PTX declares it, with the offset the ABI gives it."""

    name: str
    type: str
    size: int
    align: int
    offset: int


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def entries(ptx: str) -> list[str]:
    """The names of every ``.entry`` (kernel) in ``ptx``."""
    return [m.group(1) for m in _ENTRY.finditer(_strip_comments(ptx))]


def _param(decl: str, offset: int, where: str) -> PtxParam:
    tokens = decl.replace("[", " [").split()
    if not tokens or tokens[0] != ".param":
        raise KpairError(f"{where}: not a .param declaration: {decl.strip()!r}")
    kind = next((t for t in tokens if t in TYPE_SIZES), None)
    if kind is None:
        raise KpairError(f"{where}: no PTX type in {decl.strip()!r}")
    count = 1
    name = tokens[-1]
    if name.startswith("["):  # name [N]
        count, name = int(name.strip("[]") or 0), tokens[-2]
    # ".ptr .global .align N" is the pointee's alignment, not the parameter's.
    align = TYPE_SIZES[kind]
    if ".ptr" not in tokens and ".align" in tokens:
        align = int(tokens[tokens.index(".align") + 1])
    size = TYPE_SIZES[kind] * count
    offset = -(-offset // align) * align
    return PtxParam(name, kind, size, align, offset)


def entry_params(ptx: str, kernel: str | None = None) -> list[PtxParam]:
    """The parameters of ``kernel`` (the only ``.entry`` when None) in ``ptx``."""
    found = {m.group(1): m.group(2) for m in _ENTRY.finditer(_strip_comments(ptx))}
    if not found:
        raise KpairError("the PTX declares no .entry (kernel)")
    if kernel is None:
        if len(found) > 1:
            raise UsageError(f"the PTX declares {len(found)} kernels ({', '.join(found)}): "
                             "name one")
        kernel = next(iter(found))
    if kernel not in found:
        raise KpairError(f"kernel {kernel!r} is not an .entry of the PTX (it has "
                         f"{', '.join(found)})")
    params, offset = [], 0
    for i, decl in enumerate(d for d in found[kernel].split(",") if d.strip()):
        p = _param(decl, offset, f".entry {kernel} parameter {i}")
        params.append(p)
        offset = p.offset + p.size
    return params


def cubin_params(cubin: bytes, kernel: str) -> list[tuple[int, int]]:
    """(offset, size) of each parameter of ``kernel``, in order, from the cubin's
    ``.nv.info.<kernel>`` section (EIATTR_KPARAM_INFO)."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        elf = ELFFile(io.BytesIO(cubin))
        section = elf.get_section_by_name(f".nv.info.{kernel}")
    except (ELFError, ValueError, struct.error) as e:
        raise KpairError(f"not a readable cubin: {e}") from None
    if section is None:
        raise KpairError(f"the cubin has no .nv.info.{kernel} section (is {kernel!r} in it?)")
    data, pos, params = section.data(), 0, {}
    while pos + 2 <= len(data):
        fmt, attr = data[pos], data[pos + 1]
        if fmt == 0x04:      # EIFMT_SVAL: u16 size, then the payload
            (size,) = struct.unpack_from("<H", data, pos + 2)
            payload, pos = data[pos + 4:pos + 4 + size], pos + 4 + size
        elif fmt == 0x03:    # EIFMT_HVAL: a u16 value
            payload, pos = b"", pos + 4
        elif fmt == 0x02:    # EIFMT_BVAL: a byte
            payload, pos = b"", pos + 3
        else:                # EIFMT_NVAL: nothing
            payload, pos = b"", pos + 2
        if attr == _EIATTR_KPARAM_INFO and len(payload) >= 12:
            _, ordinal, offset, flags = struct.unpack_from("<IHHI", payload)
            params[ordinal] = (offset, (flags >> 18) & 0x3FFF)
    return [params[i] for i in sorted(params)]


def check_abi(params: Sequence[PtxParam] | Sequence[tuple[int, int]],
              ref: Sequence[tuple[int, int]], *, ref_names: Sequence[str] = (),
              what: str = "the candidate") -> None:
    """Refuse (AbiMismatch) a parameter list that differs from ref's in count, offset or size;
    the message names the first parameter that differs."""

    def name(i: int) -> str:
        mine = params[i].name if i < len(params) and isinstance(params[i], PtxParam) else ""
        theirs = ref_names[i] if i < len(ref_names) and ref_names[i] else ""
        label = mine or theirs or f"#{i}"
        return f"parameter {i} ({label}{f', ref: {theirs}' if theirs and mine else ''})"

    layout = [(p.offset, p.size) if isinstance(p, PtxParam) else tuple(p) for p in params]
    for i, (mine, theirs) in enumerate(zip(layout, ref, strict=False)):
        if mine != tuple(theirs):
            raise AbiMismatch(f"{what}'s {name(i)} is {mine[1]} bytes at offset {mine[0]}; "
                              f"ref's is {theirs[1]} bytes at offset {theirs[0]}")
    if len(layout) != len(ref):
        i = min(len(layout), len(ref))
        extra = "has an extra" if len(layout) > len(ref) else "lacks ref's"
        raise AbiMismatch(f"{what} has {len(layout)} parameters, ref {len(ref)}: it {extra} "
                          f"{name(i)}")


# --------------------------------------------------------------------------- tools


def find_cuda_tool(name: str) -> str | None:
    """The path of a CUDA tool (ptxas, cuobjdump, nvdisasm), or None."""
    places = [os.environ.get("KPAIR_CUDA_BIN"), None, "/usr/local/cuda/bin"]
    spec = importlib.util.find_spec("triton") if "KPAIR_NO_TRITON_TOOLS" not in os.environ \
        else None
    if spec is not None and spec.submodule_search_locations:
        for base in spec.submodule_search_locations:
            places.append(str(Path(base) / "backends" / "nvidia" / "bin"))
    for place in places:
        if place is None:
            found = shutil.which(name)
        elif place:
            found = shutil.which(name, path=place)
        else:
            continue
        if found:
            return found
    return None


def check_options(options: Sequence[str]) -> list[str]:
    bad = [o for o in options if not isinstance(o, str) or not _OPTION.fullmatch(o)]
    if bad:
        raise UsageError(f"ptxas option {bad[0]!r} is not allowed (allowed: "
                         f"{', '.join(PTXAS_OPTIONS)})")
    return list(options)


def assemble(ptx: str | bytes, *, arch: str = "sm_90", options: Sequence[str] = (),
             timeout_s: float = 120.0) -> bytes:
    """``ptxas -arch=<arch> [options] -o out.cubin in.ptx``: the cubin's bytes; the error
    carries ptxas's own message."""
    if not re.fullmatch(r"sm_\d{2,3}[af]?", arch):
        raise UsageError(f"arch must be like sm_90, not {arch!r}")
    opts = check_options(options)
    ptxas = find_cuda_tool("ptxas")
    if ptxas is None:
        raise BackendUnavailable("ptxas was not found: install the CUDA toolkit, or Triton "
                                 "(which ships one), or set KPAIR_CUDA_BIN")
    text = ptx.encode() if isinstance(ptx, str) else bytes(ptx)
    with tempfile.TemporaryDirectory(prefix="kpair-ptxas-") as tmp:
        src, out = Path(tmp) / "in.ptx", Path(tmp) / "out.cubin"
        src.write_bytes(text.rstrip(b"\0"))
        cmd = [ptxas, f"-arch={arch}", *opts, "-o", str(out), str(src)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise KpairError(f"ptxas took longer than {timeout_s:g} s") from None
        if proc.returncode != 0 or not out.is_file():
            raise KpairError(f"ptxas refused the PTX:\n{proc.stderr.strip()}")
        return out.read_bytes()


def _run_tool(cmd: list[str], image: bytes, suffix: str) -> str | None:
    with tempfile.TemporaryDirectory(prefix="kpair-cutool-") as tmp:
        path = Path(tmp) / f"code{suffix}"
        path.write_bytes(image)
        try:
            proc = subprocess.run([*cmd, str(path)], capture_output=True, text=True,
                                  timeout=120)
        except subprocess.TimeoutExpired:
            return None
        return proc.stdout if proc.returncode == 0 and proc.stdout.strip() else None


def sass(image: bytes, fmt: str) -> tuple[str | None, str]:
    """ref's SASS as text through cuobjdump (or nvdisasm for a cubin): (text, how or why not)."""
    if fmt not in ("cubin", "fatbin"):
        return None, f"no SASS in a {fmt} code object"
    tool = find_cuda_tool("cuobjdump")
    if tool:
        text = _run_tool([tool, "-sass"], image, f".{fmt}")
        if text:
            return text, "cuobjdump -sass"
    tool = find_cuda_tool("nvdisasm") if fmt == "cubin" else None
    if tool:
        text = _run_tool([tool], image, ".cubin")
        if text:
            return text, "nvdisasm"
    return None, "cuobjdump and nvdisasm were not found (CUDA toolkit or Triton ships them)"


def ref_ptx(image: bytes, fmt: str, provenance: dict | None = None) -> tuple[str | None, str]:
    """ref's PTX as text: (text, where it came from, or why there is none). Triton's PTX
    kept at capture, the PTX code object itself, or a fatbin's PTX through cuobjdump."""
    triton = (provenance or {}).get("triton") or {}
    if isinstance(triton.get("ptx"), str) and triton["ptx"]:
        return triton["ptx"], "captured from Triton's compiled kernel (asm['ptx'])"
    if fmt == "ptx":
        return image.decode(errors="replace").rstrip("\0"), "the code object is PTX"
    if fmt == "fatbin":
        tool = find_cuda_tool("cuobjdump")
        if tool is None:
            return None, "cuobjdump was not found (needed to read a fatbin's PTX)"
        text = _run_tool([tool, "-ptx"], image, ".fatbin")
        if text and ".entry" in text:
            start = text.find(".version")   # after cuobjdump's own header lines
            return text[start if start >= 0 else 0:], "cuobjdump -ptx of the fatbin"
        return None, "the fatbin holds no PTX"
    if fmt == "cubin":
        return None, ("a cubin holds SASS only, no PTX (build ref as a fatbin with PTX, or "
                      "capture a Triton kernel, whose PTX kpair keeps)")
    return None, f"no PTX in a {fmt} code object"


__all__ = ["PTXAS_OPTIONS", "PtxParam", "assemble", "check_abi", "check_options",
           "cubin_params", "entries", "entry_params", "find_cuda_tool", "ref_ptx", "sass"]
