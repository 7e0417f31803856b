"""The assembly round trip on real code objects: disassemble, reassemble unedited, and the
kernel code, kernel descriptors and metadata are identical; an edit shows up as a change."""

from __future__ import annotations

import json

import pytest

from amd_kit import SOURCES, build, needs_llvm
from kpair.amd.asm import assemble, compare, disassemble, read_layout
from kpair.amd.codeobject import read_code_object
from kpair.cli import main
from kpair.errors import KpairError


@needs_llvm
@pytest.mark.parametrize("mcpu", ["gfx942", "gfx942:sramecc+:xnack-", "gfx90a"])
@pytest.mark.parametrize("source", SOURCES)
def test_unedited_round_trip_is_identical(tmp_path, source, mcpu):
    original = build(source, tmp_path, mcpu)
    disassemble(original, tmp_path / "asm")
    rebuilt = assemble(tmp_path / "asm", tmp_path / "rebuilt.co")
    a, b = original.read_bytes(), rebuilt.read_bytes()
    assert compare(a, b) == []
    assert json.loads((tmp_path / "asm" / "asm.json").read_text())["identical"] is True
    # what compare() promises, checked once more by hand for every kernel
    la, lb = read_layout(a), read_layout(b)
    mine = {s.name: s for s in lb.symbols}
    for k in read_code_object(a).kernels:
        for name in (k.name, k.symbol):
            sym = next(s for s in la.symbols if s.name == name)
            assert la.bytes_of(sym) == lb.bytes_of(mine[name])
    text = (tmp_path / "asm" / "code.s").read_text()
    assert ".amdhsa_kernel" in text and ".amdgpu_metadata" in text


@needs_llvm
def test_the_five_sources_cover_lds_scratch_and_many_vgprs(tmp_path):
    kernels = {k.name: k for s in SOURCES
               for k in read_code_object(build(s, tmp_path).read_bytes()).kernels}
    assert len(kernels) >= 5
    assert kernels["lds_reverse"].group_segment_fixed_size > 0
    assert kernels["histogram_private"].private_segment_fixed_size > 0
    assert kernels["many_vgprs"].vgpr_count > 128


@needs_llvm
def test_an_edit_changes_the_code_and_branch_labels_follow(tmp_path):
    original = build("lds", tmp_path)
    source = disassemble(original, tmp_path / "asm")
    text = source.read_text()
    assert ".Lkpair_" in text                      # branches jump to labels, not offsets
    # insert an instruction before the first branch: every later address moves
    edited = text.replace("\ts_cbranch_execz", "\ts_nop 0\n\ts_cbranch_execz", 1)
    source.write_text(edited)
    rebuilt = assemble(tmp_path / "asm", tmp_path / "edited.co")
    diffs = compare(original.read_bytes(), rebuilt.read_bytes())
    assert [d.symbol for d in diffs] == ["lds_reverse"]
    assert read_code_object(rebuilt.read_bytes()).kernel("lds_reverse").name == "lds_reverse"


@needs_llvm
def test_cli_round_trip(tmp_path, capsys):
    original = build("elementwise", tmp_path)
    assert main(["asm", "disassemble", str(original), "-o", str(tmp_path / "d")]) == 0
    assert "reassemble identical" in capsys.readouterr().out
    assert main(["asm", "assemble", str(tmp_path / "d"), "-o", str(tmp_path / "o.co")]) == 0
    assert "identical to the original" in capsys.readouterr().out
    assert main(["asm", "assemble", str(tmp_path / "missing"), "-o", "x.co"]) == 2


def test_assemble_without_source_is_a_clear_error(tmp_path):
    with pytest.raises(KpairError, match="no code.s"):
        assemble(tmp_path, tmp_path / "x.co")
