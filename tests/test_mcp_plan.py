"""The MCP tools on a range (host backend): ``describe_operator`` lists a recorded range's
live-in, live-out (with its declared output) and scratch regions and its operations;
``submit_candidate`` takes a launch plan with its code objects (C source built, or a given
``.so``), judges it in the operator's session (the honest fused plan passes, the memo cheat
fails), refuses a bad plan before any launch naming the launch and the parameter, and a
passing plan is published. The tool functions are called on the Workspace directly, as the
server's tools call them."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from conftest import CSRC, mlp_arrays, record_mlp_range
from kpair.errors import KpairError
from kpair.harness import create_harness
from kpair.mcp.workspace import Workspace
from kpair.pipeline import RunOptions
from kpair.session import read_attempts
from kpair.toolchain import compile_shared

N = 64
QUICK = RunOptions(time_cap_s=0.3, min_blocks=4, max_blocks=8, seed=5, replicates=1,
                   timeout_s=120)


def _fused_args(**change) -> list[dict]:
    args = {"n": {"bind": "scalar", "kind": "i32", "value": N},
            "bias": {"bind": "region", "name": "bias"}, "a": {"bind": "region", "name": "a"},
            "b": {"bind": "region", "name": "b"},
            "out": {"bind": "region", "name": "out", "access": "write"},
            "row": {"bind": "scratch", "name": "row"}}
    args.update(change)
    return [v for v in args.values() if v is not None]


def _plan(kernel: str = "kp_fused", args: list[dict] | None = None, row: int = N * 4,
          code: str = "ops.so") -> str:
    return json.dumps({"schema": "kpair.plan", "schema_version": 1,
                       "scratch": [{"name": "row", "size": row}],
                       "launches": [{"code": code, "kernel": kernel,
                                     "args": args if args is not None else _fused_args()}]})


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("mcpplan")
    lib = compile_shared(CSRC / "range_ops.c", d / "ops.so", flags=("-O2", "-g"))
    record_mlp_range(lib, d / "snap", mlp_arrays(N), N, provenance={"range": "mm_bias_relu"})
    (d / "first").mkdir()
    (d / "first" / "ops.so").write_bytes(lib.read_bytes())
    (d / "first" / "opt.plan.json").write_text(_plan())
    create_harness(d / "snap", d / "work" / "range", plan=d / "first" / "opt.plan.json")
    ws = Workspace(d / "work", QUICK, quick=QUICK)
    yield {"dir": d, "lib": lib, "ws": ws}
    ws.close()


def _attempts(lab) -> list:
    path = lab["dir"] / "work" / "mcp" / "range" / "evaluations" / "attempts.jsonl"
    return read_attempts(path) if path.is_file() else []


def test_describe_lists_the_ranges_regions_and_operations(lab):
    desc = lab["ws"].describe("range", measure=True, code=False)
    rng = desc["range"]
    assert rng["name"] == "mm_bias_relu"
    assert [(o["kind"], o["kernel"]) for o in rng["ops"]] == [
        ("kernel", "kp_matmul"), ("kernel", "kp_bias"), ("kernel", "kp_relu")]
    live_in = {r["name"]: r for r in rng["live_in"]}
    assert set(live_in) == {"a", "b", "bias"}
    assert {r["role"] for r in live_in.values()} == {"in"}
    assert (live_in["bias"]["size"], live_in["bias"]["dtype"], live_in["bias"]["elements"]) \
        == (N * 4, "float32", N)
    (out,) = rng["live_out"]
    assert (out["name"], out["role"], out["size"], out["dtype"]) == \
        ("out", "out", N * N * 4, "float32")
    assert out["outputs"] == [{"offset": 0, "size": N * N * 4}]
    assert rng["scratch"] == []
    rows = [*rng["live_in"], *rng["live_out"]]
    assert min(r["offset"] for r in rows) == 0
    for r in rows:   # offsets are the captured addresses from the lowest one
        assert int(r["address"], 16) - r["offset"] == int(rows[0]["address"], 16) - \
            rows[0]["offset"]
    assert "plan" in desc["forms"] and desc["ref_time_us"] > 0
    assert _attempts(lab)[0].strategy == "mcp:baseline"


def test_a_plan_with_its_source_passes_and_a_cheat_fails(lab):
    ws, source = lab["ws"], (CSRC / "range_ops.c").read_text()
    before = len(_attempts(lab))
    honest = ws.submit("range", "plan", code=_plan(), label="fused",
                       objects={"ops.so": {"form": "c", "code": source}})
    assert honest["status"] == "pass", honest["summary"]
    assert "cc -shared" in honest["build"]
    kept = Path(honest["candidate"])
    assert kept.name == "opt.plan.json" and (kept.parent / "ops.so").is_file()
    memo = ws.submit("range", "plan", code=_plan("kp_fused_memo"), label="memo",
                     objects={"ops.so": {"form": "binary", "code": base64.b64encode(
                         lab["lib"].read_bytes()).decode()}})
    assert memo["status"] == "fail" and memo["failed_check"], memo["summary"]
    by_path = ws.submit("range", "plan", path=str(lab["dir"] / "first" / "opt.plan.json"))
    assert by_path["status"] == "pass", by_path["summary"]
    new = _attempts(lab)[before:]
    assert [(a.strategy, a.status) for a in new] == [
        ("mcp:plan", "pass"), ("mcp:plan", "fail"), ("mcp:plan", "pass")]
    assert [a.n for a in new] == [honest["attempt"], memo["attempt"], by_path["attempt"]]

    pub = ws.publish("range", honest["attempt"], str(lab["dir"] / "release"),
                     allow_slower=True)
    assert pub["published"] is True and pub["status"] == "pass", pub
    index = json.loads((lab["dir"] / "release" / "index.json").read_text())
    assert index["operators"][0]["range"] == {"name": "mm_bias_relu", "ops": 3}


BAD = [
    ("too few parameters", _plan(args=_fused_args(row=None)),
     "launch 0 (kp_fused) takes 6 parameters"),
    ("a float for an int", _plan(args=_fused_args(
        n={"bind": "scalar", "kind": "f32", "value": 64.0})),
     "launch 0 (kp_fused) parameter 0"),
    ("writes a live-in region", _plan(args=_fused_args(
        a={"bind": "region", "name": "a", "access": "write"})),
     "region 'a' is live-in"),
    ("an unknown region", _plan(args=_fused_args(b={"bind": "region", "name": "bb"})),
     "the range has no region 'bb'"),
    ("reaches past a region", _plan(args=_fused_args(
        bias={"bind": "region", "name": "bias", "offset": 8, "bytes": N * 4})),
     "past the end of region 'bias'"),
    ("an undeclared scratch", _plan(args=_fused_args(row={"bind": "scratch", "name": "r2"})),
     "scratch buffer 'r2' is not declared"),
    ("scratch too small", _plan(row=16, args=_fused_args(
        row={"bind": "scratch", "name": "row", "bytes": N * 4})),
     "past the end of scratch buffer 'row' (16 bytes)"),
    ("no writer of the output", _plan(args=_fused_args(
        out={"bind": "region", "name": "out"})), "no launch of the plan binds for writing"),
    ("a missing kernel", _plan("kp_nope"), "kp_nope"),
]


@pytest.mark.parametrize("why,plan,message", BAD, ids=[b[0] for b in BAD])
def test_a_bad_plan_is_refused_before_any_launch(lab, why, plan, message):
    before = len(_attempts(lab))
    with pytest.raises(KpairError) as e:
        lab["ws"].submit("range", "plan", code=plan,
                         objects={"ops.so": {"form": "binary", "path": str(lab["lib"])}})
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert len(_attempts(lab)) == before   # nothing was judged
    cands = lab["dir"] / "work" / "mcp" / "range" / "candidates"
    assert not any(p.name.startswith("pending-") for p in cands.iterdir()) \
        if cands.is_dir() else True


def test_plan_inputs_are_checked(lab):
    ws = lab["ws"]
    cases = [
        (dict(code="{not json"), "the plan is not JSON"),
        (dict(code=_plan()), "no code object 'ops.so' (give it in 'objects'"),
        (dict(code=_plan(), objects={"ops.so": {"form": "cuda", "code": "x"}}),
         "a cuda object needs a cuda operator"),
        (dict(code=_plan(), objects={"ops.so": {"form": "binary", "path": str(lab["lib"])},
                                     "extra.so": {"form": "c", "code": ""}}),
         "object 'extra.so' is named by no launch"),
        (dict(code=_plan(), objects={"ops.so": {"form": "c",
                                                "code": "int broken(;"}}), "failed"),
    ]
    for kwargs, message in cases:
        with pytest.raises(KpairError) as e:
            ws.submit("range", "plan", **kwargs)
        assert message in str(e.value), (kwargs, str(e.value))
    with pytest.raises(KpairError, match="submit a launch plan"):
        ws.submit("range", "c", code=(CSRC / "range_ops.c").read_text())


def test_a_range_snapshot_is_described_and_its_first_plan_pairs_it(lab, tmp_path):
    """A recorded range in the work directory, no harness: described from the snapshot,
    and the first plan submitted makes its base harness and is judged on it."""
    import shutil

    root = tmp_path / "w"
    shutil.copytree(lab["dir"] / "snap", root / "rng")
    ws = Workspace(root, QUICK, quick=QUICK)
    try:
        assert [(r["operator"], r["kind"]) for r in ws.list()] == [("rng", "snapshot")]
        desc = ws.describe("rng")
        assert desc["ref_time_us"] is None and "launch plan" in desc["ref_time_note"]
        assert [o["kernel"] for o in desc["range"]["ops"]] == \
            ["kp_matmul", "kp_bias", "kp_relu"]
        assert [r["name"] for r in desc["range"]["live_out"]] == ["out"]
        with pytest.raises(KpairError, match="parameter 0"):
            ws.submit("rng", "plan", code=_plan(args=_fused_args(
                n={"bind": "scalar", "kind": "i64", "value": N})),
                objects={"ops.so": {"form": "binary", "path": str(lab["lib"])}})
        assert not (root / "mcp" / "rng" / "base").exists()   # a refused plan pairs nothing
        done = ws.submit("rng", "plan", code=_plan(),
                         objects={"ops.so": {"form": "binary", "path": str(lab["lib"])}})
        assert done["status"] == "pass", done["summary"]
        assert (root / "mcp" / "rng" / "base" / "harness.json").is_file()
        again = ws.describe("rng", code=False)
        assert again["ref_time_us"] > 0 and again["range"]["name"] == "mm_bias_relu"
    finally:
        ws.close()
    # A new server on the same directory finds the base harness.
    ws = Workspace(root, QUICK, quick=QUICK)
    try:
        assert ws.state("rng").harness is not None
    finally:
        ws.close()


def test_the_server_tool_takes_a_plan_as_text_or_object(lab):
    """Through the SDK's server (in process): the plan's JSON text (which the SDK reads as
    an object) and the object itself are judged alike; a bad plan is a tool error."""
    pytest.importorskip("mcp", reason="the MCP SDK is not installed: pip install 'kpair[mcp]'")
    import anyio
    from mcp.server.mcpserver.exceptions import ToolError

    from kpair.mcp.server import build_server

    server = build_server(lab["ws"])
    objects = {"ops.so": {"form": "binary", "path": str(lab["lib"])}}

    async def calls():
        out = []
        for code in (_plan(), json.loads(_plan())):
            r = await server.call_tool("submit_candidate", {
                "operator": "range", "form": "plan", "code": code, "objects": objects})
            out.append(r)
        try:
            await server.call_tool("submit_candidate", {
                "operator": "range", "form": "plan", "objects": objects,
                "code": _plan(args=_fused_args(b={"bind": "region", "name": "bb"}))})
        except ToolError as e:
            out.append(str(e))
        return out

    *judged, refused = anyio.run(calls)
    for r in judged:
        assert not r.is_error, r.content[0].text
        data = r.structured_content or json.loads(r.content[0].text)
        assert data["status"] == "pass" and data["judged"] == "quick", data["summary"]
    assert isinstance(refused, str) and "kpair:" in refused and "no region 'bb'" in refused
