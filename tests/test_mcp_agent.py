"""The scripted MCP agent's CUDA plan, checked on the CPU with real Triton PTX
(tests/data/triton_*_sm90a.ptx): every PTX rewrite it submits keeps ref's parameter list and
is PTX that ptxas accepts for the H200 (where ptxas is installed), its wrong-ABI probe is
refused, its Triton variants only change what the launch can follow, its speed-of-light
check is the hand calculation, and its summary's checks fail when the run falls short."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest

from kpair.errors import AbiMismatch
from kpair.ptx import assemble_with, check_abi, cubin_params, entry_params, find_cuda_tool

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def agent():
    spec = importlib.util.spec_from_file_location("kpair_mcp_agent",
                                                  ROOT / "benchmarks" / "mcp_agent.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["triton_add_sm90a", "triton_softmax_sm90a"])
def test_every_ptx_rewrite_keeps_the_abi_and_assembles(agent, name):
    ptx = (DATA / f"{name}.ptx").read_text()
    ref = [(p.offset, p.size) for p in entry_params(ptx)]
    cands = agent.ptx_candidates(ptx, 20)
    labels = [c["label"] for c in cands]
    assert labels[0].startswith("ptx: ld.global.nc x")
    assert any(lab.startswith("ptx: st.global.cs") for lab in labels)
    assert sum("ptxas" in lab for lab in labels) == 5
    assert len(set(labels)) == len(labels) and len(cands) >= 9
    for c in cands:
        assert c["form"] == "ptx"
        check_abi(entry_params(c["code"]), ref)
        if "ptxas" not in c["label"]:
            assert c["code"] != ptx
    # A cache operator never meets an eviction priority (PTX has one or the other).
    for c in cands:
        for hint in ("cs", "lu", "cg", "ca"):
            assert f"ld.global.{hint}.L1::" not in c["code"]
        assert "st.global.cs.L1::" not in c["code"]
    if find_cuda_tool("ptxas") is None:
        pytest.skip("ptxas is not installed: the rewrites were not assembled")
    for c in cands:
        image, cmd = assemble_with(c["code"], arch="sm_90",
                                   options=c.get("ptxas_options") or [])
        assert "-arch=sm_90a" in cmd, c["label"]
        assert cubin_params(image, _name(ptx)) == ref, c["label"]


def _name(ptx: str) -> str:
    from kpair.ptx import entries

    return entries(ptx)[0]


def test_an_evict_last_load_gets_nc_but_no_cache_operator(agent):
    ptx = (DATA / "triton_add_sm90a.ptx").read_text()
    assert "ld.global.L1::evict_last" in ptx
    nc = next(c for c in agent.ptx_candidates(ptx, 20) if c["label"].startswith(
        "ptx: ld.global.nc"))
    assert "ld.global.nc.L1::evict_last" in nc["code"] and nc["label"].endswith("x6")
    cs = next(c for c in agent.ptx_candidates(ptx, 20) if c["label"].startswith(
        "ptx: ld.global.cs"))
    assert cs["label"].endswith("x4") and "ld.global.L1::evict_last" in cs["code"]


def test_the_wrong_abi_probe_lacks_refs_last_parameter(agent):
    ptx = (DATA / "triton_add_sm90a.ptx").read_text()
    bad = agent.wrong_abi(ptx)
    assert len(entry_params(bad)) == 6
    with pytest.raises(AbiMismatch, match="6 parameters, ref 7"):
        check_abi(entry_params(bad), [(p.offset, p.size) for p in entry_params(ptx)])


def test_triton_variants_follow_describes_tunable_blocks(agent):
    code = {"triton_source": "def k(): pass"}
    facts = {"num_warps": 4, "constants": {"XBLOCK": 1024, "R0_BLOCK": 1024},
             "tunable_blocks": ["XBLOCK"]}
    cands = agent.triton_candidates(code, facts, 20)
    labels = [c["label"] for c in cands]
    assert labels == ["triton: XBLOCK=2048", "triton: XBLOCK=512", "triton: num_warps=1",
                      "triton: num_warps=2", "triton: num_warps=8", "triton: num_warps=16"]
    assert cands[0]["config"] == {"constants": {"XBLOCK": 2048}}
    assert agent.triton_candidates(code, {"error": "no metadata"}, 20) == []
    assert agent.triton_candidates({}, facts, 20) == []
    assert len(agent.triton_candidates(code, facts, 3)) == 3


def test_sol_check_is_the_hand_calculation(agent):
    rows, cols, peak = 4096, 1024, 4.2e12
    hand = 3 * rows * cols * 4 + cols * 4
    desc = {"kernel": "triton_poi_fused_add_mul_0", "ref_time_us": 15.0,
            "sol": {"floor_s": hand * 1.02 / peak, "peak_bytes_per_s": peak,
                    "must_move_bytes": int(hand * 1.02)}}
    check = agent.sol_check(desc, rows, cols)
    assert check["hand_bytes"] == 50_335_744
    assert check["kpair_over_hand"] == pytest.approx(1.02)
    assert check["hand_floor_us"] == pytest.approx(hand / peak * 1e6)
    assert agent.sol_check({**desc, "kernel": "triton_per_fused__softmax_0"}, rows,
                           cols) is None
    assert agent.sol_check({**desc, "sol": None}, rows, cols) is None


def test_the_summary_says_which_of_the_issues_checks_failed(agent):
    row = {"operator": "a", "form": "ptx", "label": "x", "status": "pass", "seconds": 0.2}
    summary = {"backend": "cuda", "candidates": [row] * 19 + [{**row, "form": "triton",
                                                               "operator": "b"}],
               "confirmed": [], "published": [{"published": True}],
               "abi_check": {"refused": True},
               "sol_check": [{"kpair_over_hand": 1.05}], "t0": 0.0}
    done = agent.finish(summary)
    assert "t0" in summary and "t0" not in done  # the running summary is left as it is
    checks = done["issue_22"]
    assert checks[">=20 candidates judged"] and checks["PTX candidates judged"]
    assert checks["Triton source candidates judged"] and checks["ABI check refused a wrong "
                                                                 "parameter list"]
    assert not checks[">=3 operators judged"]
    assert checks["median s per candidate <= 0.3"]
    assert checks["SOL within 10% of the hand calculation"]
    summary["sol_check"] = [{"kpair_over_hand": 1.2}]
    assert not agent.finish(summary)["issue_22"]["SOL within 10% of the hand calculation"]


def test_ptx_candidates_are_assembled_with_refs_fmad_setting():
    from kpair.mcp.build import ptxas_defaults

    def state(fusion):
        meta = {"triton": {"source": "def k(x, n):\n    pass\n", "function": "k",
                           "signature": {"x": "*fp32", "n": "i32"},
                           "metadata": {"num_warps": 4, "enable_fp_fusion": fusion}}}
        manifest = types.SimpleNamespace(provenance=meta)
        return types.SimpleNamespace(harness=types.SimpleNamespace(
            snapshot=types.SimpleNamespace(manifest=manifest)))

    assert ptxas_defaults(state(False), ["-O3"]) == ["-O3", "--fmad=false"]
    assert ptxas_defaults(state(False), ["--fmad=true"]) == ["--fmad=true"]
    assert ptxas_defaults(state(True), ["-O3"]) == ["-O3"]
    assert ptxas_defaults(types.SimpleNamespace(harness=types.SimpleNamespace(
        snapshot=types.SimpleNamespace(manifest=types.SimpleNamespace(provenance={})))),
        []) == []
