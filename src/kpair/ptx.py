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
The ptxas that runs is one whose CUDA release reads the PTX's ``.version`` (Triton writes
the version its own bundled ptxas reads, which may be newer than a toolkit on PATH), and the
architecture is the PTX's own ``.target`` when it names the same GPU (Triton targets
``sm_90a``, which ptxas refuses to build for ``sm_90``). ``ref_ptx`` and ``sass`` find ref's
code as text, where the tools exist: a Triton kernel's PTX kept at capture, else the PTX
beside a byte-identical cubin in Triton's on-disk cache (``triton_cache_ptx``).

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
#: A PTX file larger than this in Triton's cache is not read.
MAX_PTX_FILE = 16 << 20


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


def cubin_text(cubin: bytes) -> dict[str, bytes]:
    """The machine code of a cubin: its ``.text.<kernel>`` sections by name (what runs;
    line tables and other notes left out, which differ with the source file's path)."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        elf = ELFFile(io.BytesIO(cubin))
        return {s.name: s.data() for s in elf.iter_sections() if s.name.startswith(".text")}
    except (ELFError, ValueError, struct.error) as e:
        raise KpairError(f"not a readable cubin: {e}") from None


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


def _triton_dirs() -> list[Path]:
    """Triton's installation folders (found without importing it), unless
    ``KPAIR_NO_TRITON_TOOLS`` is set."""
    if "KPAIR_NO_TRITON_TOOLS" in os.environ:
        return []
    try:
        spec = importlib.util.find_spec("triton")
    except (ImportError, ValueError):
        return []
    return [Path(b) for b in (spec.submodule_search_locations or [])] if spec else []


def find_cuda_tools(name: str) -> list[str]:
    """Every distinct path of a CUDA tool (ptxas, cuobjdump, nvdisasm), in order:
    ``$KPAIR_CUDA_BIN``, PATH, /usr/local/cuda/bin, Triton's ``backends/nvidia/bin``."""
    places: list[str | None] = [os.environ.get("KPAIR_CUDA_BIN") or "", None,
                                "/usr/local/cuda/bin"]
    places += [str(base / "backends" / "nvidia" / "bin") for base in _triton_dirs()]
    out: list[str] = []
    for place in places:
        if place == "":
            continue
        found = shutil.which(name) if place is None else shutil.which(name, path=place)
        if found and os.path.realpath(found) not in map(os.path.realpath, out):
            out.append(found)
    return out


def find_cuda_tool(name: str) -> str | None:
    """The path of a CUDA tool (the first of ``find_cuda_tools``), or None."""
    found = find_cuda_tools(name)
    return found[0] if found else None


def ptx_header(ptx: str) -> tuple[tuple[int, int] | None, str | None]:
    """The PTX's ``.version`` (major, minor) and the first name of its ``.target``."""
    text = _strip_comments(ptx[:20000])
    v = re.search(r"^\s*\.version\s+(\d+)\.(\d+)", text, re.M)
    t = re.search(r"^\s*\.target\s+([\w]+)", text, re.M)
    return ((int(v.group(1)), int(v.group(2))) if v else None), (t.group(1) if t else None)


def max_ptx_version(release: tuple[int, int]) -> tuple[int, int]:
    """The newest PTX ISA version a CUDA release's ptxas reads (NVIDIA's release table:
    12.0-12.5 read 8.0-8.5, 12.6 8.5, 12.8 8.7, 12.9 8.8, 13.x 9.x, 11.x 7.x)."""
    major, minor = release
    if major >= 13:
        return 9 + (major - 13), minor
    if major == 12:
        return 8, minor if minor < 6 else minor - 1
    if major == 11:
        return 7, minor
    return 6, 0


_RELEASES: dict[str, tuple[int, int] | None] = {}


def tool_release(path: str) -> tuple[int, int] | None:
    """A CUDA tool's release (``--version``: "release 12.8"), cached per path."""
    if path not in _RELEASES:
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout
            m = re.search(r"release (\d+)\.(\d+)", out)
            _RELEASES[path] = (int(m.group(1)), int(m.group(2))) if m else None
        except (OSError, subprocess.TimeoutExpired):
            _RELEASES[path] = None
    return _RELEASES[path]


def ptxas_for(ptx: str) -> list[str]:
    """The ptxas paths to try for ``ptx``, best first: those whose release reads its
    ``.version`` (in ``find_cuda_tools`` order), then the rest, newest first."""
    tools = find_cuda_tools("ptxas")
    version, _ = ptx_header(ptx)
    if version is None:
        return tools
    reads = [t for t in tools if (r := tool_release(t)) and max_ptx_version(r) >= version]
    rest = sorted((t for t in tools if t not in reads),
                  key=lambda t: tool_release(t) or (0, 0), reverse=True)
    return reads + rest


def assemble_arch(ptx: str, arch: str) -> str:
    """The ``-arch`` for ``ptx`` on a GPU of ``arch``: the PTX's own ``.target`` when it is
    the same GPU with a suffix (sm_90a, sm_100f: code only that GPU runs), else ``arch``."""
    _, target = ptx_header(ptx)
    base = re.fullmatch(r"sm_(\d{2,3})[af]?", arch)
    m = re.fullmatch(r"sm_(\d{2,3})[af]?", target or "")
    if base and m and m.group(1) == base.group(1):
        return target
    return arch


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
    return assemble_with(ptx, arch=arch, options=options, timeout_s=timeout_s)[0]


def assemble_with(ptx: str | bytes, *, arch: str = "sm_90", options: Sequence[str] = (),
                  timeout_s: float = 120.0) -> tuple[bytes, list[str]]:
    """``assemble``, also returning the command that made the cubin (ptxas's path, the
    ``-arch`` chosen by ``assemble_arch``, the options)."""
    if not re.fullmatch(r"sm_\d{2,3}[af]?", arch):
        raise UsageError(f"arch must be like sm_90, not {arch!r}")
    opts = check_options(options)
    text = ptx.encode() if isinstance(ptx, str) else bytes(ptx)
    text = text.rstrip(b"\0")
    as_str = text.decode(errors="replace")
    tools = ptxas_for(as_str)
    if not tools:
        raise BackendUnavailable("ptxas was not found: install the CUDA toolkit, or Triton "
                                 "(which ships one), or set KPAIR_CUDA_BIN")
    arch = assemble_arch(as_str, arch)
    refusals = []
    with tempfile.TemporaryDirectory(prefix="kpair-ptxas-") as tmp:
        src, out = Path(tmp) / "in.ptx", Path(tmp) / "out.cubin"
        src.write_bytes(text)
        for ptxas in tools:
            out.unlink(missing_ok=True)
            cmd = [ptxas, f"-arch={arch}", *opts, "-o", str(out), str(src)]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise KpairError(f"ptxas took longer than {timeout_s:g} s") from None
            if proc.returncode == 0 and out.is_file():
                return out.read_bytes(), [ptxas, f"-arch={arch}", *opts]
            refusals.append(f"{ptxas}: {proc.stderr.strip()}")
            # Another ptxas may read a newer PTX version; any other refusal is the PTX's.
            if "Unsupported .version" not in proc.stderr:
                break
        raise KpairError("ptxas refused the PTX:\n" + "\n".join(refusals))


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
        found = triton_cache_ptx(image)
        if found is not None:
            return found
        return None, ("a cubin holds SASS only, no PTX (build ref as a fatbin with PTX, or "
                      "capture a Triton kernel, whose PTX kpair keeps)")
    return None, f"no PTX in a {fmt} code object"


def triton_cache_dirs() -> list[Path]:
    """Where Triton keeps compiled kernels on this machine: ``$TRITON_CACHE_DIR``,
    ``~/.triton/cache`` and Inductor's ``<tmp>/torchinductor_<user>/triton/<device>``
    (``$TORCHINDUCTOR_CACHE_DIR/triton/<device>``)."""
    dirs = [os.environ.get("TRITON_CACHE_DIR"), str(Path.home() / ".triton" / "cache")]
    inductor = [os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
                *map(str, Path(tempfile.gettempdir()).glob("torchinductor_*"))]
    for base in inductor:
        if base:
            dirs += map(str, Path(base).glob("triton/*"))
    out: list[Path] = []
    for d in dirs:
        if d and Path(d).is_dir() and Path(d) not in out:
            out.append(Path(d))
    return out


def triton_cache_ptx(cubin: bytes, dirs: Sequence[Path] | None = None
                     ) -> tuple[str, str] | None:
    """(PTX, where) of ``cubin`` from Triton's cache: Triton writes ``<kernel>.cubin`` and
    ``<kernel>.ptx`` side by side in one folder per compilation, so the PTX beside a cubin
    identical to ``cubin`` (same bytes) is the PTX it was assembled from."""
    for base in triton_cache_dirs() if dirs is None else dirs:
        for path in base.glob("*/*.cubin"):
            try:
                if path.stat().st_size != len(cubin) or path.read_bytes() != cubin:
                    continue
                text = path.with_suffix(".ptx").read_text(errors="replace")
            except OSError:
                continue
            if ".entry" in text and len(text) <= MAX_PTX_FILE:
                return text, (f"Triton's cache: {path.with_suffix('.ptx')} (beside a cubin "
                              "byte-identical to ref's code object)")
    return None


__all__ = ["PTXAS_OPTIONS", "PtxParam", "assemble", "assemble_arch", "assemble_with",
           "check_abi", "check_options", "cubin_params", "cubin_text", "entries", "entry_params",
           "find_cuda_tool", "find_cuda_tools", "max_ptx_version", "ptx_header", "ptxas_for",
           "ref_ptx", "sass", "tool_release", "triton_cache_dirs", "triton_cache_ptx"]
