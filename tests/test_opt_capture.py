"""``kpair pair SNAP --opt-capture SNAP2`` on the host backend: two ranges recorded in this
process over the same numpy arrays — ref = matmul, bias, ReLU (tests/csrc/range_ops.c), the
candidate = the one fused function writing another output array — bound region by region
(``kpair.bind``) into a raw-kernarg plan that passes and is faster; refusals name the region
and why; relocations are checked like named parameters; PTX and fatbin plans get their
layouts from the code object without a GPU."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import CSRC, range_arrays, record_mlp_range, run_json
from kpair.bind import BindError, bind_capture
from kpair.errors import AbiMismatch, SymbolNotFound
from kpair.harness import fatbin_members, load_plan
from kpair.pipeline import RunOptions
from kpair.plan import PlanError
from kpair.record import Recorder
from kpair.snapshot import Param, Snapshot
from kpair.toolchain import compile_shared

N = 256
DATA = Path(__file__).parent / "data"


def _kpair(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kpair", *args], capture_output=True,
                          text=True, timeout=300)


def _record_ref(lib: Path, x: dict, out: Path, n: int) -> Snapshot:
    return record_mlp_range(lib, out, x, n)


def _record_fused(lib: Path, x: dict, out: Path, n: int, *, a=None, outputs=True,
                  scratch=True) -> Snapshot:
    a = x["a"] if a is None else a
    x["out2"][...] = 0   # an output written again with the same bytes would be live-in
    names = {"a": a, "b": x["b"], "bias": x["bias"], "out2": x["out2"], "row": x["row"]}
    with Recorder(out, names=names, outputs=[x["out2"]] if outputs else [],
                  scratch=[x["row"]] if scratch else []) as r:
        r.call(lib, "kp_fused", [np.int32(n), x["bias"], a, x["b"], x["out2"], x["row"]])
    return r.snapshot


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("optcap")
    lib = compile_shared(CSRC / "range_ops.c", d / "ops.so", flags=("-O2", "-g"))
    x = range_arrays(N)
    ref = _record_ref(lib, x, d / "ref", N)
    cand = _record_fused(lib, x, d / "cand", N)
    np.testing.assert_array_equal(x["out"], x["out2"])   # both really ran
    return {"dir": d, "lib": lib, "x": x, "ref": ref, "cand": cand}


@pytest.fixture(scope="module")
def small(tmp_path_factory, lab) -> dict:
    """A small ref range for the refusals (each records its own candidate)."""
    d = tmp_path_factory.mktemp("optcap-small")
    x = range_arrays(16, seed=1)
    return {"dir": d, "lib": lab["lib"], "x": x, "ref": _record_ref(lab["lib"], x, d / "ref",
                                                                     16)}


def test_bind_maps_every_region(lab):
    bound = bind_capture(lab["ref"], lab["cand"])
    got = {b.region: (b.to, b.name, b.offset, b.why) for b in bound.bindings}
    assert got == {"a": ("region", "a", 0, "same memory, same bytes"),
                   "b": ("region", "b", 0, "same memory, same bytes"),
                   "bias": ("region", "bias", 0, "same memory, same bytes"),
                   "out2": ("region", "out", 0, "declared output"),
                   "row": ("scratch", "row", 0, "scratch of SNAP2")}
    (launch,) = bound.plan.launches
    assert launch.raw and launch.kernel == "kp_fused" and not launch.args
    assert [(r.offset, r.bind, r.name, r.access) for r in launch.relocations] == [
        (8, "region", "bias", "read"), (16, "region", "a", "read"),
        (24, "region", "b", "read"), (32, "region", "out", "write"),
        (40, "scratch", "row", "read")]
    assert [s.size for s in bound.plan.scratch] == [N * 4]
    assert list(bound.code.values()) == [lab["lib"].read_bytes()]


def test_opt_capture_passes_and_is_faster(lab):
    out = lab["dir"] / "H"
    proc = _kpair("pair", str(lab["ref"].root), "--opt-capture", str(lab["cand"].root),
                  "-o", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["range_ops"] == 3 and doc["plan_launches"] == 1
    # The harness stands alone: the plan and the candidate's code object are inside it.
    plan = json.loads((out / "plan" / "opt.plan.json").read_text())
    (launch,) = plan["launches"]
    assert (out / "plan" / launch["code"]).read_bytes() == lab["lib"].read_bytes()
    assert "out2 -> out (declared output)" in plan["note"]
    r = run_json(out, RunOptions(time_cap_s=10.0, timeout_s=300))
    assert r["status"] == "pass", r.get("correctness") or r.get("error")
    assert r["replay"]["range_ops"] == 3 and r["replay"]["plan_launches"] == 1
    # Faster by the estimate; the interval, systematic offset folded in, reached
    # [0.73, 2.65] on a loaded CI machine, so it is not asserted.
    assert r["speed"]["speedup"] > 1.0, r["speed"]
    assert all(t["passed"] is not False for t in r["trust"].values())


def test_changed_input_bytes_are_refused(small, tmp_path):
    x = small["x"]
    a = x["a"]
    keep = a[0, 0]
    a[0, 0] += 1.0   # the same array, other bytes than ref read
    try:
        cand = _record_fused(small["lib"], x, tmp_path / "c", 16)
    finally:
        a[0, 0] = keep
    with pytest.raises(BindError, match=r"a: different bytes"):
        bind_capture(small["ref"], cand)
    proc = _kpair("pair", str(small["ref"].root), "--opt-capture", str(cand.root), "-o",
                  str(tmp_path / "H"))
    assert proc.returncode == 4, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "a: different bytes" in lines[0] and "Traceback" not in lines[0]
    assert not (tmp_path / "H").exists()


def test_a_region_partly_ref_s_is_bound_by_the_overlap(lab, tmp_path):
    """ref reads a view of ``big``; the candidate names all of ``big`` (its region is
    larger) and points at the view's start: bound by the overlap, whose bytes agree."""
    n = 16
    x = range_arrays(n, seed=2)
    big = np.zeros(n * n + n, np.float32)
    big[:n * n] = x["a"].ravel()
    x["a"] = big[:n * n].reshape(n, n)   # ref reads a view of big ...
    ref = _record_ref(lab["lib"], x, tmp_path / "r", n)
    cand = _record_fused(lab["lib"], x, tmp_path / "c", n, a=big)   # ... the candidate all
    assert cand.manifest.region("a").size > ref.manifest.region("a").size
    bound = bind_capture(ref, cand)
    (b,) = [b for b in bound.bindings if b.region == "a"]
    assert (b.name, b.offset, b.spans, b.access) == ("a", 0, ((0, n * n * 4),), "read")
    assert "where they overlap" in b.why


def test_a_pointer_outside_the_overlap_is_refused(lab, tmp_path):
    """ref reads ``big`` from its second row on; the candidate points at ``big``'s start,
    memory ref never held: refused, naming the overlap."""
    n = 16
    x = range_arrays(n, seed=2)
    big = np.zeros(n * n + n, np.float32)
    big[n:] = x["a"].ravel()
    x["a"] = big[n:].reshape(n, n)
    ref = _record_ref(lab["lib"], x, tmp_path / "r", n)
    cand = _record_fused(lab["lib"], x, tmp_path / "c", n, a=big)
    with pytest.raises(BindError, match=r"kernarg byte 16 addresses byte 0 of 'a', outside "
                                        rf"the bytes of it that are bound, \[64, \+{n * n * 4}\)"):
        bind_capture(ref, cand)


def test_two_undeclared_outputs_are_refused(small, tmp_path):
    x = small["x"]
    with Recorder(tmp_path / "c", names={"a": x["a"], "b": x["b"], "bias": x["bias"],
                                         "out2": x["out2"], "row": x["row"]}) as r:
        r.call(small["lib"], "kp_fused", [np.int32(16), x["bias"], x["a"], x["b"], x["out2"],
                                          x["row"]])
    with pytest.raises(BindError, match=r"'out2', 'row': no counterpart \(SNAP2 writes 2 "
                                        r"region\(s\) and declares no output"):
        bind_capture(small["ref"], r.snapshot)


def test_output_of_another_size_is_refused(small, tmp_path):
    x = dict(small["x"])
    x["out2"] = np.zeros((17, 16), np.float32)   # one row more than ref's out
    cand = _record_fused(small["lib"], x, tmp_path / "c", 16)
    with pytest.raises(BindError, match=r"out2: different size \(SNAP2's output is 1088 "
                                        r"bytes, SNAP's 'out' is 1024\)"):
        bind_capture(small["ref"], cand)


def test_another_process_is_refused(small, tmp_path):
    cand = _record_fused(small["lib"], small["x"], tmp_path / "c", 16)
    doc = json.loads((cand.root / "snapshot.json").read_text())
    doc["provenance"]["process"] = "0" * 32
    (cand.root / "snapshot.json").write_text(json.dumps(doc))
    with pytest.raises(BindError, match="recorded in another process"):
        bind_capture(small["ref"], Snapshot.open(cand.root))


def test_no_counterpart_is_refused(small, tmp_path):
    """A live-in array ref never saw (a copy of b: other memory, same bytes)."""
    x = dict(small["x"])
    x["b"] = small["x"]["b"].copy()
    cand = _record_fused(small["lib"], x, tmp_path / "c", 16)
    with pytest.raises(BindError, match=r"b: no counterpart \(SNAP2 reads"):
        bind_capture(small["ref"], cand)


def _bound_plan(small, tmp_path) -> tuple[Path, dict]:
    cand = _record_fused(small["lib"], small["x"], tmp_path / "c", 16)
    path = bind_capture(small["ref"], cand).write(tmp_path / "p")
    return path, json.loads(path.read_text())


@pytest.mark.parametrize("case,change,code,message", [
    ("outside", {"offset": 48}, 3, "relocation at byte 48: outside the kernarg (48 bytes)"),
    ("not-a-param", {"offset": 4}, 3, "no parameter of the kernarg holds a whole pointer word"),
    ("scalar", {"offset": 0}, 4, "the parameter there is i32 of 4 bytes, not a pointer"),
    ("unknown-region", {"name": "c"}, 3, "the range has no region 'c'"),
    ("writes-live-in", {"access": "write"}, 3, "region 'bias' is live-in"),
    ("past-end", {"offset_in_region": 64}, 3, "is past the end of region 'bias' (64 bytes)"),
])
def test_bad_relocations_are_refused(small, tmp_path, case, change, code, message):
    path, plan = _bound_plan(small, tmp_path)
    plan["launches"][0]["relocations"][0].update(change)   # the one of bias, at byte 8
    path.write_text(json.dumps(plan))
    proc = _kpair("pair", str(small["ref"].root), "--plan", str(path), "-o",
                  str(tmp_path / "H"))
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not (tmp_path / "H").exists()


def test_pair_says_how_each_region_was_bound(small, tmp_path):
    cand = _record_fused(small["lib"], small["x"], tmp_path / "c", 16)
    proc = _kpair("pair", str(small["ref"].root), "--opt-capture", str(cand.root), "-o",
                  str(tmp_path / "H"))
    assert proc.returncode == 0, proc.stderr
    assert "a -> a (same memory, same bytes)" in proc.stdout
    assert "out2 -> out (declared output)" in proc.stdout
    assert "row -> scratch row (scratch of SNAP2)" in proc.stdout


def test_bound_plan_reads_back_and_checks(small, tmp_path):
    path, _ = _bound_plan(small, tmp_path)
    plan, code, layouts = load_plan(path, small["ref"].manifest)
    assert plan.launches[0].raw and code[0][1] == "elf-so"
    assert layouts[0] == plan.launches[0].params   # the raw kernarg is packed by its own


# ---------------------------------------------------------------- CUDA code objects, CPU


def _cuda_manifest():
    from kpair.snapshot import BlobRef, CodeObject, Kernarg, Launch, Manifest, Param, Region

    def blob(n):
        return BlobRef("blobs/x.zst", n, "0" * 64)

    regions = tuple(Region(name, 0x1000 + 0x2000 * i, 4096, blob(4096), blob(4096),
                           role="out" if name == "c" else "in")
                    for i, name in enumerate("abc"))
    return Manifest(backend="cuda", arch="sm_90", code=CodeObject(blob(10), "cubin", "kp_add"),
                    launch=Launch(), kernarg=Kernarg(blob(28), (
                        Param(0, 8, "pointer"), Param(8, 8, "pointer"), Param(16, 8, "pointer"),
                        Param(24, 4, "i32"))), regions=regions)


ARGS = [{"bind": "region", "name": "a"}, {"bind": "region", "name": "b"},
        {"bind": "region", "name": "c", "access": "write"},
        {"bind": "scalar", "kind": "i32", "value": 1024}]


def _check(tmp_path: Path, file: str, kernel: str = "kp_add", bound=ARGS, **launch):
    plan = {"schema": "kpair.plan", "schema_version": 1, "launches": [
        {"code": file, "kernel": kernel, "grid": [4, 1, 1], "block": [256, 1, 1],
         **({"args": bound} if bound is not None else {}), **launch}]}
    (tmp_path / "opt.plan.json").write_text(json.dumps(plan))
    return load_plan(tmp_path / "opt.plan.json", _cuda_manifest())


@pytest.mark.parametrize("fmt", ["fatbin", "ptx"])
def test_ptx_and_fatbin_plans_are_checked_against_their_layout(tmp_path, fmt):
    fatbin = (DATA / "kp_add_sm90.fatbin").read_bytes()
    members = dict((k, m) for k, _, m in fatbin_members(fatbin))
    assert set(members) == {"elf", "ptx"} and b".entry kp_add" in members["ptx"]
    (tmp_path / f"k.{fmt}").write_bytes(fatbin if fmt == "fatbin" else members["ptx"])
    _, code, layouts = _check(tmp_path, f"k.{fmt}")
    assert code[0][1] == fmt
    assert [(p.offset, p.size) for p in layouts[0]] == [(0, 8), (8, 8), (16, 8), (24, 4)]
    with pytest.raises(AbiMismatch, match="takes 4 parameters"):
        _check(tmp_path, f"k.{fmt}", bound=ARGS[:3])
    with pytest.raises(AbiMismatch, match="is 4 bytes, the plan passes a i64"):
        _check(tmp_path, f"k.{fmt}", bound=[*ARGS[:3], {"bind": "scalar", "kind": "i64",
                                                        "value": 1}])
    if fmt == "ptx":
        with pytest.raises(SymbolNotFound, match="'kp_addd' is not an .entry of the PTX"):
            _check(tmp_path, "k.ptx", kernel="kp_addd")
    else:   # the kernel in no member: no layout to pack a named binding by
        with pytest.raises(PlanError, match="records no parameter layout"):
            _check(tmp_path, "k.fatbin", kernel="kp_addd")


def test_raw_kernarg_against_a_cubin_layout(tmp_path):
    """A raw kernarg's layout must be the cubin's own; a relocation lands on a pointer."""
    shutil.copy(DATA / "kp_add_sm90.cubin", tmp_path / "k.cubin")
    params = [{"offset": 0, "size": 8, "kind": "bytes"}, {"offset": 8, "size": 8},
              {"offset": 16, "size": 8}, {"offset": 24, "size": 4}]
    relocs = [{"offset": 0, "bind": "region", "name": "a"},
              {"offset": 8, "bind": "region", "name": "b"},
              {"offset": 16, "bind": "region", "name": "c", "access": "write"}]
    raw = {"kernarg": "00" * 32, "params": params, "relocations": relocs}
    _, _, layouts = _check(tmp_path, "k.cubin", bound=None, **raw)
    assert [(p.offset, p.size) for p in layouts[0]] == [(0, 8), (8, 8), (16, 8), (24, 4)]
    with pytest.raises(AbiMismatch, match=r"the kernarg's layout .* is not the code object's"):
        _check(tmp_path, "k.cubin", bound=None, **{**raw, "params": params[:3]})
    with pytest.raises(AbiMismatch, match="not a pointer"):
        _check(tmp_path, "k.cubin", bound=None, **{**raw, "relocations": [
            *relocs, {"offset": 24, "bind": "region", "name": "a"}]})
    with pytest.raises(PlanError, match="'c', which no launch of the plan binds for writing"):
        _check(tmp_path, "k.cubin", bound=None, **{**raw, "relocations": relocs[:2]})


def test_a_relocation_inside_a_struct_passed_by_value():
    """A library kernel's parameter block (one opaque parameter) holds pointers: an 8-aligned
    word inside it can be relocated; a misaligned one, or one in no parameter, cannot."""
    from kpair.plan import Plan, PlanLaunch, Relocation, Target, TargetRegion, check_plan
    from kpair.snapshot import Param

    target = Target({"a": TargetRegion(64, "in"), "c": TargetRegion(64, "out")})

    def plan(offset: int) -> Plan:
        return Plan(launches=(PlanLaunch(
            code="k.cubin", kernel="k", kernarg=bytes(48),
            params=(Param(0, 32, "bytes"), Param(32, 4, "i32")),
            relocations=(Relocation(offset=8, bind="region", name="a"),
                         Relocation(offset=offset, bind="region", name="c",
                                    access="write"))),))

    check_plan(plan(16), target, [None])
    check_plan(plan(24), target, [[Param(0, 32), Param(32, 4)]])   # the code's own layout
    with pytest.raises(AbiMismatch, match="the parameter there is bytes of 32 bytes"):
        check_plan(plan(20), target, [None])
    with pytest.raises(PlanError, match="no parameter of the kernarg holds a whole pointer"):
        check_plan(plan(40), target, [None])
    two = Plan(launches=(PlanLaunch(   # the code object says the word is an i64
        code="k.so", kernel="k", kernarg=bytes(16), params=(Param(0, 8), Param(8, 8)),
        relocations=(Relocation(offset=0, bind="region", name="a"),
                     Relocation(offset=8, bind="region", name="c", access="write"))),))
    check_plan(two, target, [[Param(0, 8, "pointer"), Param(8, 8, "pointer")]])
    with pytest.raises(AbiMismatch, match="the code object's parameter there is not"):
        check_plan(two, target, [[Param(0, 8, "pointer"), Param(8, 8, "i64")]])


def test_an_in_place_update_binds_to_the_same_memory(lab, tmp_path):
    """Both ranges update one array in place (ReLU), from the same bytes: bound by identity,
    read and written there; the pair passes."""
    from kpair.record import record_range

    x = np.random.default_rng(3).standard_normal(4096, dtype=np.float32)
    keep = x.copy()
    ref = record_range([(lab["lib"], "kp_relu", [x, np.int32(64)])], tmp_path / "r",
                       names={"x": x})
    x[...] = keep   # the candidate starts from the same bytes, in the same memory
    cand = record_range([(lab["lib"], "kp_relu", [x, np.int32(64)])], tmp_path / "c",
                        names={"x": x})
    bound = bind_capture(ref, cand)
    assert [(b.region, b.to, b.name, b.access, b.why) for b in bound.bindings] == [
        ("x", "region", "x", "readwrite", "same memory, same bytes")]
    proc = _kpair("pair", str(ref.root), "--opt-capture", str(cand.root), "-o",
                  str(tmp_path / "H"))
    assert proc.returncode == 0, proc.stderr
    r = run_json(tmp_path / "H", RunOptions(time_cap_s=1.0, max_blocks=32, control=False,
                                            timeout_s=300))
    assert r["status"] == "pass", r.get("correctness") or r.get("error")


def test_a_captured_cheat_is_bound_and_then_fails(small, tmp_path):
    """A candidate that answers its recorded inputs right and then replays that answer
    (kp_fused_memo) binds like any other; the run's mutated inputs catch it."""
    x = small["x"]
    x["out2"][...] = 0
    with Recorder(tmp_path / "c", names={"a": x["a"], "b": x["b"], "bias": x["bias"],
                                         "out2": x["out2"], "row": x["row"]},
                  outputs=[x["out2"]], scratch=[x["row"]]) as r:
        r.call(small["lib"], "kp_fused_memo", [np.int32(16), x["bias"], x["a"], x["b"],
                                               x["out2"], x["row"]])
    proc = _kpair("pair", str(small["ref"].root), "--opt-capture", str(r.snapshot.root),
                  "-o", str(tmp_path / "H"))
    assert proc.returncode == 0, proc.stderr
    res = run_json(tmp_path / "H", RunOptions(time_cap_s=1.0, max_blocks=32, timeout_s=300))
    assert res["status"] == "fail"
    assert res["correctness"]["failed_check"] == "differential", res["correctness"]


def test_a_buffer_both_ranges_write_is_one_buffer(lab, tmp_path):
    """Both ranges also add a bias into one more array (as a library updates its workspace);
    ref ran first, so the candidate found it changed. No declared output of either: bound to
    the same memory, and the pair passes (both start from ref's pre-state)."""
    n = 16
    x = range_arrays(n, seed=4)
    ws = np.random.default_rng(5).standard_normal((n, n), dtype=np.float32)
    with Recorder(tmp_path / "r", names={"a": x["a"], "b": x["b"], "bias": x["bias"],
                                         "out": x["out"], "ws": ws}, outputs=[x["out"]]) as r:
        r.call(lab["lib"], "kp_matmul", [x["a"], x["b"], x["out"], np.int32(n)])
        r.call(lab["lib"], "kp_bias", [x["out"], x["bias"], np.int32(n)])
        r.call(lab["lib"], "kp_relu", [x["out"], np.int32(n)])
        r.call(lab["lib"], "kp_bias", [ws, x["bias"], np.int32(n)])
    ref = r.snapshot
    with Recorder(tmp_path / "c", names={"a": x["a"], "b": x["b"], "bias": x["bias"],
                                         "out2": x["out2"], "row": x["row"], "ws": ws},
                  outputs=[x["out2"]], scratch=[x["row"]]) as r:
        r.call(lab["lib"], "kp_fused", [np.int32(n), x["bias"], x["a"], x["b"], x["out2"],
                                        x["row"]])
        r.call(lab["lib"], "kp_bias", [ws, x["bias"], np.int32(n)])
    got = {b.region: (b.name, b.access, b.why) for b in bind_capture(ref, r.snapshot).bindings}
    assert got["ws"] == ("ws", "readwrite", "same memory, written by both")
    assert got["out2"] == ("out", "write", "declared output")
    proc = _kpair("pair", str(ref.root), "--opt-capture", str(r.snapshot.root), "-o",
                  str(tmp_path / "H"))
    assert proc.returncode == 0, proc.stderr
    res = run_json(tmp_path / "H", RunOptions(time_cap_s=1.0, max_blocks=32, control=False,
                                              timeout_s=300))
    assert res["status"] == "pass", res.get("correctness") or res.get("error")


def test_launch_attributes_travel_with_a_plan(tmp_path):
    """A captured launch's attributes (a cluster shape) are part of its plan launch, written
    and read back as the snapshot writes them."""
    from kpair.plan import Plan, PlanLaunch
    from kpair.snapshot import LaunchAttribute

    attr = LaunchAttribute(id=4, name="CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION",
                           value=bytes.fromhex("020000000100000001000000"))
    plan = Plan(launches=(PlanLaunch(code="k.cubin", kernel="k", kernarg=bytes(8),
                                     params=[Param(0, 8)], attributes=[attr]),))
    doc = plan.to_json()
    assert doc["launches"][0]["attributes"] == [
        {"id": 4, "name": "CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION",
         "value": "020000000100000001000000"}]
    (tmp_path / "opt.plan.json").write_text(json.dumps(doc))
    assert Plan.read(tmp_path / "opt.plan.json") == plan


def _record_with_workspace(small, tmp_path, ws: np.ndarray) -> Snapshot:
    tmp_path.mkdir(parents=True, exist_ok=True)
    x, n = small["x"], 16
    x["out2"][...] = 0
    names = {"a": x["a"], "b": x["b"], "bias": x["bias"], "out2": x["out2"], "row": x["row"],
             "ws": ws}
    with Recorder(tmp_path / "c", names=names, outputs=[x["out2"]], scratch=[x["row"]]) as r:
        r.call(small["lib"], "kp_fused_ws", [np.int32(n), x["bias"], x["a"], x["b"],
                                             x["out2"], x["row"], ws])
    return r.snapshot


def test_a_zeroed_workspace_ref_never_saw_is_scratch_set_by_a_memset(small, tmp_path):
    """SNAP2 reads a workspace that holds zeros before and after (cuBLAS's split-K
    semaphores): bound to plan scratch that a memset, the first launch, zeroes; the plan
    passes, so the candidate had its zeros (poison alone would leave every row undone)."""
    cand = _record_with_workspace(small, tmp_path, np.zeros(64, np.int32))
    bound = bind_capture(small["ref"], cand)
    ws = next(b for b in bound.bindings if b.region == "ws")
    assert ws.to == "scratch" and "every byte 0x00" in ws.why
    first = bound.plan.launches[0]
    assert first.kind == "memset" and first.value == 0 and first.count == 256 \
        and first.dst.name == ws.name
    path = bound.write(tmp_path / "p")
    proc = _kpair("pair", str(small["ref"].root), "--plan", str(path), "-o",
                  str(tmp_path / "H"))
    assert proc.returncode == 0, proc.stderr
    r = run_json(tmp_path / "H", RunOptions(time_cap_s=1.0, timeout_s=300))
    assert r["status"] == "pass", r.get("correctness") or r.get("error")


def test_a_workspace_ref_never_saw_holding_data_is_refused(small, tmp_path):
    # The zeros the kernel needs, and one word of data the workspace would carry in.
    ws = np.concatenate([np.zeros(64, np.int32), np.array([7], np.int32)])
    cand = _record_with_workspace(small, tmp_path, ws)
    with pytest.raises(BindError, match=r"ws: no counterpart \(SNAP2 reads"):
        bind_capture(small["ref"], cand)


def test_a_plan_buffer_never_takes_the_name_of_refs_scratch(small, tmp_path):
    """ref's scratch and the candidate's are two buffers, whatever they were called."""
    x, lib = small["x"], small["lib"]
    with Recorder(tmp_path / "ref", names={k: x[k] for k in ("a", "b", "bias", "out", "row")},
                  outputs=[x["out"]], scratch=[x["row"]]) as r:
        r.call(lib, "kp_bias", [x["row"], x["bias"], np.int32(1)])   # ref's own scratch
        r.call(lib, "kp_matmul", [x["a"], x["b"], x["out"], np.int32(16)])
        r.call(lib, "kp_bias", [x["out"], x["bias"], np.int32(16)])
        r.call(lib, "kp_relu", [x["out"], np.int32(16)])
    ref = r.snapshot
    assert [s.name for s in ref.manifest.scratch_regions] == ["row"]
    bound = bind_capture(ref, _record_fused(lib, x, tmp_path / "c", 16))
    assert [s.name for s in bound.plan.scratch] == ["row.1"]
    assert next(b for b in bound.bindings if b.region == "row").name == "row.1"


def test_a_zeroed_workspace_where_ref_writes_its_output_is_the_candidates_scratch(
        small, tmp_path):
    """The allocator handed the same memory to both ranges: the candidate's zeroed workspace
    lies where ref writes its output. Bound there, the judge's poison (ref only writes it)
    would be what the candidate reads; it is the candidate's own scratch, zeroed by a memset,
    and the plan passes. With other bytes there it is refused."""
    x, lib = dict(small["x"]), small["lib"]
    x["out"] = np.zeros((16, 16), np.float32)
    ws = x["out"].reshape(-1)[:64].view(np.int32)   # the first 256 bytes of ref's output
    cand = _record_with_workspace(small | {"x": x}, tmp_path, ws)   # first: out still zero
    ref = _record_ref(lib, x, tmp_path / "ref", 16)
    bound = bind_capture(ref, cand)
    b = next(b for b in bound.bindings if b.region == "ws")
    assert b.to == "scratch" and "memory SNAP's 'out' writes" in b.why
    assert bound.plan.launches[0].kind == "memset"
    path = bound.write(tmp_path / "p")
    proc = _kpair("pair", str(ref.root), "--plan", str(path), "-o", str(tmp_path / "H"))
    assert proc.returncode == 0, proc.stderr
    r = run_json(tmp_path / "H", RunOptions(time_cap_s=1.0, timeout_s=300))
    assert r["status"] == "pass", r.get("correctness") or r.get("error")
    x["out"] = np.zeros((16, 16), np.float32)
    ws = x["out"].reshape(-1)[:64].view(np.int32)
    ws[63] = 7   # a word of data where ref's output lies
    cand = _record_with_workspace(small | {"x": x}, tmp_path / "2", ws)
    ref = _record_ref(lib, x, tmp_path / "ref2", 16)
    with pytest.raises(BindError, match=r"ws: reads what SNAP's output 'out' held before"):
        bind_capture(ref, cand)
