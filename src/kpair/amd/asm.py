"""The assembly round trip of an AMDGPU code object: ``disassemble`` to a directory, edit,
``assemble`` back into a code object a harness can take as ``opt.co``.

The directory holds ``code.s`` (one assembly file: the ``.amdgcn_target``, every function
of ``.text`` with its instructions, every kernel descriptor as an ``.amdhsa_kernel`` block,
the other read-only data as bytes, and the metadata note as an ``.amdgpu_metadata`` YAML
block), ``original.co`` (the input, to compare a rebuild against) and ``asm.json`` (what
was read, with which tools). Everything is produced by LLVM's own tools: llvm-objdump
decodes instructions and kernel descriptors, llvm-readelf prints the metadata, clang
(llvm-mc and ld.lld behind it) assembles and links. Branch targets become labels, so
instructions can be inserted or removed; other PC-relative arithmetic (``s_getpc_b64`` plus a
literal offset, as calls to non-inlined functions use) stays numeric, so an edit that moves
a called function must adjust it.

``compare(original, rebuilt)`` is the check that an unedited round trip is exact: the bytes
of every function and every kernel descriptor are the same.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from elftools.elf.elffile import ELFFile

from ..errors import FormatError, KpairError
from ..toolchain import find_llvm_tool
from .codeobject import CodeObjectInfo, read_code_object

SOURCE, ORIGINAL, INFO = "code.s", "original.co", "asm.json"
KD_BYTES = 64
#: Sections a linked code object may hold besides .text and .rodata without carrying
#: anything the assembly has to reproduce (the linker and the metadata directive make them).
_STRUCTURAL = {"", ".note", ".dynsym", ".gnu.hash", ".hash", ".dynstr", ".dynamic",
               ".relro_padding", ".comment", ".symtab", ".strtab", ".shstrtab",
               ".AMDGPU.csdata", ".AMDGPU.gpr_maximums"}
_INSN = re.compile(r"^\t(?P<text>.*?)\s*// (?P<addr>[0-9A-F]+): (?P<words>[0-9A-F ]+?)"
                   r"(?: <(?P<sym>[^>+]+)(?:\+0x(?P<off>[0-9a-f]+))?>)?$")
_HEADER = re.compile(r"^([0-9a-f]+) <(.+)>:$")


@dataclass(frozen=True)
class Symbol:
    name: str
    address: int
    size: int
    kind: str        # "function" or "object"
    binding: str     # STB_GLOBAL, STB_LOCAL, STB_WEAK
    visibility: str  # STV_DEFAULT, STV_PROTECTED, STV_HIDDEN


@dataclass(frozen=True)
class Layout:
    """The parts of a linked code object the assembly reproduces."""

    text: tuple[int, bytes]          # (address, bytes)
    rodata: tuple[int, bytes] | None
    symbols: tuple[Symbol, ...]
    abi_version: int

    def bytes_of(self, sym: Symbol) -> bytes:
        for base, data in (self.text, self.rodata or (0, b"")):
            if base <= sym.address and sym.address + sym.size <= base + len(data):
                return data[sym.address - base:sym.address - base + sym.size]
        raise FormatError(f"symbol {sym.name} lies outside .text and .rodata")


def read_layout(image: bytes) -> Layout:
    elf = ELFFile(io.BytesIO(image))
    text = rodata = None
    for s in elf.iter_sections():
        if s.name == ".text":
            text = (s["sh_addr"], s.data())
        elif s.name == ".rodata":
            rodata = (s["sh_addr"], s.data())
        elif s.name not in _STRUCTURAL and s["sh_flags"] & 2:  # SHF_ALLOC
            raise KpairError(f"the code object has a {s.name} section; kpair's assembly "
                             "round trip handles .text and .rodata only (no writable data, "
                             "no dynamic relocations)")
    if text is None:
        raise FormatError("the code object has no .text section")
    table = elf.get_section_by_name(".symtab") or elf.get_section_by_name(".dynsym")
    symbols = []
    for sym in table.iter_symbols() if table else ():
        kind = {"STT_FUNC": "function", "STT_OBJECT": "object"}.get(sym["st_info"]["type"])
        if kind and sym.name and sym["st_shndx"] != "SHN_UNDEF":
            symbols.append(Symbol(sym.name, sym["st_value"], sym["st_size"], kind,
                                  sym["st_info"]["bind"], sym["st_other"]["visibility"]))
    symbols.sort(key=lambda s: s.address)
    return Layout(text, rodata, tuple(symbols), elf["e_ident"]["EI_ABIVERSION"])


# --------------------------------------------------------------------------- disassemble


def _run(tool: str, *args: str) -> str:
    cmd = [find_llvm_tool(tool), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise KpairError(f"{tool} failed:\n$ {' '.join(cmd)}\n{proc.stderr}")
    return proc.stdout


def _blocks(listing: str) -> dict[str, list[str]]:
    """llvm-objdump's listing cut into the lines under each ``<symbol>:`` header."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in listing.splitlines():
        m = _HEADER.match(line)
        if m:
            current = out.setdefault(m.group(2), [])
        elif current is not None and line.strip():
            current.append(line)
    return out


def _function_lines(name: str, sym: Symbol, lines: list[str], symbols: dict[str, int],
                    labels: set[int]) -> list[tuple[int, str, str]]:
    """(address, instruction text, encoded words) within the symbol's size; branch targets
    become labels (added to ``labels``)."""
    out = []
    for line in lines:
        m = _INSN.match(line)
        if not m:
            raise KpairError(f"cannot read llvm-objdump's line in {name}: {line.strip()!r}")
        addr = int(m["addr"], 16)
        if addr >= sym.address + sym.size:
            break        # the alignment padding after the function
        text = m["text"]
        if m["sym"] in symbols:
            target = symbols[m["sym"]] + int(m["off"] or "0", 16)
            head, sep, last = text.rpartition(" ")
            if re.fullmatch(r"-?\d+", last) and sep:
                labels.add(target)
                text = f"{head} {_label(target)}"
        out.append((addr, text, m["words"]))
    return out


def _label(address: int) -> str:
    return f".Lkpair_{address:x}"


def _kd_blocks(listing: str) -> dict[str, list[str]]:
    out, current = {}, None
    for line in listing.splitlines():
        s = line.strip()
        if s.startswith(".amdhsa_kernel "):
            current = out.setdefault(s.split()[1], [])
        elif s == ".end_amdhsa_kernel":
            current = None
        elif current is not None and s.startswith(".amdhsa_"):
            current.append(s)
    return out


def _metadata_yaml(notes: str) -> str:
    lines = notes.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "---")
        end = next(i for i in range(start, len(lines)) if lines[i].strip() == "...")
    except StopIteration:
        raise KpairError("llvm-readelf printed no AMDGPU metadata") from None
    return "\n".join(["---", *lines[start + 1:end], "..."])


def _visibility(sym: Symbol) -> list[str]:
    out = []
    if sym.binding == "STB_GLOBAL":
        out.append(f"\t.globl\t{sym.name}")
    elif sym.binding == "STB_WEAK":
        out.append(f"\t.weak\t{sym.name}")
    vis = {"STV_PROTECTED": ".protected", "STV_HIDDEN": ".hidden"}.get(sym.visibility)
    if vis:
        out.append(f"\t{vis}\t{sym.name}")
    return out


def _p2align(address: int, cap: int = 8) -> int:
    k = 0
    while k < cap and address % (2 << k) == 0:
        k += 1
    return k


def render(image: bytes, path: str | Path = "code object", *,
           raw: frozenset[int] = frozenset()) -> tuple[str, CodeObjectInfo]:
    """The assembly source of ``image`` (see the module docstring); the instructions at the
    addresses in ``raw`` are written as their encoded words (``.long``)."""
    info = read_code_object(image)
    layout = read_layout(image)
    kernels = {k.symbol: k for k in info.kernels}
    with _scratch_copy(image) as co:
        listing = _blocks(_run("llvm-objdump", "-d", f"--mcpu={info.target.processor}", co))
        kd_names = [s.name for s in layout.symbols if s.name in kernels]
        kd_listing = _kd_blocks(_run("llvm-objdump", "-D", f"--mcpu={info.target.processor}",
                                     "--disassemble-symbols=" + ",".join(kd_names), co)) \
            if kd_names else {}
        metadata = _metadata_yaml(_run("llvm-readelf", "--notes", co))

    by_name = {s.name: s.address for s in layout.symbols}
    functions = [s for s in layout.symbols if s.kind == "function"]
    labels: set[int] = set()
    bodies = {f.name: _function_lines(f.name, f, listing.get(f.name, []), by_name, labels)
              for f in functions}
    kernel_names = {k.symbol.removesuffix(".kd") for k in info.kernels}

    out = [f"// kpair asm: disassembled from {Path(path).name} "
           f"(sha256 {hashlib.sha256(image).hexdigest()[:16]}) by LLVM's tools.",
           "// Reassemble with: kpair asm assemble <this directory> -o out.co",
           f'\t.amdgcn_target "{info.target_text}"']
    if info.code_object_version:
        out.append(f"\t.amdhsa_code_object_version {info.code_object_version}")
    out.append("\t.text")
    for i, f in enumerate(functions):
        align = 8 if f.name in kernel_names else _p2align(f.address)
        out += ["", f"\t.p2align\t{align}", *_visibility(f), f"\t.type\t{f.name},@function",
                f"{f.name}:"]
        for addr, text, words in bodies[f.name]:
            if addr in labels:
                out.append(f"{_label(addr)}:")
            if addr in raw:
                hexed = ", ".join(f"0x{w}" for w in words.split())
                out.append(f"\t.long\t{hexed}\t// {text} (as encoded: the assembler would "
                           "encode the text differently)")
            else:
                out.append(f"\t{text}")
        out += [f".Lkpair_end{i}:", f"\t.size\t{f.name}, .Lkpair_end{i}-{f.name}"]

    if layout.rodata:
        out += ["", '\t.section\t.rodata,"a",@progbits']
        base, data = layout.rodata
        cursor = base
        for s in (s for s in layout.symbols if s.kind == "object"):
            if not base <= s.address < base + len(data):
                continue
            if s.address > cursor:
                out.append(f"\t.zero\t{s.address - cursor}")
            if s.name in kernels:
                directives = kd_listing.get(kernels[s.name].name)
                if directives is None:
                    raise KpairError(f"llvm-objdump did not decode the kernel descriptor "
                                     f"{s.name}")
                out += ["\t.p2align\t6", f"\t.amdhsa_kernel {kernels[s.name].name}",
                        *(f"\t\t{d}" for d in directives), "\t.end_amdhsa_kernel"]
            else:
                raw = layout.bytes_of(s)
                out += [f"\t.p2align\t{_p2align(s.address, 6)}", *_visibility(s),
                        f"\t.type\t{s.name},@object", f"{s.name}:",
                        "\t.byte\t" + ", ".join(str(b) for b in raw),
                        f"\t.size\t{s.name}, {s.size}"]
            cursor = s.address + s.size
    out += ["", "\t.amdgpu_metadata", metadata, "\t.end_amdgpu_metadata", ""]
    return "\n".join(out), info


class _scratch_copy:
    """A temporary file holding ``image``, for tools that read a path."""

    def __init__(self, image: bytes):
        self._dir = tempfile.TemporaryDirectory(prefix="kpair-asm-")
        self.path = Path(self._dir.name) / "in.co"
        self.path.write_bytes(image)

    def __enter__(self) -> str:
        return str(self.path)

    def __exit__(self, *exc: object) -> None:
        self._dir.cleanup()


def disassemble(code_object: str | Path, out_dir: str | Path) -> Path:
    """Write ``code.s``, ``original.co`` and ``asm.json`` for ``code_object`` into ``out_dir``.

    The source is reassembled once here and checked against the original (``asm.json``
    records the outcome as ``identical`` and ``differences``)."""
    image = Path(code_object).read_bytes()
    source, diffs = _settle(image, code_object)
    info = read_code_object(image)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / SOURCE).write_text(source)
    (out / ORIGINAL).write_bytes(image)
    (out / INFO).write_text(json.dumps({
        "schema": "kpair.asm", "version": 1, "source": str(code_object),
        "sha256": hashlib.sha256(image).hexdigest(), "target": info.target_text,
        "code_object_version": info.code_object_version,
        "kernels": [k.name for k in info.kernels],
        "identical": not diffs, "differences": [f"{d.symbol}: {d.what}" for d in diffs],
        "tools": {t: find_llvm_tool(t) for t in ("llvm-objdump", "llvm-readelf", "clang")},
    }, indent=2) + "\n")
    return out / SOURCE


#: The message of llvm-mc when a descriptor's XNACK reservation contradicts the target ID.
_XNACK_MISMATCH = ".amdhsa_reserve_xnack_mask does not match target id"
#: compute_pgm_rsrc1 sits at byte 48 of a kernel descriptor; bits 6-9 are the granulated
#: SGPR count, in granules of 8 registers.
_RSRC1, _SGPR_SHIFT, _SGPR_MASK, _SGPR_GRANULE = 48, 6, 0xF, 8


def _settle(image: bytes, path: str | Path) -> tuple[str, list[Difference]]:
    """The source of ``image``, adjusted until it reassembles to the original bytes, as far
    as the assembler lets; returns it with the differences that remain.

    Two things do not survive llvm-objdump's text as is. (1) It prints a descriptor's
    *encoded* register counts with no reservations (``.amdhsa_reserve_vcc 0``), while the
    assembler adds the SGPRs it always reserves on the target (flat scratch, XNACK mask) and
    refuses an XNACK reservation that contradicts the target ID. (2) An instruction whose
    literal the linker filled in (a call's PC-relative offset) prints as a small number the
    assembler encodes inline, shorter. Rather than restate LLVM's per-target rules here,
    assemble and let the result say what is off: SGPR counts are corrected, and such
    instructions are written as their encoded words."""
    raw: set[int] = set()
    source, info = render(image, path)
    flipped = False
    sgpr: dict[str, int] = {}
    for _ in range(8):
        try:
            rebuilt = _build_text(source, _target_of(source))
        except KpairError as e:
            if _XNACK_MISMATCH in str(e) and not flipped:
                flipped = True
                source = _flip_xnack(source)
                continue
            raise
        fixes = _sgpr_fixes(image, rebuilt)
        moved = _changed_encodings(image, rebuilt, info.target.processor) - raw
        if not fixes and not moved:
            break
        for kernel, granules in fixes.items():
            sgpr[kernel] = sgpr.get(kernel, 0) + granules
        raw |= moved
        source, _ = render(image, path, raw=frozenset(raw))
        if flipped:
            source = _flip_xnack(source)
        for kernel, granules in sgpr.items():
            source = _set_directive(source, kernel, ".amdhsa_next_free_sgpr",
                                    lambda v, g=granules: max(0, v - g * _SGPR_GRANULE))
    return source, compare(image, rebuilt)


def _changed_encodings(original: bytes, rebuilt: bytes, processor: str) -> set[int]:
    """Original addresses of instructions whose encoding changed size in ``rebuilt`` (the
    first such one per function: what follows it moved and may differ only for that)."""
    a, b = _instructions(original, processor), _instructions(rebuilt, processor)
    out = set()
    for name, mine in a.items():
        for (addr, _, words), (_, _, theirs) in zip(mine, b.get(name, []), strict=False):
            if len(words.split()) != len(theirs.split()):
                out.add(addr)
                break
    return out


def _instructions(image: bytes, processor: str) -> dict[str, list[tuple[int, str, str]]]:
    layout = read_layout(image)
    with _scratch_copy(image) as co:
        listing = _blocks(_run("llvm-objdump", "-d", f"--mcpu={processor}", co))
    return {f.name: _function_lines(f.name, f, listing.get(f.name, []), {}, set())
            for f in layout.symbols if f.kind == "function"}


def _sgpr_fixes(original: bytes, rebuilt: bytes) -> dict[str, int]:
    """kernel name → how many SGPR granules the rebuilt descriptor has too many."""
    a, b = read_layout(original), read_layout(rebuilt)
    mine = {s.name: s for s in b.symbols}
    fixes = {}
    for s in a.symbols:
        if not s.name.endswith(".kd") or s.name not in mine or s.size != KD_BYTES:
            continue
        want = a.bytes_of(s)[_RSRC1] | a.bytes_of(s)[_RSRC1 + 1] << 8
        have = b.bytes_of(mine[s.name])[_RSRC1] | b.bytes_of(mine[s.name])[_RSRC1 + 1] << 8
        delta = ((have >> _SGPR_SHIFT) & _SGPR_MASK) - ((want >> _SGPR_SHIFT) & _SGPR_MASK)
        if delta:
            fixes[s.name.removesuffix(".kd")] = delta
    return fixes


def _set_directive(source: str, kernel: str, directive: str, change) -> str:
    lines, inside = source.split("\n"), False
    for i, line in enumerate(lines):
        words = line.split()
        if words[:1] == [".amdhsa_kernel"]:
            inside = words[1:2] == [kernel]
        elif words[:1] == [".end_amdhsa_kernel"]:
            inside = False
        elif inside and words[:1] == [directive] and len(words) == 2:
            lines[i] = line.replace(words[1], str(change(int(words[1]))))
    return "\n".join(lines)


def _flip_xnack(source: str) -> str:
    return re.sub(r"(\.amdhsa_reserve_xnack_mask) ([01])",
                  lambda m: f"{m.group(1)} {1 - int(m.group(2))}", source)


# --------------------------------------------------------------------------- assemble


def assemble(directory: str | Path, out: str | Path) -> Path:
    """Assemble ``directory/code.s`` and link it into the code object ``out`` with clang."""
    directory, out = Path(directory), Path(out)
    source = directory / SOURCE
    if not source.is_file():
        raise KpairError(f"{directory} holds no {SOURCE} (make it with kpair asm disassemble)")
    out.parent.mkdir(parents=True, exist_ok=True)
    _build(source, out, _target_of(source.read_text()))
    return out


def _build(source: Path, out: Path, target: str) -> None:
    _run("clang", "-target", "amdgcn-amd-amdhsa", f"-mcpu={target}", "-x", "assembler",
         "-o", str(out), str(source))


def _build_text(source: str, target: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="kpair-asm-") as tmp:
        path = Path(tmp) / SOURCE
        path.write_text(source)
        _build(path, Path(tmp) / "out.co", target)
        return (Path(tmp) / "out.co").read_bytes()


def _target_of(source: str) -> str:
    m = re.search(r'^\s*\.amdgcn_target\s+"amdgcn-amd-amdhsa--([^"]+)"', source, re.M)
    if not m:
        raise KpairError(f"{SOURCE} has no .amdgcn_target directive")
    return m.group(1)


@dataclass(frozen=True)
class Difference:
    symbol: str
    what: str


def compare(original: bytes, rebuilt: bytes) -> list[Difference]:
    """Every function and kernel descriptor whose bytes differ (empty: identical)."""
    a, b = read_layout(original), read_layout(rebuilt)
    mine = {s.name: s for s in b.symbols}
    diffs = []
    for s in a.symbols:
        if s.kind == "object" and not s.name.endswith(".kd"):
            continue
        other = mine.get(s.name)
        if other is None:
            diffs.append(Difference(s.name, "missing from the rebuilt code object"))
        elif a.bytes_of(s) != b.bytes_of(other):
            what = "kernel descriptor" if s.kind == "object" else "code"
            diffs.append(Difference(s.name, f"{what} differs ({s.size} bytes → "
                                            f"{other.size} bytes)"))
    if read_code_object(original).metadata != read_code_object(rebuilt).metadata:
        diffs.append(Difference("NT_AMDGPU_METADATA", "metadata differs"))
    return diffs


def llvm_available() -> bool:
    """Whether every tool the round trip needs is installed."""
    try:
        for tool in ("llvm-objdump", "llvm-readelf", "clang", "ld.lld"):
            find_llvm_tool(tool)
    except KpairError:
        return False
    return True
