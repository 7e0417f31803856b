"""Range and plan harnesses in a release, in ``kpair verify``, in the report and in
``kpair evaluate``, on the host backend: a range of three C functions (matmul, bias, ReLU;
tests/csrc/range_ops.c) judged against a one-launch fused plan, published beside a
single-dispatch harness (tests/csrc/matmul.c); the index names the range and its operation
count, and the ref identity covers every operation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import CSRC, record_matmul
from kpair import release
from kpair.cli import main as kpair
from kpair.harness import Harness, create_harness
from kpair.pipeline import RunOptions
from kpair.record import Recorder
from kpair.release.index import RangeRef, ref_identity
from kpair.report import render_markdown
from kpair.toolchain import compile_shared

QUICK = RunOptions(time_cap_s=0.3, min_blocks=8, timeout_s=60, replicates=1)
QUICK_ARGS = ["--time-cap", "0.3", "--min-blocks", "8", "--timeout", "60", "--replicates", "1"]
N = 64


def _record(lib: Path, out: Path, calls=("kp_matmul", "kp_bias", "kp_relu"), seed: int = 0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((N, N), dtype=np.float32)
    b = rng.standard_normal((N, N), dtype=np.float32)
    bias = rng.standard_normal(N, dtype=np.float32)
    c = np.zeros((N, N), np.float32)
    args = {"kp_matmul": [a, b, c, np.int32(N)], "kp_bias": [c, bias, np.int32(N)],
            "kp_relu": [c, np.int32(N)]}
    with Recorder(out, names={"a": a, "b": b, "bias": bias, "out": c}, outputs=[c],
                  provenance={"range": "mm_bias_relu"}) as r:
        for name in calls:
            r.call(lib, name, args[name])
    return r.snapshot


def _plan(d: Path, lib: Path, name: str, launches: list[dict], scratch=()) -> Path:
    (d / name).mkdir()
    (d / name / "ops.so").write_bytes(lib.read_bytes())
    (d / name / "opt.plan.json").write_text(json.dumps({
        "schema": "kpair.plan", "schema_version": 1, "scratch": list(scratch),
        "launches": launches}))
    return d / name / "opt.plan.json"


def _fused() -> list[dict]:
    return [{"code": "ops.so", "kernel": "kp_fused", "args": [
        {"bind": "scalar", "kind": "i32", "value": N}, {"bind": "region", "name": "bias"},
        {"bind": "region", "name": "a"}, {"bind": "region", "name": "b"},
        {"bind": "region", "name": "out", "access": "write"},
        {"bind": "scratch", "name": "row"}]}]


def _swapped() -> list[dict]:
    """The three functions with ReLU before bias: another answer."""
    return [{"code": "ops.so", "kernel": "kp_matmul", "args": [
                {"bind": "region", "name": "a"}, {"bind": "region", "name": "b"},
                {"bind": "region", "name": "out", "access": "write"},
                {"bind": "scalar", "kind": "i32", "value": N}]},
            {"code": "ops.so", "kernel": "kp_relu", "args": [
                {"bind": "region", "name": "out", "access": "readwrite"},
                {"bind": "scalar", "kind": "i32", "value": N}]},
            {"code": "ops.so", "kernel": "kp_bias", "args": [
                {"bind": "region", "name": "out", "access": "readwrite"},
                {"bind": "region", "name": "bias"},
                {"bind": "scalar", "kind": "i32", "value": N}]}]


@pytest.fixture(scope="module")
def lab(tmp_path_factory, matmul_libs) -> dict:
    d = tmp_path_factory.mktemp("planrel")
    lib = compile_shared(CSRC / "range_ops.c", d / "ops.so", flags=("-O2", "-g"))
    snap = _record(lib, d / "snap")
    fused = _plan(d, lib, "fused", _fused(), [{"name": "row", "size": N * 4}])
    ranged = create_harness(snap.root, d / "HR", plan=fused)
    single = create_harness(record_matmul(matmul_libs["naive"], d / "s1"), d / "HS",
                            opt=matmul_libs["fast"])
    return {"dir": d, "lib": lib, "snap": snap, "fused": fused, "HR": ranged.root,
            "HS": single.root}


def test_a_release_of_a_range_and_a_single_dispatch(lab, capsys):
    root = lab["dir"] / "rel"
    # The release's handling is under test, not the gain: --allow-slower.
    assert kpair(["release", "add", str(root), str(lab["HR"]), "--level", "2", "--name",
                  "1_range", "--allow-slower", *QUICK_ARGS]) == 0
    out = capsys.readouterr().out
    assert "added level2/1_range (range mm_bias_relu: 3 ops; plan of 1 launch): PASS" in out
    release.add_operator(root, lab["HS"], level=1, name="1_mm", options=QUICK,
                         allow_slower=True)
    rows = {r.name: r for r in release.load_index(root).operators}
    r, s = rows["1_range"], rows["1_mm"]
    assert r.range == RangeRef(name="mm_bias_relu", ops=3) and r.plan_launches == 1
    assert (r.kernels.ref, r.kernels.opt) == ("mm_bias_relu", "kp_fused")
    assert r.ref_identity.ops == 3 and r.ref_identity.kernel == "mm_bias_relu"
    assert s.range is None and s.plan_launches is None and s.ref_identity.ops is None
    assert (s.kernels.ref, s.kernels.opt) == ("kp_matmul", "kp_matmul")
    # The index reads back strictly, with the new fields.
    doc = json.loads((root / "index.json").read_text())
    by = {o["name"]: o for o in doc["operators"]}
    assert by["1_range"]["range"] == {"name": "mm_bias_relu", "ops": 3}
    assert "range" not in by["1_mm"] and "ops" not in by["1_mm"]["ref_identity"]

    index = release.verify_release(root, QUICK)
    for row in index.operators:   # both re-ran as the same operator, and passed
        (v,) = row.verifications
        assert v.same_operator is True and v.verdict == "pass", (row.name, v)
        assert v.outcome in ("reproduced", "not reproduced")
    assert index.verifications[-1].compared == 2

    text = render_markdown(index)
    assert "1_range (range mm_bias_relu: 3 ops; plan of 1 launch)" in text
    assert "| 1 | 1_mm |" in text
    assert kpair(["report", str(root), "--markdown-only"]) == 0
    assert "1_range (range mm_bias_relu: 3 ops; plan of 1 launch)" in \
        (root / "report.md").read_text()


def test_a_range_identity_covers_every_operation(lab, tmp_path):
    again = _record(lab["lib"], tmp_path / "again")
    h1 = Harness.open(lab["HR"])
    h2 = create_harness(again.root, tmp_path / "H2", plan=lab["fused"])
    assert ref_identity(h1) == ref_identity(h2)   # the same range, recorded again
    two = _record(lab["lib"], tmp_path / "two", calls=("kp_matmul", "kp_bias"))
    plan = _plan(tmp_path, lab["lib"], "p2", _fused(), [{"name": "row", "size": N * 4}])
    h3 = create_harness(two.root, tmp_path / "H3", plan=plan)
    diff = ref_identity(h1).differences(ref_identity(h3))
    assert "ops: 3 -> 2" in diff and any(d.startswith("code sha256") for d in diff)


def test_evaluate_judges_plans(lab, tmp_path):
    """``kpair evaluate`` takes launch plans (*.json) beside code objects: the fused plan
    passes, the swapped-order plan fails on ``out``; --jsonl takes {"plan": PATH}."""
    swapped = _plan(tmp_path, lab["lib"], "swapped", _swapped())
    out = tmp_path / "ev"
    proc = subprocess.run([sys.executable, "-m", "kpair", "evaluate", str(lab["HR"]),
                           str(lab["fused"]), str(swapped), "-o", str(out), "--json",
                           *QUICK_ARGS], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr   # one failed correctness
    doc = json.loads(proc.stdout)
    by = {Path(a["label"]).parent.name: a for a in doc["attempts"]}
    assert by["fused"]["status"] == "pass", by["fused"]
    assert by["swapped"]["status"] == "fail"
    assert len((out / "attempts.jsonl").read_text().splitlines()) == 2
    proc = subprocess.run([sys.executable, "-m", "kpair", "evaluate", str(lab["HR"]),
                           "--jsonl", "-o", str(tmp_path / "ev2"), *QUICK_ARGS],
                          input=json.dumps({"plan": str(lab["fused"])}) + "\n"
                          + json.dumps({"plan": str(tmp_path / "nope.json")}) + "\n",
                          capture_output=True, text=True, timeout=600)
    lines = [json.loads(x) for x in proc.stdout.splitlines()]
    assert lines[0]["status"] == "pass", lines[0]
    assert "no such file" in lines[1]["error"] and lines[1]["plan"].endswith("nope.json")
    assert proc.returncode == 3


def test_evaluate_on_a_device_pool_judges_a_plan(lab, tmp_path):
    from kpair.scale.evaluate import evaluate_on

    (done,) = list(evaluate_on(lab["HR"], [{"plan": str(lab["fused"]), "label": "fused"}],
                               QUICK, [0], tmp_path / "ev"))
    assert done.error is None and done.result.status == "pass", done.result
    assert done.attempt.label == "fused" and done.result.opt.kernel == "kp_fused"
    line = json.loads((tmp_path / "ev" / "attempts.jsonl").read_text())
    assert line["device"] == 0 and line["status"] == "pass"
