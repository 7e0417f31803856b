"""``kpair pair --propose-policy``: a tolerance policy proposed from ref-against-opt differences
on the captured and mutated inputs (kpair.policy.propose, kpair.propose), on the host range of
tests/test_range.py (matmul, bias, ReLU) judged against fused plans: a reassociated candidate
gets an allclose tighter than KernelBench's 1e-2 and passes under it, an exact one stays
byte-exact, a wrong one is refused (exit 4) naming the region and its error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import CSRC, mlp_arrays, record_mlp_range, run_json
from kpair.harness import Harness
from kpair.pipeline import RunOptions
from kpair.policy.propose import Observed, RegionSpec, ToleranceOverCeiling, propose
from kpair.propose import pair_with_proposal
from kpair.record import Recorder
from kpair.toolchain import compile_shared

N = 48


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("propose")
    ops = compile_shared(CSRC / "range_ops.c", d / "ops.so", flags=("-O2", "-g"))
    cand = compile_shared(CSRC / "propose_ops.c", d / "cand.so", flags=("-O2", "-g"))
    record_mlp_range(ops, d / "snap", mlp_arrays(N, seed=3), N)
    return {"dir": d, "ops": ops, "cand": cand, "snap": d / "snap"}


def _plan(lab: dict, kernel: str) -> Path:
    lib = lab["ops"] if kernel == "kp_fused" else lab["cand"]
    d = lab["dir"] / f"plan-{kernel}"
    d.mkdir(exist_ok=True)
    (d / "k.so").write_bytes(lib.read_bytes())
    plan = {"schema": "kpair.plan", "schema_version": 1,
            "scratch": [{"name": "row", "size": N * 4}],
            "launches": [{"code": "k.so", "kernel": kernel, "args": [
                {"bind": "scalar", "kind": "i32", "value": N},
                {"bind": "region", "name": "bias"}, {"bind": "region", "name": "a"},
                {"bind": "region", "name": "b"},
                {"bind": "region", "name": "out", "access": "write"},
                {"bind": "scratch", "name": "row"}]}]}
    (d / "opt.plan.json").write_text(json.dumps(plan))
    return d / "opt.plan.json"


def _kpair(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kpair", *args], capture_output=True,
                          text=True, timeout=300)


def test_reassociated_candidate_gets_a_tight_allclose_and_passes(lab):
    out = lab["dir"] / "H-reassoc"
    proc = _kpair("pair", str(lab["snap"]), "--plan", str(_plan(lab, "kp_fused_reassoc")),
                  "--propose-policy", "--propose-runs", "4", "-o", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["policy"] == "tolerance"
    policy = json.loads((out / "capture" / "validation_policy.json").read_text())
    (tol,) = policy["tolerances"]
    assert tol["region"] == "out" and tol["criterion"] == "allclose"
    assert tol["range"] == [0, N * N * 4] and tol["dtype"] == "float32"
    assert tol["atol"] < 1e-2 and tol["rtol"] < 1e-2
    assert 0 < tol["atol"] + tol["rtol"] < 1e-3   # float32 rounding, not a percent
    assert "--propose-policy" in policy["note"] and "6 runs" in policy["note"]
    (region,) = doc["proposal"]["regions"]
    assert region["max_abs_err"] > 0 and region["margin"] == 4
    r = run_json(out, RunOptions(time_cap_s=2.0, max_blocks=32, timeout_s=300))
    assert r["status"] == "pass", r.get("correctness") or r.get("error")
    # Byte-exact judging fails the same candidate: the tolerance is needed.
    bare = lab["dir"] / "H-reassoc-exact"
    proc = _kpair("pair", str(lab["snap"]), "--plan", str(_plan(lab, "kp_fused_reassoc")),
                  "-o", str(bare))
    assert proc.returncode == 0, proc.stderr
    r = run_json(bare, RunOptions(time_cap_s=1.0, max_blocks=32, timeout_s=300))
    assert r["status"] == "fail" and r["correctness"]["mode"] == "byte-exact", r



def test_exact_candidate_stays_byte_exact(lab):
    out = lab["dir"] / "H-exact"
    h, proposal = pair_with_proposal(lab["snap"], out, runs=3,
                                     plan=_plan(lab, "kp_fused"))
    assert h.policy.mode == "byte-exact" and not h.policy.tolerances
    assert proposal.notes == () and "byte for byte over 5 runs" in h.policy.note
    assert Harness.open(out).policy == h.policy


def test_wrong_candidate_is_refused_over_the_ceiling(lab):
    out = lab["dir"] / "H-scaled"
    proc = _kpair("pair", str(lab["snap"]), "--plan", str(_plan(lab, "kp_fused_scaled")),
                  "--propose-policy", "--propose-runs", "2", "-o", str(out))
    assert proc.returncode == 4, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "region 'out'" in lines[0] and "max |opt-ref|" in lines[0]
    assert "over the ceiling (atol 0.01, rtol 0.01)" in lines[0]
    assert not out.exists()
    # A looser ceiling the user states admits it (and says so in the policy).
    h, _ = pair_with_proposal(lab["snap"], out, runs=2, ceiling=(1.0, 0.1),
                              plan=_plan(lab, "kp_fused_scaled"))
    (tol,) = h.policy.tolerances
    assert tol.rtol <= 0.1 and tol.atol <= 1.0 and "ceiling atol 1, rtol 0.1" in h.policy.note


def test_tuning_options_need_propose_policy(lab):
    proc = _kpair("pair", str(lab["snap"]), "--plan", str(_plan(lab, "kp_fused")),
                  "--max-atol", "1e-3", "-o", str(lab["dir"] / "H-x"))
    assert proc.returncode == 2 and "go with --propose-policy" in proc.stderr


# ---------------------------------------------------------------- the pure proposal


def _f32(x) -> bytes:
    return np.asarray(x, np.float32).tobytes()


def test_proposal_is_the_tightest_grid_point_with_margin():
    want = np.linspace(1.0, 2.0, 64).astype(np.float32)
    got = want * np.float32(1 + 1e-5)   # a relative error of 1e-5: rtol-shaped
    obs = Observed([RegionSpec("y", 256, "float32", True), RegionSpec("x", 256, "float32",
                                                                      False)])
    obs.add("run 1", {"y": _f32(want), "x": _f32(want)}, {"y": _f32(got), "x": _f32(want)})
    p = propose(obs)
    (tol,) = p.policy.tolerances
    w = want.astype(np.float64)
    d = np.abs(got.astype(np.float64) - w)
    # Every element passes with margin 4 ...
    assert np.all(4 * d <= tol.atol + tol.rtol * w)
    # ... and the bound is no wider on average than the pure-rtol one a grid step (10^0.25)
    # above the observed relative error.
    rel = float(np.max(d / w))
    assert tol.atol + tol.rtol * w.mean() <= 4 * 10 ** 0.25 * rel * w.mean()
    assert tol.atol + tol.rtol * w.mean() >= 4 * float(d.mean()) * 0.999
    assert tol.region == "y"   # x never differed: byte-exact


@pytest.mark.parametrize("case,message", [
    ("input", "which the range does not write"),
    ("nan", "a NaN or infinity on one side"),
    ("int", "not a float region (int32)"),
    ("span", "outside its declared outputs, bytes [10, 11)"),
])
def test_proposal_refuses_what_no_tolerance_covers(case, message):
    want = np.arange(1, 5, dtype=np.float32)
    got = want.copy()
    spec = RegionSpec("y", 16, "float32", True)
    if case == "input":
        spec = RegionSpec("y", 16, "float32", False)
        got[0] += 1e-6
    elif case == "nan":
        got[1] = np.nan
    elif case == "int":
        spec = RegionSpec("y", 16, "int32", True)
        got[2] = 7
    else:
        spec = RegionSpec("y", 16, "float32", True, ((0, 8),))
        got[2] += 1
    obs = Observed([spec])
    obs.add("run 1", {"y": _f32(want)}, {"y": _f32(got)})
    with pytest.raises(ToleranceOverCeiling, match=message.replace("[", r"\[").replace(
            "(", r"\(").replace(")", r"\)")):
        propose(obs)


def test_one_dispatch_with_a_same_layout_opt(lab, matmul_libs, tmp_path):
    """A single dispatch (regions without roles): the written region is found from the
    captured post-state; the read-only inputs stay byte-exact."""
    from conftest import record_matmul

    snap = record_matmul(matmul_libs["naive"], tmp_path / "s", n=32)
    proc = _kpair("pair", str(snap), "--opt", str(lab["cand"]), "--opt-kernel",
                  "kp_matmul_reassoc", "--propose-policy", "--propose-runs", "3",
                  "-o", str(tmp_path / "H"))
    assert proc.returncode == 0, proc.stderr
    assert "proposed policy: region 'c'[0:4096) as float32: differs in" in proc.stdout
    h = Harness.open(tmp_path / "H")
    assert [t.region for t in h.policy.tolerances] == ["c"]
    r = run_json(h.root, RunOptions(time_cap_s=1.0, max_blocks=32, timeout_s=300))
    assert r["status"] == "pass", r.get("correctness") or r.get("error")


def test_policy_propose_on_an_existing_harness(lab, tmp_path):
    from kpair.harness import create_harness

    h = create_harness(lab["snap"], tmp_path / "H", plan=_plan(lab, "kp_fused_reassoc"))
    proc = _kpair("policy", "propose", str(h.root), "--runs", "2", "--json",
                  "-o", str(tmp_path / "p.json"))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["regions"][0]["region"] == "out" and doc["out"] == str(tmp_path / "p.json")
    saved = json.loads((tmp_path / "p.json").read_text())
    assert saved == doc["policy"] and saved["tolerances"][0]["criterion"] == "allclose"
    proc = _kpair("policy", "propose", str(h.root), "--runs", "2", "--max-rtol", "0",
                  "--max-atol", "1e-9", "--json")
    assert proc.returncode == 4 and json.loads(proc.stdout)["exit_code"] == 4
    assert "region 'out'" in json.loads(proc.stdout)["error"]["message"]


def test_captured_candidate_gets_its_policy(lab, tmp_path):
    """``--opt-capture``: the candidate range is bound once; the harness made again under the
    proposed policy keeps the bound plan (its note lists the bindings)."""
    rng = np.random.default_rng(5)
    a, b = (rng.standard_normal((N, N), dtype=np.float32) for _ in range(2))
    bias = rng.standard_normal(N, dtype=np.float32)
    out, out2, row = np.zeros((N, N), np.float32), np.zeros((N, N), np.float32), \
        np.zeros(N, np.float32)
    with Recorder(tmp_path / "ref", names={"a": a, "b": b, "bias": bias, "out": out},
                  outputs=[out]) as r:
        r.call(lab["ops"], "kp_matmul", [a, b, out, np.int32(N)])
        r.call(lab["ops"], "kp_bias", [out, bias, np.int32(N)])
        r.call(lab["ops"], "kp_relu", [out, np.int32(N)])
    with Recorder(tmp_path / "cand", names={"a": a, "b": b, "bias": bias, "out2": out2,
                                            "row": row}, outputs=[out2], scratch=[row]) as r:
        r.call(lab["cand"], "kp_fused_reassoc", [np.int32(N), bias, a, b, out2, row])
    assert not np.array_equal(out, out2)   # it really rounds differently
    proc = _kpair("pair", str(tmp_path / "ref"), "--opt-capture", str(tmp_path / "cand"),
                  "--propose-policy", "--propose-runs", "2", "-o", str(tmp_path / "H"))
    assert proc.returncode == 0, proc.stderr
    h = Harness.open(tmp_path / "H")
    assert [t.region for t in h.policy.tolerances] == ["out"]
    assert "out2 -> out (declared output)" in h.plan.note, h.plan.note
    r = run_json(h.root, RunOptions(time_cap_s=1.0, max_blocks=32, timeout_s=300))
    assert r["status"] == "pass", r.get("correctness") or r.get("error")


def test_a_smaller_margin_where_only_that_fits_under_the_ceiling():
    want = np.linspace(1.0, 2.0, 64).astype(np.float32)
    got = want * np.float32(1.004)   # 4e-3 relative: x4 would be 1.6e-2, over 1e-2
    obs = Observed([RegionSpec("y", 256, "float32", True)])
    obs.add("run 1", {"y": _f32(want)}, {"y": _f32(got)})
    p = propose(obs)
    (tol,) = p.policy.tolerances
    assert tol.atol <= 1e-2 and tol.rtol <= 1e-2
    w, g = want.astype(np.float64), got.astype(np.float64)
    assert np.all(np.abs(g - w) <= tol.atol + tol.rtol * w)   # every element still passes
    assert 1 <= p.details[0]["margin"] < 4 and "the ceiling allows no more" in p.notes[0]
    # Over the ceiling altogether: refused, naming the region and the measured error.
    obs = Observed([RegionSpec("y", 256, "float32", True)])
    obs.add("run 1", {"y": _f32(want)}, {"y": _f32(want * np.float32(1.03))})
    with pytest.raises(ToleranceOverCeiling, match=r"region 'y'\[0:256\) as float32: max "
                       r"\|opt-ref\| 0\.06.*over the ceiling \(atol 0\.01, rtol 0\.01\)"):
        propose(obs)
