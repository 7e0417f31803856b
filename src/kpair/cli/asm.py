"""``kpair asm``: an AMDGPU code object to editable assembly and back (kpair.amd.asm)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..amd.asm import INFO, ORIGINAL, assemble, compare, disassemble
from .base import Command


class Asm(Command):
    """Disassemble a gfx9 code object into DIR/code.s (instructions, kernel descriptors as
    .amdhsa_kernel directives, the metadata note) and assemble it back with LLVM's tools."""

    name = "asm"
    help = "AMDGPU code object <-> assembly (disassemble / assemble)"

    @classmethod
    def add_arguments(cls, p: argparse.ArgumentParser) -> None:
        sub = p.add_subparsers(dest="asm_command", metavar="ACTION", required=True)
        d = sub.add_parser("disassemble", help="code object -> DIR/code.s")
        d.add_argument("code_object", type=Path, help="AMDGPU code object (ELF) to read")
        d.add_argument("-o", "--out", type=Path, required=True, help="directory to write")
        a = sub.add_parser("assemble", help="DIR/code.s -> code object")
        a.add_argument("directory", type=Path,
                       help="directory written by disassemble (code.s and its metadata)")
        a.add_argument("-o", "--out", type=Path, required=True, help="code object to write")

    def run(self, args: argparse.Namespace) -> int:
        if args.asm_command == "disassemble":
            source = disassemble(args.code_object, args.out)
            info = json.loads((args.out / INFO).read_text())
            print(f"wrote {source} ({len(info['kernels'])} kernel(s), {info['target']})")
            if info["identical"]:
                print("round trip checked: kernel code and descriptors reassemble identical")
            else:
                print("round trip NOT identical: " + "; ".join(info["differences"]))
            return 0
        out = assemble(args.directory, args.out)
        original = args.directory / ORIGINAL
        print(f"wrote {out}")
        if original.is_file():
            diffs = compare(original.read_bytes(), out.read_bytes())
            print("identical to the original's kernel code and descriptors" if not diffs
                  else "differs from the original: " +
                  "; ".join(f"{d.symbol}: {d.what}" for d in diffs))
        return 0
