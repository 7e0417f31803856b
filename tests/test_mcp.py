"""``kpair mcp`` driven by the MCP SDK's own client over stdio: the tools are listed, a host
harness is described, an honest and a cheating candidate get the verdicts ``kpair evaluate``
gives them, every submission is in attempts.jsonl, kpair's errors arrive as tool errors, and
a winner is published."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import CSRC, record_matmul
from kpair.harness import create_harness
from kpair.session import read_attempts
from kpair.toolchain import compile_shared

pytest.importorskip("mcp", reason="the MCP SDK is not installed: pip install 'kpair[mcp]'")

import anyio  # noqa: E402  (installed with the SDK)
from mcp import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402

SRC = Path(__file__).resolve().parent.parent / "src"
QUICK = ["--time-cap", "0.5", "--min-blocks", "4", "--max-blocks", "16", "--seed", "5",
         "--timeout", "120"]
TOOLS = {"list_operators", "describe_operator", "submit_candidate", "publish", "capture",
         "profile"}


@pytest.fixture(scope="module")
def work(tmp_path_factory, matmul_libs):
    d = tmp_path_factory.mktemp("mcp")
    snap = record_matmul(matmul_libs["naive"], d / "snap", n=48)
    create_harness(snap, d / "work" / "matmul", opt=matmul_libs["fast"])
    cheat = compile_shared(CSRC / "adversarial.c", d / "nowrite.so", flags=("-O2", "-pthread"),
                           defines={"KP_CHEAT": 1})
    return d, cheat


def _env(tmp: Path) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(SRC), os.environ.get("PYTHONPATH", "")]), "KPAIR_CACHE_DIR": str(tmp / "cache")}


async def _session(work_dir: Path, calls):
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "kpair", "mcp", str(work_dir), *QUICK,
                                         "--quick-max-blocks", "8"],
                                   env=_env(work_dir.parent))
    async with Client(params, read_timeout_seconds=600) as client:
        return await calls(client)


def _data(result) -> dict | list:
    assert not result.is_error, result.content[0].text
    if result.structured_content is not None:
        data = result.structured_content
        return data.get("result", data) if isinstance(data, dict) and set(data) == {
            "result"} else data
    return json.loads(result.content[0].text)


def test_an_agent_lists_describes_submits_and_publishes_over_stdio(work, tmp_path):
    d, cheat = work
    honest_c = "#define KP_VARIANT 1\n" + (CSRC / "matmul.c").read_text()
    release = tmp_path / "release"

    async def calls(client):
        out = {"tools": {t.name for t in (await client.list_tools()).tools}}
        out["ops"] = _data(await client.call_tool("list_operators", {}))
        out["desc"] = _data(await client.call_tool("describe_operator",
                                                   {"operator": "matmul"}))
        out["honest"] = _data(await client.call_tool("submit_candidate", {
            "operator": "matmul", "form": "c", "code": honest_c, "label": "loop order"}))
        out["cheat"] = _data(await client.call_tool("submit_candidate", {
            "operator": "matmul", "form": "binary", "path": str(cheat), "label": "nowrite"}))
        out["honest_full"] = _data(await client.call_tool("submit_candidate", {
            "operator": "matmul", "form": "c", "code": honest_c, "full": True}))
        out["cheat_full"] = _data(await client.call_tool("submit_candidate", {
            "operator": "matmul", "form": "binary", "path": str(cheat), "full": True}))
        out["ptx_on_host"] = await client.call_tool("submit_candidate", {
            "operator": "matmul", "form": "ptx", "code": ".version 8.0"})
        out["unknown"] = await client.call_tool("describe_operator", {"operator": "nope"})
        out["publish"] = _data(await client.call_tool("publish", {
            "operator": "matmul", "attempt": out["honest"]["attempt"],
            "release": str(release), "allow_slower": True}))
        return out

    out = anyio.run(_session, d / "work", calls)
    assert out["tools"] >= TOOLS
    assert [(o["operator"], o["kind"], o["backend"]) for o in out["ops"]] == \
        [("matmul", "harness", "host")]

    desc = out["desc"]
    roles = {r["name"]: r["ref"] for r in desc["regions"]}
    assert roles == {"a": "reads", "b": "reads", "c": "writes"}
    assert desc["must_move_bytes"]["total"] == 3 * 48 * 48 * 4
    assert desc["ref_time_us"] > 0 and desc["sol"]["ref_fraction"] > 0
    assert "SOL" in desc["sol_text"] and desc["policy_text"][0]
    assert [p["name"] for p in desc["kernarg"]["params"]] == ["a", "b", "c", "n"]

    # The verdicts are kpair evaluate's on the same candidates, quick or full: the quick
    # measurement keeps every trust check, so the cheat fails both ways.
    honest, cheated = out["honest"], out["cheat"]
    assert honest["status"] == "pass", honest["summary"]
    assert cheated["status"] == "fail" and cheated["failed_check"], cheated["summary"]
    assert (honest["judged"], out["honest_full"]["judged"]) == ("quick", "full")
    assert out["honest_full"]["status"] == "pass", out["honest_full"]["summary"]
    assert out["cheat_full"]["failed_check"] == cheated["failed_check"]
    quick_r = json.loads(Path(honest["result"]).read_text())
    full_r = json.loads(Path(out["honest_full"]["result"]).read_text())
    assert quick_r["speed"]["blocks"] <= 8  # --quick-max-blocks
    assert "systematic" not in quick_r["speed"] and full_r["speed"]["systematic"]
    evaluated = _evaluate(d / "work" / "matmul", [Path(honest["candidate"]), cheat], tmp_path)
    assert [e["status"] for e in evaluated] == ["pass", "fail"]
    assert evaluated[1]["failed_check"] == cheated["failed_check"]

    # kpair's messages come back as tool errors.
    assert out["ptx_on_host"].is_error
    assert "kpair: a ptx candidate needs a cuda operator" in out["ptx_on_host"].content[0].text
    assert out["unknown"].is_error and "no operator 'nope'" in out["unknown"].content[0].text

    # Every submission is in attempts.jsonl, the baseline measurement first.
    attempts = read_attempts(d / "work" / "mcp" / "matmul" / "evaluations" / "attempts.jsonl")
    assert [(a.n, a.strategy, a.status, a.params["judged"]) for a in attempts] == [
        (1, "mcp:baseline", "pass", "quick"), (2, "mcp:c", "pass", "quick"),
        (3, "mcp:binary", "fail", "quick"), (4, "mcp:c", "pass", "full"),
        (5, "mcp:binary", "fail", "full")]

    pub = out["publish"]
    assert pub["published"] is True and pub["status"] == "pass", pub
    index = json.loads((release / "index.json").read_text())
    assert [r["name"] for r in index["operators"]] == ["matmul"]
    assert index["operators"][0].get("sol", {}).get("must_move_bytes") == 3 * 48 * 48 * 4


def _evaluate(harness: Path, candidates: list[Path], tmp: Path) -> list[dict]:
    lines = "".join(json.dumps({"binary": str(c)}) + "\n" for c in candidates)
    proc = subprocess.run([sys.executable, "-m", "kpair", "evaluate", str(harness), "--jsonl",
                           "-o", str(tmp / "ev"), *QUICK], input=lines, capture_output=True,
                          text=True, env=_env(tmp), timeout=600)
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def test_without_the_sdk_the_error_gives_the_install_command(tmp_path, monkeypatch, capsys):
    import kpair.mcp.server as server
    from kpair.cli import main

    def missing():
        from kpair.errors import BackendUnavailable

        raise BackendUnavailable("kpair mcp needs the MCP Python SDK (2.x): "
                                 "pip install 'kpair[mcp]'")

    monkeypatch.setattr(server, "_sdk", missing)
    assert main(["mcp", str(tmp_path)]) == 4
    assert "pip install 'kpair[mcp]'" in capsys.readouterr().err


def test_the_listing_skips_releases_and_kpairs_own_outputs(work, tmp_path):
    """A release published inside the work directory, and an optimize work directory there,
    hold harnesses that are not operators: the listing shows the captured snapshot and the
    harness, nothing else."""
    from kpair.mcp.workspace import Workspace
    from kpair.pipeline import RunOptions
    from kpair.release import add_operator

    d, _ = work
    root = tmp_path / "w"
    snap = _snapshot_copy(d, root / "captures" / "snap")
    create_harness(snap, root / "pairs" / "mm", opt=d / "nowrite.so")
    quick = RunOptions(time_cap_s=0.3, min_blocks=4, max_blocks=8, seed=5, replicates=1,
                       timeout_s=120)
    add_operator(root / "release", d / "work" / "matmul", level=1, name="matmul",
                 options=quick, allow_slower=True)
    assert (root / "release" / "level1" / "matmul" / "harness" / "harness.json").is_file()
    optimize_op = root / "opt-work" / "ops" / "level1-matmul"
    (optimize_op / "captured.bin").parent.mkdir(parents=True)
    (optimize_op / "captured.bin").write_bytes(b"x")
    create_harness(snap, optimize_op / "base", opt=d / "nowrite.so")

    ws = Workspace(root)
    ops = {name: (kind, path.relative_to(root).as_posix())
           for name, (kind, path) in ((n, (op.kind, op.path))
                                      for n, op in ws.operators().items())}
    assert ops == {"captures_snap": ("snapshot", "captures/snap"),
                   "pairs_mm": ("harness", "pairs/mm")}
    # Served from inside the release, its harnesses are what there is to list.
    inside = Workspace(root / "release")
    assert [op.kind for op in inside.operators().values()] == ["harness"]


def _snapshot_copy(d: Path, dest: Path) -> Path:
    import shutil

    shutil.copytree(d / "snap", dest)
    return dest


def test_quick_options_keep_the_checks_and_bad_quick_flags_are_usage_errors(tmp_path, capsys):
    from kpair.cli import main
    from kpair.optimize.workbench import quick_options
    from kpair.pipeline import RunOptions

    full = RunOptions(seed=7, timeout_s=30, skip_checks=("noop",), max_blocks=400)
    quick = quick_options(full, max_blocks=12, time_cap_s=0.2)
    assert (quick.replicates, quick.min_blocks, quick.max_blocks, quick.time_cap_s,
            quick.control) == (1, 4, 12, 0.2, False)
    assert (quick.checks, quick.seed, quick.timeout_s, quick.skip_checks) == \
        (True, 7, 30, ("noop",))
    assert main(["mcp", str(tmp_path), "--quick-max-blocks", "2"]) == 2
    assert "--quick-max-blocks: must be an integer in [4," in capsys.readouterr().err
