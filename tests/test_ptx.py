"""The PTX edit path on the CPU: parameter lists parsed from real nvcc PTX agree with the
cubin's own .nv.info layout; ptxas assembles edited PTX for sm_90; a parameter list that
differs from ref's is refused naming the parameter; ptxas options come from a fixed list."""

from __future__ import annotations

import shutil

import pytest

from kpair.errors import AbiMismatch, KpairError, UsageError
from kpair.ptx import (
    assemble,
    check_abi,
    check_options,
    cubin_params,
    entries,
    entry_params,
    find_cuda_tool,
    ref_ptx,
)
from kpair.snapshot import detect_format
from kpair.toolchain import compile_cuda

SOURCE = r"""
struct S { double a; int b; };
extern "C" __global__ void kp_mix(const float* __restrict__ x, float* y, int n, char c, S s,
                                  double d, short h) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * 2.0f + c + s.a + s.b + d + h;
}
extern "C" __global__ void kp_copy(const float* __restrict__ x, float* y, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] = x[i];
}
"""

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None or find_cuda_tool("ptxas") is None,
                                reason="nvcc and ptxas (CUDA toolkit) are not installed")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if shutil.which("nvcc") is None or find_cuda_tool("ptxas") is None:
        pytest.skip("nvcc and ptxas (CUDA toolkit) are not installed")
    d = tmp_path_factory.mktemp("ptx")
    (d / "k.cu").write_text(SOURCE)
    ptx = compile_cuda(d / "k.cu", d / "k.ptx", kind="ptx").read_text()
    cubin = compile_cuda(d / "k.cu", d / "k.cubin").read_bytes()
    return ptx, cubin


def test_parsed_parameters_agree_with_the_cubins_own_layout(built):
    ptx, cubin = built
    assert sorted(entries(ptx)) == ["kp_copy", "kp_mix"]
    params = entry_params(ptx, "kp_mix")
    assert [(p.offset, p.size, p.align) for p in params] == [
        (0, 8, 8), (8, 8, 8), (16, 4, 4), (20, 1, 1), (24, 16, 8), (40, 8, 8), (48, 2, 2)]
    assert params[4].name == "kp_mix_param_4" and params[4].type == ".b8"
    for kernel in ("kp_mix", "kp_copy"):
        assert [(p.offset, p.size) for p in entry_params(ptx, kernel)] == \
            cubin_params(cubin, kernel)
    with pytest.raises(UsageError, match="2 kernels"):
        entry_params(ptx)
    with pytest.raises(KpairError, match="not an .entry"):
        entry_params(ptx, "nope")


def test_edited_ptx_assembles_for_sm90_and_keeps_the_layout(built):
    ptx, cubin = built
    edited = ptx.replace("ld.global.nc.", "ld.global.cs.").replace("ld.global.f32",
                                                                   "ld.global.cs.f32")
    assert edited != ptx
    out = assemble(edited, arch="sm_90", options=["-O3", "--maxrregcount=64"])
    assert detect_format(out) == "cubin"
    assert cubin_params(out, "kp_copy") == cubin_params(cubin, "kp_copy")
    check_abi(entry_params(edited, "kp_copy"), cubin_params(cubin, "kp_copy"))
    with pytest.raises(KpairError, match="ptxas refused"):
        assemble(ptx.replace("ld.global", "ld.bogus", 1))


def test_a_changed_parameter_list_is_refused_naming_the_parameter(built):
    ptx, cubin = built
    ref = cubin_params(cubin, "kp_mix")
    wider = ptx.replace(".param .u32 kp_mix_param_2", ".param .u64 kp_mix_param_2")
    with pytest.raises(AbiMismatch, match=r"parameter 2 \(kp_mix_param_2\) is 8 bytes at "
                       r"offset 16; ref's is 4 bytes at offset 16"):
        check_abi(entry_params(wider, "kp_mix"), ref)
    fewer = ptx.replace(",\n\t.param .u16 kp_mix_param_6", "")
    assert len(entry_params(fewer, "kp_mix")) == 6
    with pytest.raises(AbiMismatch, match="6 parameters, ref 7: it lacks ref's parameter 6"):
        check_abi(entry_params(fewer, "kp_mix"), ref, ref_names=[""] * 6 + ["h"])
    # A cubin's layout is checked the same way (any code object the agent submits).
    with pytest.raises(AbiMismatch, match="3 parameters, ref 7: it lacks ref.s parameter 3"):
        check_abi(cubin_params(cubin, "kp_copy"), ref)


def test_ptxas_options_come_from_a_fixed_list():
    assert check_options(["-O2", "--def-load-cache=cg", "-dlcm=cs", "--fmad=false"])
    for bad in ("-o", "--output-file=/etc/x", "--input-as-string=x", "-O9", "x.ptx", 3):
        with pytest.raises(UsageError, match="not allowed"):
            check_options([bad])
    with pytest.raises(UsageError, match="arch"):
        assemble(".version 8.0", arch="sm_90; rm")


def test_ptx_parser_reads_triton_style_declarations():
    text = """
    .visible .entry triton_poi_fused_add_0(
        .param .u64 .ptr .global .align 1 triton_poi_fused_add_0_param_0,
        .param .u64 .ptr .global .align 16 triton_poi_fused_add_0_param_1,
        .param .u32 triton_poi_fused_add_0_param_2,
        .param .u64 .ptr .global .align 1 triton_poi_fused_add_0_param_3,
        .param .u64 .ptr .global .align 1 triton_poi_fused_add_0_param_4
    )  // a comment (with parentheses)
    { ret; }
    """
    params = entry_params(text)
    assert [(p.offset, p.size, p.align) for p in params] == [
        (0, 8, 8), (8, 8, 8), (16, 4, 4), (24, 8, 8), (32, 8, 8)]


def test_ref_ptx_says_where_it_comes_from_or_why_not():
    text, how = ref_ptx(b"\x7fELF", "cubin", {"triton": {"ptx": ".version 8.7\n.entry k()"}})
    assert text.startswith(".version") and "Triton" in how
    text, how = ref_ptx(b"\x7fELF", "cubin", {})
    assert text is None and "SASS only" in how
    text, how = ref_ptx(b".version 8.0\n.target sm_90\n\0", "ptx")
    assert text.startswith(".version") and "is PTX" in how


# ----------------------------------------------------------------------- real Triton PTX
# tests/data/triton_*_sm90a.ptx: what Triton 3.6 wrote for two Inductor-style kernels
# (an elementwise x * 2 + y + b, a persistent row softmax) compiled for GPUTarget("cuda", 90,
# 32), and the add's cubin, assembled by Triton's bundled ptxas (CUDA 12.8).

DATA = __import__("pathlib").Path(__file__).parent / "data"
ADD = "triton_poi_fused_add_mul_0"


def test_real_triton_ptx_declares_its_own_target_and_scratch_parameters():
    from kpair.ptx import assemble_arch, ptx_header

    ptx = (DATA / "triton_add_sm90a.ptx").read_text()
    assert ptx_header(ptx) == ((8, 7), "sm_90a")
    params = entry_params(ptx)
    # 4 pointers, xnumel, then the global and profile scratch pointers Triton appends.
    assert [(p.offset, p.size) for p in params] == [
        (0, 8), (8, 8), (16, 8), (24, 8), (32, 4), (40, 8), (48, 8)]
    assert [(p.offset, p.size) for p in params] == \
        cubin_params((DATA / "triton_add_sm90a.cubin").read_bytes(), ADD)
    # ptxas refuses .target sm_90a for -arch=sm_90: the PTX's own target is used.
    assert assemble_arch(ptx, "sm_90") == "sm_90a"
    assert assemble_arch(ptx.replace(".target sm_90a", ".target sm_80"), "sm_90") == "sm_90"
    assert assemble_arch(ptx.replace(".target sm_90a", ".target sm_100a"), "sm_90") == "sm_90"
    assert ptx_header("// no header\n.entry k()\n") == (None, None)


def test_the_ptxas_chosen_reads_the_ptx_version(monkeypatch):
    from kpair import ptx as mod

    assert mod.max_ptx_version((12, 4)) == (8, 4)
    assert mod.max_ptx_version((12, 8)) == (8, 7)
    assert mod.max_ptx_version((12, 9)) == (8, 8)
    assert mod.max_ptx_version((13, 0)) == (9, 0)
    releases = {"/old/ptxas": (12, 4), "/new/ptxas": (12, 8), "/odd/ptxas": None}
    monkeypatch.setattr(mod, "find_cuda_tools", lambda name: list(releases))
    monkeypatch.setattr(mod, "tool_release", releases.get)
    ptx = (DATA / "triton_add_sm90a.ptx").read_text()
    # PATH's older toolkit cannot read Triton's PTX 8.7: Triton's newer ptxas goes first.
    assert mod.ptxas_for(ptx) == ["/new/ptxas", "/old/ptxas", "/odd/ptxas"]
    assert mod.ptxas_for(ptx.replace(".version 8.7", ".version 8.0")) == \
        ["/old/ptxas", "/new/ptxas", "/odd/ptxas"]


def test_real_triton_ptx_assembles_for_the_snapshots_arch(built):
    from kpair.ptx import assemble_with

    ptx = (DATA / "triton_add_sm90a.ptx").read_text()
    image, cmd = assemble_with(ptx, arch="sm_90", options=["-O3"])
    assert "-arch=sm_90a" in cmd and detect_format(image) == "cubin"
    assert cubin_params(image, ADD) == \
        cubin_params((DATA / "triton_add_sm90a.cubin").read_bytes(), ADD)


def test_a_ptxas_too_old_for_the_version_hands_over_to_the_next(built, tmp_path, monkeypatch):
    from kpair import ptx as mod

    fake = tmp_path / "ptxas"
    fake.write_text("#!/bin/sh\necho \"ptxas in.ptx, line 1; fatal   : Unsupported .version "
                    "8.7; current version is '8.4'\" >&2\nexit 255\n")
    fake.chmod(0o755)
    real = find_cuda_tool("ptxas")
    monkeypatch.setattr(mod, "ptxas_for", lambda text: [str(fake), real])
    ptx = (DATA / "triton_add_sm90a.ptx").read_text()
    _, cmd = mod.assemble_with(ptx, arch="sm_90")
    assert cmd[0] == real
    # A refusal for any other reason is the PTX's: it is not retried, and both say why.
    monkeypatch.setattr(mod, "ptxas_for", lambda text: [real, str(fake)])
    with pytest.raises(KpairError, match="ptxas refused") as e:
        mod.assemble_with(ptx.replace("ld.global", "ld.bogus", 1), arch="sm_90")
    assert str(fake) not in str(e.value)


def test_ref_ptx_of_a_cubin_is_found_beside_it_in_tritons_cache(tmp_path, monkeypatch):
    from kpair.ptx import triton_cache_dirs, triton_cache_ptx

    cubin = (DATA / "triton_add_sm90a.cubin").read_bytes()
    ptx = (DATA / "triton_add_sm90a.ptx").read_text()
    cache = tmp_path / "torchinductor_me" / "triton" / "0"
    (cache / "AAAA").mkdir(parents=True)
    (cache / "AAAA" / f"{ADD}.cubin").write_bytes(cubin[:-1] + b"\x00")  # same size, other
    (cache / "AAAA" / f"{ADD}.ptx").write_text("// the wrong one\n.entry x()\n")
    (cache / "BBBB").mkdir()
    (cache / "BBBB" / f"{ADD}.cubin").write_bytes(cubin)
    (cache / "BBBB" / f"{ADD}.ptx").write_text(ptx)
    text, how = triton_cache_ptx(cubin, [cache])
    assert text == ptx and "BBBB" in how and "byte-identical" in how
    assert triton_cache_ptx(cubin + b"\x00", [cache]) is None
    # Inductor's default place (<tmp>/torchinductor_<user>/triton/<device>) is searched.
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(tmp_path))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert cache in triton_cache_dirs()
    text, how = ref_ptx(cubin, "cubin", {"triton": {"source": "def k(): pass"}})
    assert text == ptx and "Triton's cache" in how
