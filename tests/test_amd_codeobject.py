"""AMDGPU code objects built here by clang: what kpair reads from their metadata note is
what LLVM's own llvm-readelf reports for the same files, hidden arguments included."""

from __future__ import annotations

import re
import subprocess

import pytest

from amd_kit import SOURCES, build, needs_llvm
from kpair.amd.codeobject import read_code_object
from kpair.amd.target import TargetId, incompatibility
from kpair.errors import FormatError, SymbolNotFound
from kpair.snapshot import detect_format
from kpair.toolchain import find_llvm_tool


@pytest.fixture(scope="module")
def objects(tmp_path_factory):
    d = tmp_path_factory.mktemp("co")
    out = {(s, "gfx942"): build(s, d) for s in SOURCES}
    out[("elementwise", "gfx90a")] = build("elementwise", d, "gfx90a")
    out[("lds", "gfx942:sramecc+:xnack-")] = build("lds", d, "gfx942:sramecc+:xnack-")
    return out


def readelf_kernels(path) -> list[dict]:
    """Per kernel: name, args [(offset, size, value_kind)] and scalar fields, parsed from
    llvm-readelf --notes (its YAML rendering of the note)."""
    text = subprocess.run([find_llvm_tool("llvm-readelf"), "--notes", str(path)],
                          capture_output=True, text=True, check=True).stdout
    kernels, kernel, arg = [], None, None
    for line in text.splitlines():
        m = re.match(r"^(\s*)(- )?\.([a-z_]+):\s*(.*)$", line)
        if not m:
            continue
        indent, dash, key, value = len(m[1]), m[2], m[3], m[4].strip().strip("'")
        if indent == 2 and dash:           # a new kernel (list under amdhsa.kernels)
            kernel = {"args": []}
            kernels.append(kernel)
        if indent >= 6:                    # inside .args
            if dash:
                arg = {}
                kernel["args"].append(arg)
            arg[key] = value
        elif kernel is not None and key != "args" and value:
            kernel[key] = value
    return kernels


def readelf_target(path) -> str:
    text = subprocess.run([find_llvm_tool("llvm-readelf"), "--notes", str(path)],
                          capture_output=True, text=True, check=True).stdout
    return re.search(r"amdhsa\.target:\s+'?([^'\s]+)", text).group(1)


@needs_llvm
def test_metadata_matches_llvm_readelf(objects):
    for (source, mcpu), path in objects.items():
        image = path.read_bytes()
        assert detect_format(image) == "hsaco"
        info = read_code_object(image)
        assert info.target_text == readelf_target(path)
        assert info.target == TargetId.parse(mcpu)
        assert info.code_object_version == 5
        theirs = readelf_kernels(path)
        assert [k.name for k in info.kernels] == [k["name"] for k in theirs], source
        for mine, ref in zip(info.kernels, theirs, strict=True):
            assert [(a.offset, a.size, a.value_kind) for a in mine.args] == \
                [(int(a["offset"]), int(a["size"]), a["value_kind"]) for a in ref["args"]]
            for field in ("kernarg_segment_size", "group_segment_fixed_size",
                          "private_segment_fixed_size", "sgpr_count", "vgpr_count",
                          "wavefront_size", "max_flat_workgroup_size"):
                assert getattr(mine, field) == int(ref[field]), (source, mine.name, field)
            assert mine.symbol == ref["symbol"] == f"{mine.name}.kd"


@needs_llvm
def test_hidden_arguments_and_resources(objects):
    info = read_code_object(objects[("elementwise", "gfx942")].read_bytes())
    axpy = info.kernel("axpy")
    assert axpy.param_layout() == [(0, 8), (8, 8), (16, 4), (20, 4)]
    assert axpy.explicit_size == 24
    hidden = {a.value_kind for a in axpy.hidden}
    assert {"hidden_block_count_x", "hidden_group_size_x", "hidden_remainder_x",
            "hidden_global_offset_x", "hidden_grid_dims"} <= hidden
    assert all(a.offset >= axpy.explicit_size for a in axpy.hidden)
    assert axpy.kernarg_segment_size >= max(a.offset + a.size for a in axpy.args)
    # i64, i64, i16, i32: natural alignment, as the C ABI puts them
    assert info.kernel("scale_i64").param_layout() == [(0, 8), (8, 8), (16, 2), (20, 4)]

    lds = read_code_object(objects[("lds", "gfx942")].read_bytes())
    assert lds.kernel("lds_reverse").group_segment_fixed_size == 1024
    block_sum = lds.kernel("block_sum")
    assert "dynamic_shared_pointer" in {a.value_kind for a in block_sum.explicit}
    scratch = read_code_object(objects[("scratch", "gfx942")].read_bytes())
    assert scratch.kernel("histogram_private").private_segment_fixed_size >= 97 * 4
    vgprs = read_code_object(objects[("vgprs", "gfx942")].read_bytes())
    assert vgprs.kernel("many_vgprs").vgpr_count > 128


@needs_llvm
def test_gfx90a_object_is_incompatible_with_gfx942(objects):
    old = read_code_object(objects[("elementwise", "gfx90a")].read_bytes())
    assert old.target.processor == "gfx90a"
    device = TargetId.parse("gfx942:sramecc+:xnack-")
    assert "gfx90a" in incompatibility(old.target, device)
    strict = read_code_object(objects[("lds", "gfx942:sramecc+:xnack-")].read_bytes())
    assert incompatibility(strict.target, device) is None
    assert "xnack-" in incompatibility(strict.target, TargetId.parse("gfx942:sramecc+:xnack+"))
    anyx = read_code_object(objects[("lds", "gfx942")].read_bytes())
    assert incompatibility(anyx.target, TargetId.parse("gfx942:sramecc-:xnack+")) is None


@needs_llvm
def test_kernel_lookup_and_bad_inputs(objects):
    info = read_code_object(objects[("lds", "gfx942")].read_bytes())
    assert info.kernel("block_sum.kd").name == "block_sum"
    with pytest.raises(SymbolNotFound, match="lds_reverse, block_sum"):
        info.kernel("nope")
    with pytest.raises(FormatError, match="not a readable ELF"):
        read_code_object(b"\x7fELF" + bytes(10))
    image = bytearray(objects[("lds", "gfx942")].read_bytes())
    image[18] = 62                                   # e_machine: x86-64
    with pytest.raises(FormatError, match="not an AMDGPU code object"):
        read_code_object(bytes(image))


def test_target_ids_parse_and_print():
    t = TargetId.parse("amdgcn-amd-amdhsa--gfx942:xnack-:sramecc+")
    assert t.processor == "gfx942" and t.features == {"xnack": False, "sramecc": True}
    assert str(t) == "gfx942:sramecc+:xnack-"
    assert TargetId.parse("gfx90a").features == {}
    assert incompatibility(TargetId.parse("gfx942"), TargetId.parse("gfx942")) is None
