"""``kpair asm``: an AMDGPU code object to editable assembly and back (kpair.amd.asm)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .._util import check_output, check_output_dir, private_tempdir, write_bytes_atomic
from ..amd.asm import INFO, ORIGINAL, SOURCE, assemble, compare, disassemble
from ..errors import InputError
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
        d.add_argument("-o", "--out", type=Path, required=True,
                       help="directory to write (code.s, original.co, asm.json; files there "
                       "are replaced only with --force)")
        a = sub.add_parser("assemble", help="DIR/code.s -> code object")
        a.add_argument("directory", type=Path,
                       help="directory written by disassemble (code.s and its metadata)")
        a.add_argument("-o", "--out", type=Path, required=True,
                       help="code object to write (an existing file is replaced only with "
                       "--force)")
        for q in (d, a):
            q.add_argument("--force", action="store_true",
                           help="replace files that exist (never a directory or special file)")
            q.add_argument("--json", action="store_true",
                           help="print what was written as one JSON document on stdout "
                           "(the human lines go to stderr)")

    def run(self, args: argparse.Namespace) -> int:
        # Lines for people go to stderr under --json: stdout holds the one document.
        say = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
        act = _disassemble if args.asm_command == "disassemble" else _assemble
        doc = act(args, say)
        if args.json:
            print(json.dumps(doc, indent=1))
        return 0


def _disassemble(args: argparse.Namespace, say) -> dict:
    if not args.code_object.is_file():
        raise InputError("no such code object file", path=args.code_object)
    check_output_dir(args.out)
    names = (SOURCE, ORIGINAL, INFO)
    for name in names:  # refused before the tools run
        check_output(args.out / name, replace=args.force)
    # Written into a private folder first, then each file through the safe write.
    with private_tempdir("asm") as tmp:
        disassemble(args.code_object, tmp)
        data = {name: (tmp / name).read_bytes() for name in names}
    for name in names:
        write_bytes_atomic(args.out / name, data[name], replace=args.force)
    info = json.loads(data[INFO])
    source = args.out / SOURCE
    say(f"wrote {source} ({len(info['kernels'])} kernel(s), {info['target']})")
    if info["identical"]:
        say("round trip checked: kernel code and descriptors reassemble identical")
    else:
        say("round trip NOT identical: " + "; ".join(info["differences"]))
    return {"source": str(source), "directory": str(args.out), "target": info["target"],
            "kernels": info["kernels"], "identical": info["identical"],
            "differences": info["differences"]}


def _assemble(args: argparse.Namespace, say) -> dict:
    check_output(args.out, replace=args.force)
    with private_tempdir("asm") as tmp:
        built = assemble(args.directory, tmp / "out.co").read_bytes()
    write_bytes_atomic(args.out, built, replace=args.force)
    say(f"wrote {args.out}")
    original = args.directory / ORIGINAL
    doc = {"out": str(args.out), "identical": None, "differences": []}
    if original.is_file():
        diffs = compare(original.read_bytes(), built)
        doc.update(identical=not diffs, differences=[f"{d.symbol}: {d.what}" for d in diffs])
        say("identical to the original's kernel code and descriptors" if not diffs
            else "differs from the original: " + "; ".join(doc["differences"]))
    return doc
