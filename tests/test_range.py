"""Ranges on the host backend: three C functions (matmul, bias, ReLU) recorded as one range,
replayed byte-exact, and judged against launch plans of functions with their own signature
(tests/csrc/range_ops.c): the honest fused one passes and is faster, bad plans are refused by
``kpair pair`` before anything is written, cheats fail by a named check."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import CSRC, run_json
from kpair.backends import open_device
from kpair.errors import AbiMismatch, SymbolNotFound, UsageError
from kpair.harness import create_harness
from kpair.pipeline import RunOptions
from kpair.record import Recorder, record_call, record_range
from kpair.replay import reproduce
from kpair.snapshot import Manifest, Snapshot
from kpair.toolchain import compile_shared

N = 256   # naive matmul walks b's columns 1 KiB apart: the fused i-k-j is clearly cheaper


def _inputs(n: int = N, seed: int = 0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    return a, b, bias, np.zeros((n, n), np.float32)


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("range")
    lib = compile_shared(CSRC / "range_ops.c", d / "ops.so", flags=("-O2", "-g"))
    a, b, bias, out = _inputs()
    with Recorder(d / "snap", names={"a": a, "b": b, "bias": bias, "out": out},
                  outputs=[out]) as r:
        r.call(lib, "kp_matmul", [a, b, out, np.int32(N)])
        r.call(lib, "kp_bias", [out, bias, np.int32(N)])
        r.call(lib, "kp_relu", [out, np.int32(N)])
    return {"dir": d, "lib": lib, "snap": d / "snap", "out": out, "inputs": (a, b, bias)}


def _plan(kernel: str = "kp_fused", **change) -> dict:
    plan = {"schema": "kpair.plan", "schema_version": 1,
            "scratch": [{"name": "row", "size": N * 4}],
            "launches": [{"code": "ops.so", "kernel": kernel, "args": [
                {"bind": "scalar", "kind": "i32", "value": N},
                {"bind": "region", "name": "bias"}, {"bind": "region", "name": "a"},
                {"bind": "region", "name": "b"},
                {"bind": "region", "name": "out", "access": "write"},
                {"bind": "scratch", "name": "row"}]}]}
    for key, value in change.items():
        plan[key] = value
    return plan


def _write_plan(lab: dict, name: str, plan: dict) -> Path:
    d = lab["dir"] / f"plan-{name}"
    d.mkdir(exist_ok=True)
    (d / "ops.so").write_bytes(lab["lib"].read_bytes())
    (d / "opt.plan.json").write_text(json.dumps(plan))
    return d / "opt.plan.json"


def _kpair(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kpair", *args], capture_output=True,
                          text=True, timeout=300)


# ---------------------------------------------------------------- record and replay


def test_range_snapshot_roles_scratch_and_results(lab, tmp_path):
    m = Snapshot.open(lab["snap"]).manifest
    assert m.is_range and [op.code.kernel_name for op in m.operations] == \
        ["kp_matmul", "kp_bias", "kp_relu"]
    assert {r.name: r.role for r in m.regions} == {"a": "in", "b": "in", "bias": "in",
                                                   "out": "out"}
    a, b, bias = lab["inputs"]
    np.testing.assert_allclose(lab["out"], np.maximum(a @ b + bias, 0), rtol=1e-4, atol=1e-4)
    # Strict reader round trip; the first op is the top-level dispatch.
    again = Manifest.from_json(m.to_json())
    assert again == m and again.operations[0].code == m.code
    # Scratch: a size, no bytes; an unwritten array without outputs= is "inout" when changed.
    x, y = np.ones(8, np.float32), np.ones(8, np.float32)
    tmp = np.zeros(8, np.float32)
    s = record_range([(lab["lib"], "kp_bias", [x.copy(), y, np.int32(1)])], tmp_path / "one")
    assert s.manifest.is_range and len(s.manifest.operations) == 1
    s2 = record_range([(lab["lib"], "kp_relu", [tmp, np.int32(2)]),
                       (lab["lib"], "kp_bias", [x, y, np.int32(1)])], tmp_path / "sc",
                      scratch=[tmp])
    assert [sc.size for sc in s2.manifest.scratch_regions] == [32]
    assert {r.role for r in s2.manifest.regions} == {"inout", "in"}
    assert len(s2.manifest.regions) == 2


def test_record_call_writes_no_range_fields(lab, tmp_path):
    a, b, bias, out = _inputs(8)
    s = record_call(lab["lib"], "kp_bias", [out, bias, np.int32(8)], tmp_path / "s")
    doc = json.loads((tmp_path / "s" / "snapshot.json").read_text())
    assert "ops" not in doc and "scratch" not in doc
    assert all("role" not in r for r in doc["regions"])
    assert not s.manifest.is_range and len(s.manifest.operations) == 1


def test_record_range_refuses_misuse(lab, tmp_path):
    a, b, bias, out = _inputs(8)
    with pytest.raises(UsageError, match="at least one call"):
        record_range([], tmp_path / "x")
    with pytest.raises(UsageError, match="passed to no call"):
        record_range([(lab["lib"], "kp_relu", [out, np.int32(8)])], tmp_path / "y",
                     scratch=[a])
    with pytest.raises(UsageError, match="bare Python int"):
        record_range([(lab["lib"], "kp_relu", [out, 8])], tmp_path / "z")
    assert not (tmp_path / "x").exists() and not (tmp_path / "z").exists()


def test_range_replays_byte_exact(lab):
    with open_device("host") as dev:
        rep = reproduce(dev, Snapshot.open(lab["snap"]), 3)
    assert rep.status == "byte-exact" and rep.ops == 3
    assert rep.kernel == "kp_matmul ; kp_bias ; kp_relu"
    proc = _kpair("replay", str(lab["snap"]), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["status"] == "byte-exact" and doc["ops"] == 3


def test_range_replay_mismatch_is_reported(lab, tmp_path):
    """A range whose captured post-state is not what its ops give: mismatch, exit 1."""
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(lab["snap"], bad)
    doc = json.loads((bad / "snapshot.json").read_text())
    out = next(r for r in doc["regions"] if r["name"] == "out")
    a = next(r for r in doc["regions"] if r["name"] == "a")
    out["post"] = a["pre"]   # a blob of the right size that the range does not produce
    (bad / "snapshot.json").write_text(json.dumps(doc))
    proc = _kpair("replay", str(bad), "--json")
    assert proc.returncode == 1 and json.loads(proc.stdout)["status"] == "mismatch"


# ---------------------------------------------------------------- plans refused at pair time


def _bad_plans() -> list[tuple[str, dict, int, str]]:
    """(case, plan, exit code, a piece of the message naming the fault)."""
    out = []

    def launch_args(plan):
        return plan["launches"][0]["args"]

    p = _plan()
    launch_args(p).pop()
    out.append(("count", p, 4, "takes 6 parameters"))
    p = _plan()
    launch_args(p)[0] = {"bind": "scalar", "kind": "f32", "value": 1.0}
    out.append(("type", p, 4, "is i32, the plan passes f32"))
    p = _plan()
    launch_args(p)[0] = {"bind": "scalar", "kind": "i64", "value": N}
    out.append(("size", p, 4, "is 4 bytes, the plan passes a i64"))
    p = _plan()
    launch_args(p)[1] = {"bind": "scalar", "kind": "u64", "value": 0}
    out.append(("pointer-as-scalar", p, 4, "is a pointer, the plan passes a u64 scalar"))
    p = _plan()
    launch_args(p)[0] = {"bind": "region", "name": "a"}
    out.append(("scalar-as-pointer", p, 4, "is i32, the plan passes the address of region"))
    p = _plan()
    launch_args(p)[2] = {"bind": "region", "name": "c"}
    out.append(("unknown-region", p, 3, "the range has no region 'c'"))
    p = _plan()
    launch_args(p)[5] = {"bind": "scratch", "name": "tmp"}
    out.append(("undeclared-scratch", p, 3, "scratch buffer 'tmp' is not declared"))
    p = _plan(scratch=[{"name": "row", "size": 16}])
    launch_args(p)[5] = {"bind": "scratch", "name": "row", "bytes": N * 4}
    out.append(("scratch-too-small", p, 3, "past the end of scratch buffer 'row' (16 bytes)"))
    p = _plan()
    launch_args(p)[2] = {"bind": "region", "name": "a", "access": "write"}
    out.append(("writes-live-in", p, 3, "region 'a' is live-in"))
    p = _plan()
    launch_args(p)[4] = {"bind": "region", "name": "out", "access": "write",
                         "offset": 4, "bytes": N * N * 4}
    out.append(("out-of-bounds", p, 3, "past the end of region 'out'"))
    p = _plan()
    launch_args(p)[4] = {"bind": "region", "name": "out", "offset": N * N * 4,
                         "access": "write"}
    out.append(("offset-past-end", p, 3, "is past the end of region 'out'"))
    p = _plan()
    launch_args(p)[4] = {"bind": "region", "name": "out"}
    out.append(("output-unbound", p, 3, "'out', which no launch of the plan binds for writing"))
    p = _plan(scratch=[{"name": "a", "size": 64}])
    out.append(("scratch-named-like-region", p, 3, "is named like a region"))
    out.append(("unknown-kernel", _plan("kp_fusedd"), 4, "'kp_fusedd' is not exported"))
    p = _plan()
    p["launches"][0]["code"] = "missing.so"
    out.append(("missing-code", p, 3, "missing.so: no such file"))
    p = _plan()
    launch_args(p)[0] = {"bind": "scalar", "kind": "i32", "value": 2 ** 31}
    out.append(("scalar-overflow", p, 3, "does not fit a i32"))
    return out


@pytest.mark.parametrize("case,plan,code,message", _bad_plans(),
                         ids=[c[0] for c in _bad_plans()])
def test_bad_plan_refused_before_anything_is_written(lab, case, plan, code, message):
    path = _write_plan(lab, case, plan)
    out = lab["dir"] / f"H-{case}"
    proc = _kpair("pair", str(lab["snap"]), "--plan", str(path), "-o", str(out))
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_at_least_ten_bad_plans():
    assert len(_bad_plans()) >= 10


def test_pair_refuses_opt_on_a_range_and_ref_on_a_range(lab):
    with pytest.raises(UsageError, match="launch plan"):
        create_harness(lab["snap"], lab["dir"] / "H-opt", opt=lab["lib"])
    with pytest.raises(UsageError, match="one of them"):
        create_harness(lab["snap"], lab["dir"] / "H-none")
    assert not (lab["dir"] / "H-opt").exists()


# ---------------------------------------------------------------- judged


def test_fused_plan_passes_and_is_faster(lab):
    path = _write_plan(lab, "fused", _plan())
    proc = _kpair("pair", str(lab["snap"]), "--plan", str(path), "-o",
                  str(lab["dir"] / "H-fused"), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["range_ops"] == 3 and doc["plan_launches"] == 1
    r = run_json(lab["dir"] / "H-fused", RunOptions(time_cap_s=10.0, timeout_s=300))
    assert r["status"] == "pass", r.get("correctness") or r.get("error")
    assert r["replay"]["range_ops"] == 3 and r["replay"]["plan_launches"] == 1
    assert r["opt"]["binary"] == "plan/opt.plan.json"
    # Faster by the estimate (about 2x on an idle machine); the interval, systematic offset
    # folded in, reached [0.93, 2.38] on a loaded 2-core CI machine, so it is not asserted.
    assert r["speed"]["speedup"] > 1.0, r["speed"]
    assert all(t["passed"] is not False for t in r["trust"].values())


@pytest.mark.parametrize("kernel,check", [
    ("kp_fused_skip", "poisoned_outputs"),   # the output left stale: the poison shows
    ("kp_fused_memo", "differential"),       # the first answer replayed: mutated inputs
    ("kp_fused_clobber", "input_integrity"),  # writes the live-in region a
    ("kp_fused_open", "refused_calls"),      # opens a file: the host sandbox refuses it
])
def test_cheats_on_a_range_fail(lab, kernel, check):
    plan = _plan(kernel)
    if kernel == "kp_fused_clobber":
        # Declared honestly as a write of a: refused at pair time (live-in) ...
        plan["launches"][0]["args"][2] = {"bind": "region", "name": "a", "access": "write"}
        path = _write_plan(lab, kernel + "-declared", plan)
        proc = _kpair("pair", str(lab["snap"]), "--plan", str(path), "-o",
                      str(lab["dir"] / f"H-{kernel}-declared"))
        assert proc.returncode == 3 and "live-in" in proc.stderr
        plan = _plan(kernel)   # ... and bound as a read: the run catches the write
    path = _write_plan(lab, kernel, plan)
    h = create_harness(lab["snap"], lab["dir"] / f"H-{kernel}", plan=path)
    r = run_json(h.root, RunOptions(time_cap_s=2.0, max_blocks=32, timeout_s=300))
    assert r["status"] == "fail", r.get("correctness")
    c = r["correctness"]
    assert c.get("failed_check") == check, c
    assert r["trust"][check]["passed"] is False
    assert r.get("speed") is None   # no speed is reported for a failed candidate


def test_range_harness_tampered_plan_is_refused(lab, tmp_path):

    path = _write_plan(lab, "tamper", _plan())
    h = create_harness(lab["snap"], tmp_path / "H", plan=path)
    doc = json.loads((h.root / "plan" / "opt.plan.json").read_text())
    bad = copy.deepcopy(doc)
    bad["launches"][0]["args"][0]["value"] = N + 1
    (h.root / "plan" / "opt.plan.json").write_text(json.dumps(bad))
    proc = _kpair("run", str(h.root))
    assert proc.returncode == 3 and "does not match its sha256" in proc.stdout + proc.stderr


def test_scratch_is_poisoned_on_every_replay(lab, tmp_path):
    """A range that reads its scratch before writing it depends on bytes nobody stored:
    each replay fills the scratch with a fresh random word, so its runs disagree."""
    x, tmp = np.zeros(4, np.float32), np.ones(4, np.float32)
    snap = record_range([(lab["lib"], "kp_bias", [x, tmp, np.int32(1)])], tmp_path / "s",
                        scratch=[tmp])
    assert [r.name for r in snap.manifest.regions] == ["buf0"]
    with open_device("host") as dev:
        rep = reproduce(dev, snap, 4)
    assert rep.status == "nondeterministic" and rep.unstable_regions == ["buf0"]


def test_plan_runs_relocated_and_inspect_shows_the_range(lab, tmp_path):
    """Relocated placement: the range's kernargs are patched, the plan's built from the
    placed addresses; the verdict is the same."""
    from kpair.describe import describe

    path = _write_plan(lab, "reloc", _plan())
    h = create_harness(lab["snap"], tmp_path / "H", plan=path)
    r = run_json(h.root, RunOptions(relocate=True, time_cap_s=1.0, max_blocks=32,
                                    control=False, timeout_s=300))
    assert r["status"] == "pass", r.get("correctness") or r.get("error")
    assert r["replay"]["mode"] != "captured" and r["replay"]["range_ops"] == 3
    info, text = describe(h.root, verify=False)
    assert "range    3 operations: kp_matmul ; kp_bias ; kp_relu" in text
    assert "out" in text and "(out)" in text


def test_same_layout_candidate_on_a_range_is_refused(lab, tmp_path):
    from kpair.pipeline import Candidate, Facts, close, evaluate, prepare

    h = create_harness(lab["snap"], tmp_path / "H", plan=_write_plan(lab, "same", _plan()))
    run, failed = prepare(h.root, RunOptions(checks=False),
                          facts=Facts(harness=str(h.root), started="now"))
    try:
        assert failed is None
        with pytest.raises(UsageError, match="judged against a launch plan"):
            evaluate(run, Candidate(lab["lib"].read_bytes(), "kp_matmul", "elf-so"))
    finally:
        close(run)


def test_cuda_plan_is_checked_against_the_cubin_layout(tmp_path):
    """A plan of a cubin (tests/data/kp_add_sm90.cubin) is checked on the CPU against the
    cubin's own .nv.info layout: sizes only (kinds unknown), the symbol must be there."""
    import shutil

    from kpair.harness import load_plan
    from kpair.plan import PlanError
    from kpair.snapshot import BlobRef, CodeObject, Kernarg, Launch, Param, Region

    def blob(n):
        return BlobRef("blobs/x.zst", n, "0" * 64)

    regions = tuple(Region(name, 0x1000 + 0x2000 * i, 4096, blob(4096), blob(4096),
                           role="out" if name == "c" else "in")
                    for i, name in enumerate("abc"))
    m = Manifest(backend="cuda", arch="sm_90", code=CodeObject(blob(10), "cubin", "kp_add"),
                 launch=Launch(), kernarg=Kernarg(blob(28), (
                     Param(0, 8, "pointer"), Param(8, 8, "pointer"), Param(16, 8, "pointer"),
                     Param(24, 4, "i32"))), regions=regions)
    shutil.copy(Path(__file__).parent / "data" / "kp_add_sm90.cubin", tmp_path / "k.cubin")
    args = [{"bind": "region", "name": "a"}, {"bind": "region", "name": "b"},
            {"bind": "region", "name": "c", "access": "write"},
            {"bind": "scalar", "kind": "i32", "value": 1024}]

    def check(kernel="kp_add", bound=args):
        plan = {"schema": "kpair.plan", "schema_version": 1, "launches": [
            {"code": "k.cubin", "kernel": kernel, "grid": [4, 1, 1], "block": [256, 1, 1],
             "args": bound}]}
        (tmp_path / "opt.plan.json").write_text(json.dumps(plan))
        return load_plan(tmp_path / "opt.plan.json", m)

    _, _, layouts = check()
    assert [(p.offset, p.size) for p in layouts[0]] == [(0, 8), (8, 8), (16, 8), (24, 4)]
    with pytest.raises(AbiMismatch, match="takes 4 parameters"):
        check(bound=args[:3])
    with pytest.raises(AbiMismatch, match="is 4 bytes, the plan passes a i64"):
        check(bound=[*args[:3], {"bind": "scalar", "kind": "i64", "value": 1}])
    with pytest.raises(AbiMismatch, match="is 4 bytes, the plan passes the address"):
        check(bound=[*args[:3], {"bind": "region", "name": "a"}])
    with pytest.raises(PlanError, match="region 'a' is live-in"):
        check(bound=[{"bind": "region", "name": "a", "access": "write"}, *args[1:]])
    with pytest.raises(SymbolNotFound, match="'kp_addd' is not in the cubin"):
        check(kernel="kp_addd")


def test_range_of_two_code_objects(lab, matmul_libs, tmp_path):
    """Operations from different shared objects: each stored and loaded from its own blob."""
    a, b, bias, out = _inputs(32)
    snap = record_range([(matmul_libs["fast"], "kp_matmul", [a, b, out, np.int32(32)]),
                         (lab["lib"], "kp_bias", [out, bias, np.int32(32)])], tmp_path / "s",
                        names={"a": a, "b": b, "bias": bias, "out": out})
    ops = snap.manifest.operations
    assert ops[0].code.blob.sha256 != ops[1].code.blob.sha256
    assert {r.name: r.role for r in snap.manifest.regions}["out"] == "inout"
    np.testing.assert_allclose(out, a @ b + bias, rtol=1e-4, atol=1e-4)
    assert snap.verify() > 0
    with open_device("host") as dev:
        assert reproduce(dev, snap, 2).status == "byte-exact"


def test_plan_scratch_too_small_is_caught_by_its_guard_band(lab, tmp_path):
    """A scratch buffer declared smaller than the launch uses (no ``bytes`` said, so pairing
    cannot tell): the writes past its end land in its guard band and fail the run."""
    plan = _plan(scratch=[{"name": "row", "size": N * 4 - 64}])
    h = create_harness(lab["snap"], tmp_path / "H", plan=_write_plan(lab, "small", plan))
    r = run_json(h.root, RunOptions(time_cap_s=1.0, max_blocks=32, control=False,
                                    timeout_s=300))
    assert r["status"] == "fail"
    assert r["correctness"]["failed_check"] == "guard_bands", r["correctness"]
    assert "scratch:row" in r["correctness"]["summary"]


def test_policy_suggest_replays_the_whole_range(lab, tmp_path):
    from kpair.harness import ref_spread

    h = create_harness(lab["snap"], tmp_path / "H", plan=_write_plan(lab, "sug", _plan()))
    spread, _ = ref_spread(h.root, 2)
    # ref's runs are the range's answer (matmul + bias + ReLU), not its first operation's.
    out = next(i for i, r in enumerate(h.snapshot.manifest.regions) if r.name == "out")
    assert spread.runs == 2
    assert spread.regions["out"].first == h.snapshot.post(out)
    assert not spread.unchanged["out"] and spread.unchanged["a"]


def test_plan_on_a_single_dispatch(lab, tmp_path):
    """One recorded dispatch is the one-operation target: written regions are inout, the
    others in; a one-launch plan of the same function passes."""
    n = 64
    a, b, _, c = _inputs(n)
    record_call(lab["lib"], "kp_matmul", [a, b, c, np.int32(n)], tmp_path / "s",
                names=["a", "b", "c", "n"])
    plan = {"schema": "kpair.plan", "schema_version": 1, "launches": [{
        "code": "ops.so", "kernel": "kp_matmul", "args": [
            {"bind": "region", "name": "a"}, {"bind": "region", "name": "b"},
            {"bind": "region", "name": "c", "access": "write"},
            {"bind": "scalar", "kind": "i32", "value": n}]}]}
    h = create_harness(tmp_path / "s", tmp_path / "H", plan=_write_plan(lab, "single", plan))
    assert h.kind == {"plan_launches": 1}
    r = run_json(h.root, RunOptions(time_cap_s=1.0, max_blocks=32, control=False,
                                    timeout_s=300))
    assert r["status"] == "pass", r.get("correctness") or r.get("error")
    assert r["replay"]["plan_launches"] == 1 and "range_ops" not in r["replay"]


def test_three_launch_plan_runs_in_order(lab, tmp_path):
    """A plan of several launches runs them in order on the same placed regions; the
    same three in another order (ReLU before bias) gives another answer and fails."""
    def launches(order):
        calls = {"mm": {"code": "ops.so", "kernel": "kp_matmul", "args": [
                     {"bind": "region", "name": "a"}, {"bind": "region", "name": "b"},
                     {"bind": "region", "name": "out", "access": "write"},
                     {"bind": "scalar", "kind": "i32", "value": N}]},
                 "bias": {"code": "ops.so", "kernel": "kp_bias", "args": [
                     {"bind": "region", "name": "out", "access": "readwrite"},
                     {"bind": "region", "name": "bias"},
                     {"bind": "scalar", "kind": "i32", "value": N}]},
                 "relu": {"code": "ops.so", "kernel": "kp_relu", "args": [
                     {"bind": "region", "name": "out", "access": "readwrite"},
                     {"bind": "scalar", "kind": "i32", "value": N}]}}
        return {"schema": "kpair.plan", "schema_version": 1,
                "launches": [calls[k] for k in order]}

    opts = RunOptions(time_cap_s=1.0, max_blocks=32, control=False, timeout_s=300)
    good = create_harness(lab["snap"], tmp_path / "G", plan=_write_plan(
        lab, "three", launches(["mm", "bias", "relu"])))
    r = run_json(good.root, opts)
    assert r["status"] == "pass", r.get("correctness") or r.get("error")
    assert r["replay"]["plan_launches"] == 3
    bad = create_harness(lab["snap"], tmp_path / "B", plan=_write_plan(
        lab, "swapped", launches(["mm", "relu", "bias"])))
    r = run_json(bad.root, opts)
    assert r["status"] == "fail"
    assert any(g["region"] == "out" and not g["passed"] for g in r["correctness"]["regions"])


def test_an_output_that_already_held_its_answer_is_judged_as_an_output(lab, tmp_path):
    """A second pass over the same tensors (a warm-up ran first) leaves ref's output bytes as
    they were, and a region known only as bytes gets no float poison of its own: capture's
    role ``out`` alone makes it ref's output. The honest fused plan passes (it was taken for
    an input and failed ``input_integrity`` once mutated inputs changed what it writes); one
    that leaves the output stale fails."""
    a, b, bias = lab["inputs"]
    raw = np.zeros(N * N * 4, np.uint8)   # no dtype the judge could poison it by
    for snap in (tmp_path / "warm-up", tmp_path / "warm"):   # the second finds the answer
        with Recorder(snap, names={"a": a, "b": b, "bias": bias, "out": raw},
                      outputs=[raw]) as r:
            r.call(lab["lib"], "kp_matmul", [a, b, raw, np.int32(N)])
            r.call(lab["lib"], "kp_bias", [raw, bias, np.int32(N)])
            r.call(lab["lib"], "kp_relu", [raw, np.int32(N)])
    m = Snapshot.open(snap).manifest
    region = next(x for x in m.regions if x.name == "out")
    assert region.role == "out" and region.dtype not in ("float32", None)
    assert region.pre.sha256 == region.post.sha256   # ref leaves its bytes as they were
    for kernel, status in (("kp_fused", "pass"), ("kp_fused_skip", "fail")):
        h = create_harness(snap, tmp_path / f"H-{kernel}",
                           plan=_write_plan(lab, f"warm-{kernel}", _plan(kernel)))
        r = run_json(h.root, RunOptions(time_cap_s=1.0, max_blocks=32, timeout_s=300))
        assert r["status"] == status, (kernel, r.get("correctness"), r.get("error"))
        if status == "pass":
            assert "out" not in r["trust"]["input_integrity"]["finding"]["inputs"]


def test_a_workspace_ref_writes_only_on_mutated_inputs_is_not_an_input(lab, tmp_path):
    """A library workspace (cuBLAS's split-K partials) that a second pass over the same
    arrays leaves as it was: capture calls it live-in, yet ref writes it as soon as its
    inputs change. The candidate that writes it exactly as ref does passes (it failed
    ``input_integrity`` on the mutated inputs before); the workspace is judged against ref's
    answer there, as an output, and never kept as an input."""
    a, b, bias = lab["inputs"]
    out = np.zeros((N, N), np.float32)
    ws = np.zeros(N * 4, np.uint8)   # bytes to the judge, as a GPU capture knows a workspace
    for snap in (tmp_path / "warm-up", tmp_path / "ws"):   # the second finds ws as it leaves it
        with Recorder(snap, names={"a": a, "b": b, "bias": bias, "out": out, "ws": ws},
                      outputs=[out]) as r:
            r.call(lab["lib"], "kp_matmul_ws", [a, b, out, ws, np.int32(N)])
            r.call(lab["lib"], "kp_bias", [out, bias, np.int32(N)])
            r.call(lab["lib"], "kp_relu", [out, np.int32(N)])
    roles = {x.name: x.role for x in Snapshot.open(snap).manifest.regions}
    assert roles["ws"] == "in"
    for kernel, status in (("kp_fused_wsp", "pass"), ("kp_fused_wsx", "fail")):
        plan = _plan(kernel)
        plan["launches"][0]["args"].append({"bind": "region", "name": "ws"})   # as a read
        h = create_harness(snap, tmp_path / f"H-{kernel}", plan=_write_plan(lab, kernel, plan))
        r = run_json(h.root, RunOptions(time_cap_s=1.0, max_blocks=32, timeout_s=300))
        assert r["status"] == status, (kernel, r.get("correctness"), r.get("error"))
        assert "ws" not in r["trust"]["input_integrity"]["finding"]["inputs"]
