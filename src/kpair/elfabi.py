"""A host kernel's declared parameters, read from its shared object, against the dispatch.

A C function's parameter list is not in a shared object's symbol table; it is in the DWARF
debug information when the object was built with ``-g``. ``declared_params(image, symbol)``
reads it: the symbol must be a defined function (``STT_FUNC``) in an executable section
(``.text``), and when the object carries DWARF for it, each parameter's kind — a pointer, an
integer of 1/2/4/8 bytes, ``float``, ``double``, or something the host backend cannot pass
(a struct by value, ``long double``). ``check_params(image, symbol, params, role)`` refuses
(``AbiMismatch``) a function whose declared layout differs from the dispatch's kernarg
(``Param`` kinds): the count, then the first parameter whose kind differs, named.

Without DWARF (a stripped or ``-g``-less object) nothing says what the function takes: the
checks stop at the symbol (exists, a function, in ``.text``), and a wrong layout is a wrong
answer or a crash at run time. Signedness is not compared (``int`` and ``unsigned`` pass the
same register), nor a pointer's target type.

pyelftools reads the ELF and DWARF (a kpair dependency, imported when called).
"""

from __future__ import annotations

import io
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import AbiMismatch, FormatError, SymbolNotFound

#: Dispatch (``Param.kind``) -> the declared kind it must meet.
_DISPATCH = {"pointer": "pointer", "f32": "float", "f64": "double",
             **{f"{s}{b}": f"int{b // 8}" for s in "iu" for b in (8, 16, 32, 64)}}
_INSTALL = "pip install 'pyelftools>=0.29'"


def _a(n: str) -> str:
    return f"an {n}" if n == "8" else f"a {n}"


@dataclass(frozen=True)
class DeclaredParam:
    """One declared parameter: its name (may be empty), its kind ("pointer", "int1" ..
    "int8", "float", "double", or "other: <what>") and the C type as DWARF spells it."""

    name: str
    kind: str
    ctype: str

    def describe(self) -> str:
        return {"pointer": "a pointer", "float": "float", "double": "double"}.get(
            self.kind, f"{_a(self.kind[3:])}-byte integer" if self.kind.startswith("int")
            else self.kind.removeprefix("other: "))


@dataclass(frozen=True)
class Declared:
    """What the object says about ``symbol``: ``params`` (None without DWARF for it) and
    whether it is variadic (``...``: only its fixed parameters are known)."""

    symbol: str
    params: tuple[DeclaredParam, ...] | None
    variadic: bool = False


def _elftools():
    try:
        from elftools.elf.elffile import ELFFile
    except ImportError:
        raise FormatError(f"reading a shared object's symbols needs pyelftools: {_INSTALL}"
                          ) from None
    return ELFFile


def declared_params(image: bytes, symbol: str, role: str = "opt") -> Declared:
    """The declared parameters of ``symbol`` in the shared object ``image``.

    Raises ``SymbolNotFound`` when the dynamic symbol table defines no such function, or
    defines it as something else (data, or outside an executable section)."""
    from elftools.common.exceptions import DWARFError, ELFError

    ELFFile = _elftools()  # noqa: N806 - the class, as pyelftools names it
    try:
        elf = ELFFile(io.BytesIO(image))
        sym = _symbol(elf, symbol, role)
    except (ELFError, ValueError, struct.error) as e:
        raise FormatError(f"{role}: not a readable ELF shared object ({e})") from None
    try:
        found = _dwarf_params(elf, symbol, sym["st_value"])
    except (ELFError, DWARFError, ValueError, struct.error, KeyError, IndexError,
            AttributeError, TypeError):
        found = None  # unreadable DWARF is no DWARF: the layout stays unknown
    if found is None:
        return Declared(symbol, None)
    return Declared(symbol, *found)


def _symbol(elf, symbol: str, role: str):
    table = elf.get_section_by_name(".dynsym")
    if table is None or not hasattr(table, "get_symbol_by_name"):
        raise SymbolNotFound(f"{role} kernel {symbol!r}: the code object exports no symbols "
                             "(no .dynsym)")
    found = [s for s in table.get_symbol_by_name(symbol) or []
             if s["st_shndx"] != "SHN_UNDEF"]
    if not found:
        raise SymbolNotFound(f"{role} kernel {symbol!r} is not exported by the code object")
    sym = found[0]
    kind = sym["st_info"]["type"]
    if kind not in ("STT_FUNC", "STT_GNU_IFUNC"):
        raise SymbolNotFound(f"{role} kernel {symbol!r} is not a function in the code object "
                             f"(its symbol is {kind.removeprefix('STT_').lower()})")
    shndx = sym["st_shndx"]
    if not isinstance(shndx, int):
        raise SymbolNotFound(f"{role} kernel {symbol!r} lies in no section ({shndx})")
    section = elf.get_section(shndx)
    if not section["sh_flags"] & 0x4:  # SHF_EXECINSTR
        raise SymbolNotFound(f"{role} kernel {symbol!r} lies in {section.name or 'a section'},"
                             " which is not executable (not .text)")
    return sym


def _dwarf_params(elf, symbol: str, address: int
                  ) -> tuple[tuple[DeclaredParam, ...], bool] | None:
    """(parameters, variadic) of the DWARF subprogram defining ``symbol`` (the one at
    ``address`` first), or None when there is no DWARF for it."""
    if not elf.has_dwarf_info():
        return None
    dwarf = elf.get_dwarf_info()
    best = None
    for cu in dwarf.iter_CUs():
        for die in cu.iter_DIEs():
            if die.tag != "DW_TAG_subprogram" or "DW_AT_declaration" in die.attributes:
                continue
            origin = _origin(die)
            if _name(origin) != symbol and _name(die) != symbol \
                    and _attr(origin, "DW_AT_linkage_name") != symbol:
                continue
            low = _attr(die, "DW_AT_low_pc")
            if low == address:
                return _params_of(origin)
            if best is None:
                best = origin
    return _params_of(best) if best is not None else None


def _attr(die, name: str):
    a = die.attributes.get(name)
    if a is None:
        return None
    v = a.value
    return v.decode(errors="replace") if isinstance(v, bytes) else v


def _name(die) -> str | None:
    return _attr(die, "DW_AT_name")


def _origin(die):
    """The DIE that declares what ``die`` (a concrete, possibly out-of-line, instance) is."""
    for _ in range(4):
        for ref in ("DW_AT_abstract_origin", "DW_AT_specification"):
            if ref in die.attributes:
                die = die.get_DIE_from_attribute(ref)
                break
        else:
            return die
    return die


def _params_of(die) -> tuple[tuple[DeclaredParam, ...], bool]:
    params, variadic = [], False
    for child in die.iter_children():
        if child.tag == "DW_TAG_unspecified_parameters":
            variadic = True
        elif child.tag == "DW_TAG_formal_parameter":
            child = _origin(child)
            kind, ctype = _kind(child)
            params.append(DeclaredParam(_name(child) or "", kind, ctype))
    return tuple(params), variadic


_QUALIFIERS = ("DW_TAG_typedef", "DW_TAG_const_type", "DW_TAG_volatile_type",
               "DW_TAG_restrict_type", "DW_TAG_atomic_type")


def _kind(die) -> tuple[str, str]:
    """(kind, C type name) of a parameter DIE's type."""
    names = []
    t = die.get_DIE_from_attribute("DW_AT_type") if "DW_AT_type" in die.attributes else None
    for _ in range(32):
        if t is None:
            return "other: no type", " ".join(names) or "?"
        if t.tag == "DW_TAG_typedef" and _name(t):
            names.append(_name(t))
        if t.tag not in _QUALIFIERS:
            break
        t = t.get_DIE_from_attribute("DW_AT_type") if "DW_AT_type" in t.attributes else None
    name = names[0] if names else _name(t) or t.tag.removeprefix("DW_TAG_")
    if t.tag in ("DW_TAG_pointer_type", "DW_TAG_reference_type",
                 "DW_TAG_rvalue_reference_type", "DW_TAG_array_type"):
        return "pointer", names[0] if names else f"{_pointee(t)} *"
    size = _attr(t, "DW_AT_byte_size")
    if t.tag == "DW_TAG_enumeration_type" and size in (1, 2, 4, 8):
        return f"int{size}", name
    if t.tag == "DW_TAG_base_type":
        encoding = _attr(t, "DW_AT_encoding")
        if encoding == 0x04 and size in (4, 8):  # DW_ATE_float
            return ("float" if size == 4 else "double"), name
        if encoding in (0x02, 0x05, 0x06, 0x07, 0x08, 0x10) and size in (1, 2, 4, 8):
            return f"int{size}", name   # boolean, signed, signed/unsigned char, unsigned, UTF
        return f"other: {name} ({size} bytes)", name
    what = {"DW_TAG_structure_type": "a struct", "DW_TAG_union_type": "a union",
            "DW_TAG_class_type": "a class"}.get(t.tag, t.tag.removeprefix("DW_TAG_"))
    return f"other: {what} passed by value ({name})", name


def _pointee(t) -> str:
    """The name of what pointer type ``t`` points at ("void" when nothing)."""
    for _ in range(32):
        if "DW_AT_type" not in t.attributes:
            return "void"
        t = t.get_DIE_from_attribute("DW_AT_type")
        if t.tag not in _QUALIFIERS or (t.tag == "DW_TAG_typedef" and _name(t)):
            break
    return _name(t) or t.tag.removeprefix("DW_TAG_")


def check_params(image: bytes, symbol: str, params: Sequence, role: str) -> Declared:
    """Refuse (``AbiMismatch``) the ``role`` kernel ``symbol`` of ``image`` when its
    declared parameters (DWARF) differ from the dispatch's ``params`` (``Param``: kind per
    parameter): their count, or a parameter's kind. ``SymbolNotFound`` when the symbol is
    not an exported function in ``.text``. Returns what was declared (``params`` None:
    no DWARF, nothing compared)."""
    declared = declared_params(image, symbol, role)
    if declared.params is None:
        return declared
    got, want = declared.params, list(params)
    if len(got) != len(want) and not (declared.variadic and len(want) >= len(got)):
        raise AbiMismatch(f"{role} kernel {symbol!r} takes {len(got)} parameter"
                          f"{'s' if len(got) != 1 else ''} (DWARF), the dispatch passes "
                          f"{len(want)}")
    for i, (d, p) in enumerate(zip(got, want, strict=False)):
        need = _DISPATCH.get(p.kind)
        if need is None or d.kind == need:
            continue   # a kind the host backend refuses itself, or a match
        passes = {"pointer": "a pointer", "float": "a float", "double": "a double"}.get(
            need, f"{_a(need[3:])}-byte integer")
        named = f" ({d.name})" if d.name else ""
        said = d.describe() + (" (DWARF)" if d.ctype == d.describe()
                                else f" ({d.ctype}, DWARF)")
        raise AbiMismatch(f"{role} kernel {symbol!r}: parameter {i}{named} is {said}, the "
                          f"dispatch passes {passes}")
    return declared


__all__ = ["Declared", "DeclaredParam", "check_params", "declared_params"]
