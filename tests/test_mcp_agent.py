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
               "confirmed": [], "published": [{"published": True, "allow_slower": True}],
               "abi_check": {"refused": True},
               "sol_check": [{"kpair_over_hand": 1.05}], "t0": 0.0}
    done = agent.finish(summary)
    assert "t0" in summary and "t0" not in done  # the running summary is left as it is
    checks = done["issue_22"]
    assert checks[">=20 candidates judged"] and checks["PTX candidates judged"]
    assert checks["Triton source candidates judged"] and checks["ABI check refused a wrong "
                                                                 "parameter list"]
    assert not checks[">=3 operators judged"]
    assert checks[">=1 published"] and not checks[">=1 published faster than ref (CI above 1)"]
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
        return types.SimpleNamespace(snapshot=types.SimpleNamespace(manifest=manifest))

    assert ptxas_defaults(state(False), ["-O3"]) == ["-O3", "--fmad=false"]
    assert ptxas_defaults(state(False), ["--fmad=true"]) == ["--fmad=true"]
    assert ptxas_defaults(state(True), ["-O3"]) == ["-O3"]
    assert ptxas_defaults(types.SimpleNamespace(
        snapshot=types.SimpleNamespace(manifest=types.SimpleNamespace(provenance={}))),
        []) == []


# ----------------------------------------------------------------------- the server's side


def _state(provenance: dict, params: list[tuple[int, int]], scalars: dict[int, bytes],
           grid, block, ref_image: bytes = b""):
    """A stand-in for the harness of a CUDA snapshot: what build.py reads of it."""
    size = max(o + s for o, s in params)
    kernarg = bytearray(size)
    for offset, value in scalars.items():
        kernarg[offset:offset + len(value)] = value
    manifest = types.SimpleNamespace(
        provenance=provenance, arch="sm_90",
        launch=types.SimpleNamespace(grid=tuple(grid), block=tuple(block)),
        kernarg=types.SimpleNamespace(params=[types.SimpleNamespace(
            offset=o, size=s, name=f"arg{i}") for i, (o, s) in enumerate(params)]))
    snapshot = types.SimpleNamespace(manifest=manifest, kernarg=lambda: bytes(kernarg))
    ref = types.SimpleNamespace(kernel="k")
    return types.SimpleNamespace(snapshot=snapshot, backend="cuda", ref=ref,
                                 opt=types.SimpleNamespace(kernel="k"),
                                 binary=lambda side: ref_image)


def test_describe_tells_the_agent_which_block_sizes_the_launch_follows():
    """triton_facts on the provenance of a real H200 capture (an Inductor launch recorded
    with its autotuner's configs only, no compiled kernel: no PTX kept)."""
    import json
    import struct

    from kpair.mcp.build import triton_facts

    data = json.loads((DATA / "inductor_launch_h200.json").read_text())
    params = [(p["offset"], p["size"]) for p in data["params"]]
    state = _state({"triton": data["triton"]}, params, {16: struct.pack("<i", 2097152)},
                   data["launch"]["grid"], data["launch"]["block"])
    facts = triton_facts(state)
    assert facts["function"] == "triton_poi_fused_clone_expand_unsqueeze_5"
    assert facts["num_warps"] == 8 and facts["constants"] == {"XBLOCK": 512}
    assert facts["tunable_blocks"] == ["XBLOCK"]
    assert facts["grid_formula"] == "cdiv(xnumel, XBLOCK)"
    assert "ptx" not in data["triton"]  # why the server finds ref's PTX another way
    # A grid no recorded config gives: which config ran is unknown, and the agent is told.
    state = _state({"triton": data["triton"]}, params, {16: struct.pack("<i", 2097152)},
                   [4095, 1, 1], data["launch"]["block"])
    assert "config that ran is unknown" in triton_facts(state)["error"]
    assert "error" in triton_facts(_state({}, params, {}, [1, 1, 1], [1, 1, 1]))


def test_a_ptx_candidate_is_built_against_refs_layout_and_arch(tmp_path):
    """build_candidate's PTX path on real Triton PTX: ABI checked, assembled for sm_90a
    (the snapshot says sm_90), the cubin's own layout checked; a changed list refused."""
    from kpair.mcp.build import build_candidate

    if find_cuda_tool("ptxas") is None:
        pytest.skip("ptxas is not installed")
    ptx = (DATA / "triton_add_sm90a.ptx").read_text()
    params = [(p.offset, p.size) for p in entry_params(ptx)]
    triton = {"source": "def triton_poi_fused_add_mul_0(a, b, c, d, xnumel, XBLOCK):\n"
                        "    pass\n", "function": "triton_poi_fused_add_mul_0",
              "signature": {"a": "*fp32", "b": "*fp32", "c": "*fp32", "d": "*fp32",
                            "xnumel": "i32", "XBLOCK": "constexpr"},
              "metadata": {"num_warps": 4, "enable_fp_fusion": False}}
    state = _state({"triton": triton}, params, {}, [4096, 1, 1], [128, 1, 1])
    built = build_candidate(state, "ptx", code=ptx, path=None, kernel=None,
                            ptxas_options=["-O3"], config=None)
    assert built.kernel == "triton_poi_fused_add_mul_0"
    assert "-arch=sm_90a" in built.build and "--fmad=false" in built.build
    assert built.params["ptxas_options"] == ["-O3", "--fmad=false"]
    assert cubin_params(built.image, built.kernel) == params
    with pytest.raises(AbiMismatch, match="parameter 4"):
        build_candidate(state, "ptx", code=ptx.replace(
            ".param .u32 triton_poi_fused_add_mul_0_param_4",
            ".param .u64 triton_poi_fused_add_mul_0_param_4"), path=None, kernel=None,
            ptxas_options=[], config=None)


def test_refs_ptx_by_compiling_the_captured_source_again(tmp_path):
    """Where Triton is installed: the captured source compiled with the captured config
    gives PTX, and the answer says whether its cubin is ref's."""
    pytest.importorskip("triton")
    from kpair.mcp.build import recompiled_ptx

    source = (DATA / "triton_add_source.txt").read_text()
    triton = {"source": source, "function": "triton_poi_fused_add_mul_0",
              "signature": {"in_ptr0": "*fp32", "in_ptr1": "*fp32", "in_ptr2": "*fp32",
                            "out_ptr0": "*fp32", "xnumel": "i32", "XBLOCK": "constexpr"},
              "constants": {"XBLOCK": 1024},
              "attrs": {str((i,)): [["tt.divisibility", 16]] for i in range(5)},
              "metadata": {"num_warps": 4, "num_stages": 1}}
    ptx = (DATA / "triton_add_sm90a.ptx").read_text()
    params = [(p.offset, p.size) for p in entry_params(ptx)]
    cubin = (DATA / "triton_add_sm90a.cubin").read_bytes()
    text, how = recompiled_ptx(_state({"triton": triton}, params, {}, [4096, 1, 1],
                                      [128, 1, 1], cubin), tmp_path)
    assert text is not None and entry_params(text) == entry_params(ptx), how
    assert "compiled again" in how
    # The line tables name another source file; the machine code is ref's (when the Triton
    # here is the one that made the test data).
    if pytest.importorskip("triton").__version__ == "3.6.0":
        assert "is identical to ref's" in how
    text, how = recompiled_ptx(_state({"triton": triton}, params, {}, [4096, 1, 1],
                                      [128, 1, 1], b"not a cubin"), tmp_path)
    assert "NOT identical" in how
    text, how = recompiled_ptx(_state({}, params, {}, [1, 1, 1], [1, 1, 1]), tmp_path)
    assert text is None and "no captured Triton source" in how


def test_a_triton_submission_builds_as_the_strategy_builds_its_configs(tmp_path):
    """Where Triton is installed: an agent's Triton source with a config and the triton
    strategy's build of the same config are one build (``triton.build_config``): the same
    machine code, kernel and launch."""
    pytest.importorskip("triton")
    from kpair.mcp.build import build_candidate
    from kpair.optimize.strategies import triton as tr
    from kpair.optimize.strategy import Context
    from kpair.ptx import cubin_text

    source = (DATA / "triton_add_source.txt").read_text()
    triton = {"source": source, "function": "triton_poi_fused_add_mul_0",
              "signature": {"in_ptr0": "*fp32", "in_ptr1": "*fp32", "in_ptr2": "*fp32",
                            "out_ptr0": "*fp32", "xnumel": "i32", "XBLOCK": "constexpr"},
              "constants": {"XBLOCK": 1024},
              "attrs": {str((i,)): [["tt.divisibility", 16]] for i in range(5)},
              "metadata": {"num_warps": 4, "num_stages": 1}}
    params = [(p.offset, p.size) for p in entry_params((DATA / "triton_add_sm90a.ptx")
                                                       .read_text())]
    h = _state({"triton": triton}, params, {}, [4096, 1, 1], [128, 1, 1])
    submitted = build_candidate(h, "triton", code=source, path=None, kernel=None,
                                ptxas_options=[], config={"num_warps": 8})
    assert (submitted.format, submitted.kernel) == ("cubin", "triton_poi_fused_add_mul_0")
    assert submitted.launch_override["block"] == [256, 1, 1]
    assert submitted.params["num_warps"] == 8

    info = tr.for_harness(h)
    config = {"num_warps": 8, "num_stages": 1, "maxnreg": None, "constants": {}}
    retuned = tr._build(info, tr.load_function(info, tmp_path), config, "t", h,
                        Context(work=tmp_path), None, {}, origin="test")
    assert retuned.build_error is None and retuned.binary == tmp_path / "t.cubin"
    assert cubin_text(retuned.image) == cubin_text(submitted.image)
    assert (retuned.kernel, retuned.launch_override) == \
        (submitted.kernel, submitted.launch_override)
    # The strategy's own candidates: built, kept on file, with their provenance.
    (tmp_path / "s").mkdir()
    built = list(tr.TritonRetune(limit=3).candidates(h, Context(work=tmp_path / "s")))
    assert len(built) == 3 and all(c.built and c.strategy == "triton" for c in built)
    assert all(c.binary.read_bytes() == c.image and c.format == "cubin" for c in built)
    assert [c.launch_override["block"][0] for c in built] == \
        [32 * c.params["num_warps"] for c in built]


def test_a_capture_past_its_time_limit_is_killed_with_its_children(tmp_path, monkeypatch):
    """The capture tool's child (and what it started) is stopped at timeout_s; what the
    capture wrote by then is what the tool answers from."""
    import json
    import os
    import time

    from kpair.capture import cupti
    from kpair.errors import KpairError
    from kpair.mcp.workspace import Workspace

    pidfile = tmp_path / "grandchild.pid"
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    # Stands in for the program's interpreter, started as `python3 -m kpair.capture.program
    # prog.py` by the capture: writes capture.json, starts a grandchild, then hangs.
    fake.write_text(f"""#!/bin/sh
dest="{tmp_path / 'cap'}"
mkdir -p "$dest"
echo '{{"dispatches": []}}' > "$dest/capture.json"
sleep 300 &
echo $! > {pidfile}
echo "capturing..."
sleep 300
""")
    fake.chmod(0o755)
    monkeypatch.setattr(cupti, "find_cupti", lambda *a: "/fake/libcupti.so")
    ws = Workspace(tmp_path)
    started = time.monotonic()
    out = ws.capture([str(fake), "prog.py"], out="cap", timeout_s=1.0)
    assert time.monotonic() - started < 60
    assert out["exit_status"] == -9 and "stopped after 1 s" in out["log_tail"]
    assert out["captured"] == [] and json.loads((tmp_path / "cap" / "capture.json")
                                                .read_text()) == {"dispatches": []}
    grandchild = int(pidfile.read_text())
    for _ in range(100):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the capture's grandchild outlived the time limit")
    with pytest.raises(KpairError, match="timeout_s"):
        ws.capture(["python", "prog.py"], out="cap2", timeout_s=0)
