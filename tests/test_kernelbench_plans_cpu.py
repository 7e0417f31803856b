"""benchmarks/kernelbench_plans.py without a GPU and without torch.

- Every table entry's launch (``Spec``) against its Triton kernel's own parameter list (read
  from benchmarks/kernelbench_kernels/kernels.py with ``ast``: no Triton needed): the launch
  binds exactly the kernel's parameters, in order, and sets exactly its constexprs.
- Plans written from a made-up ``io`` record and snapshot manifest: each tensor bound to the
  region holding it by address (with its byte offset), inputs read, the output written,
  scalars typed (i32, i64 past 2**31, f32), Triton's hidden trailing pointers bound to a u64 0
  or to a declared scratch buffer; tensors outside the range and layouts that are not the
  launch's refused with their reason; the plan read back by ``kpair.plan`` and accepted by
  ``check_plan`` on the range's target.
- The driver's bookkeeping with a stand-in ``kpair`` (capture writes what the child and a
  range capture would, pair and run answer as the real ones do): results.jsonl, summary.json,
  the pair call's plan and policy, a resumed call doing nothing twice.
- Where Triton is installed (skipped otherwise): every kernel run by Triton's CPU interpreter
  (``TRITON_INTERPRET=1``, numpy arrays dressed as tensors) on small odd-sized problems
  against numpy, and compiled for sm_90 by Triton's own ptxas, its cubin's parameter layout
  (as kpair reads it) taking the plan.
- The table's problems exist in the KernelBench copy where one is present (skipped otherwise).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
KB_COPY = ROOT / ".kb" / "KernelBench"


def _load():
    spec = importlib.util.spec_from_file_location("kernelbench_plans",
                                                  BENCH / "kernelbench_plans.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["kernelbench_plans"] = module
    spec.loader.exec_module(module)
    return module


kp = _load()


# --------------------------------------------------------------------------- cases

def _t(arr: np.ndarray) -> dict:
    return {"kind": "tensor", "data_ptr": int(arr.ctypes.data), "nbytes": int(arr.nbytes),
            "shape": list(arr.shape), "stride": [s // arr.itemsize for s in arr.strides],
            "dtype": str(arr.dtype)}


def _gelu(x):
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def _softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def case(name: str, seed: int = 0):
    """(inputs: arrays and scalars as the problem's ``get_inputs`` gives them, model attrs,
    expected output in float64) for a small odd-sized version of table problem ``name``."""
    rng = np.random.default_rng(seed)

    def r(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    n = kp.BY_NAME[name].number
    mm = {1: ((40, 40), (40, 40), "", ""), 2: ((70, 50), (50, 90), "", ""),
          7: ((70, 3), (3, 90), "", ""), 8: ((37, 45), (45, 29), "", ""),
          9: ((70, 1), (1, 70), "", ""), 16: ((50, 70), (50, 90), "T", ""),
          17: ((70, 50), (90, 50), "", "T"), 18: ((50, 70), (90, 50), "T", "T")}
    if n in mm:
        sa, sb, ta, tb = mm[n]
        a, b = r(*sa), r(*sb)
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        return [a, b], {}, (a64.T if ta else a64) @ (b64.T if tb else b64)
    if n == 4:
        a, x = r(9, 1500), r(1500, 1)
        return [a, x], {}, a.astype(np.float64) @ x.astype(np.float64)
    if n == 5:
        a = r(33, 65)
        return [a, 3.14], {}, a.astype(np.float64) * np.float32(3.14)
    x = r(5, 700)
    x64 = x.astype(np.float64)
    unary = {19: lambda v: np.maximum(v, 0), 20: lambda v: np.where(v >= 0, v, 0.01 * v),
             21: lambda v: 1 / (1 + np.exp(-v)), 22: np.tanh,
             25: lambda v: v / (1 + np.exp(-v)), 26: _gelu,
             88: lambda v: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi)
                                                  * (v + 0.044715 * v ** 3)))}
    if n in unary:
        return [x], ({"negative_slope": 0.01} if n == 20 else {}), unary[n](x64)
    if n in (23, 24):
        x = r(3, 5000)
        s = _softmax(x.astype(np.float64))
        return [x], {"dim": 1}, s if n == 23 else np.log(s)
    x = r(2, 37, 100)
    x64 = x.astype(np.float64)
    red = {47: lambda v: v.sum(axis=1, keepdims=True), 48: lambda v: v.mean(axis=1),
           49: lambda v: v.max(axis=1), 53: lambda v: v.min(axis=1)}
    return [x], {"dim": 1}, red[n](x64)


def io_of(inputs, attrs, out: np.ndarray) -> dict:
    return {"inputs": [_t(a) if isinstance(a, np.ndarray) else {"kind": "scalar", "value": a}
                       for a in inputs],
            "output": _t(out), "attrs": attrs}


def kernel_params() -> dict[str, tuple[list[str], set[str]]]:
    """Each ``@triton.jit`` function of kernels.py: (its parameters, its constexprs)."""
    tree = ast.parse((BENCH / "kernelbench_kernels" / "kernels.py").read_text())
    out = {}
    for f in tree.body:
        if isinstance(f, ast.FunctionDef) and f.name.startswith("kb_"):
            const = {a.arg for a in f.args.args if a.annotation is not None
                     and "constexpr" in ast.unparse(a.annotation)}
            out[f.name] = ([a.arg for a in f.args.args], const)
    return out


# --------------------------------------------------------------------------- the table

def test_the_table_has_at_least_twelve_problems_each_with_its_own_kernel():
    assert len(kp.PROBLEMS) >= 12
    assert len({e.name for e in kp.PROBLEMS}) == len(kp.PROBLEMS)
    params = kernel_params()
    for e in kp.PROBLEMS:
        inputs, attrs, expected = case(e.name)
        work = e.launches(io_of(inputs, attrs, np.zeros(expected.shape, np.float32)))
        for spec in work.launches:
            assert spec.kernel in params, (e.name, spec.kernel)
            names, const = params[spec.kernel]
            assert [p for p, _ in spec.args] == [p for p in names if p not in const], e.name
            assert set(spec.constexprs) == const, e.name
            assert all(b[0] in ("tensor", "scalar", "scratch") for _, b in spec.args)
            assert all(b[1] in work.scratch for _, b in spec.args if b[0] == "scratch")
            assert math.prod(spec.grid) >= 1 and spec.num_warps in (1, 2, 4, 8, 16)
        assert ("tensor", "out") in [b for s in work.launches for _, b in s.args], e.name


def fake_layout(spec) -> list[list[int]]:
    """The layout a cubin of ``spec``'s kernel records: its parameters, then Triton's two
    hidden pointers (offsets aligned to each size)."""
    sizes = [8 if b[0] != "scalar" else {"i32": 4, "f32": 4, "i64": 8}[b[1]]
             for _, b in spec.args] + [8, 8]
    out, at = [], 0
    for size in sizes:
        at = -(-at // size) * size
        out.append([at, size])
        at += size
    return out


def fake_regions(io: dict) -> list[dict]:
    """One region per tensor, each starting 256 bytes before it."""
    return [{"name": f"r{i}", "address": hex(t["data_ptr"] - 256), "size": t["nbytes"] + 512,
             "role": "out" if t is io["output"] else "in"}
            for i, t in enumerate([*kp._tensors(io), io["output"]])]


def test_every_problems_plan_passes_kpairs_check(tmp_path):
    from kpair.plan import Plan, RegionArg, Target, TargetRegion, check_plan
    from kpair.snapshot import Param

    for e in kp.PROBLEMS:
        inputs, attrs, expected = case(e.name)
        io = io_of(inputs, attrs, np.zeros(expected.shape, np.float32))
        work = e.launches(io)
        kernels = []
        for i, spec in enumerate(work.launches):
            cubin = tmp_path / f"{e.number}.{i}.cubin"
            cubin.write_bytes(b"cubin")
            kernels.append({"name": spec.kernel, "shared": 0, "num_warps": spec.num_warps,
                            "layout": fake_layout(spec), "cubin": str(cubin)})
        regions = fake_regions(io)
        path = kp.write_plan(tmp_path / e.name, work, io, {"regions": regions}, kernels)
        plan = Plan.read(path)
        assert [q.code for q in plan.launches] == [f"k{i}.cubin" for i in range(len(kernels))]
        assert {s.name: s.size for s in plan.scratch} == work.scratch
        target = Target({r["name"]: TargetRegion(r["size"], r["role"]) for r in regions})
        check_plan(plan, target, [[Param(o, s, "bytes") for o, s in k["layout"]]
                                  for k in kernels])
        bound = [a for q in plan.launches for a in q.args if isinstance(a, RegionArg)]
        assert len(bound) >= 2 and all(a.offset == 256 for a in bound), e.name


def test_a_softmax_plan_is_two_launches_through_scratch():
    x = np.zeros((3, 5000), np.float32)
    work = kp.BY_NAME["23_Softmax"].launches(io_of([x], {"dim": 1}, x.copy()))
    assert [s.kernel for s in work.launches] == ["kb_softmax_partial", "kb_softmax_finish"]
    first, second = (dict(s.args) for s in work.launches)
    assert first["CHUNK"] == ("scalar", "i32", 1024) and second["NCHUNKS"][2] == 5
    assert work.scratch == {"softmax_partials": 3 * 5 * 2 * 4}
    assert work.launches[0].grid == work.launches[1].grid == (3, 5, 1)


def test_matmul_launches_take_transposes_as_strides():
    a, b = np.zeros((50, 70), np.float32), np.zeros((90, 50), np.float32)   # A is (K, M)
    spec = kp.BY_NAME["18_Matmul_with_transposed_both"].spec(
        io_of([a, b], {}, np.zeros((70, 90), np.float32)))
    args = dict(spec.args)
    assert [args[k][2] for k in ("M", "N", "K")] == [70, 90, 50]
    assert [args[k][2] for k in ("stride_am", "stride_ak", "stride_bk", "stride_bn")] == \
        [1, 70, 1, 50]
    assert args["c_ptr"] == ("tensor", "out") and args["a_ptr"] == ("tensor", "in0")
    with pytest.raises(kp.PlanBuildError, match="not a"):   # untransposed shapes do not chain
        kp.BY_NAME["2_Standard_matrix_multiplication_"].spec(
            io_of([a, b], {}, np.zeros((70, 90), np.float32)))


def test_scalars_are_typed():
    big = {"kind": "tensor", "data_ptr": 1 << 40, "nbytes": 4 * 3 * (1 << 30),
           "shape": [3, 1 << 30], "stride": [1 << 30, 1], "dtype": "float32"}
    spec = kp.BY_NAME["19_ReLU"].spec({"inputs": [big], "output": dict(big), "attrs": {}})
    assert dict(spec.args)["n"] == ("scalar", "i64", 3 << 30)
    x = np.zeros((4, 8), np.float32)
    spec = kp.BY_NAME["5_Matrix_scalar_multiplication"].spec(io_of([x, 3.14], {}, x.copy()))
    assert dict(spec.args)["s"] == ("scalar", "f32", 3.14)
    assert dict(spec.args)["n"] == ("scalar", "i32", 32)
    spec = kp.BY_NAME["20_LeakyReLU"].spec(io_of([x], {"negative_slope": 0.2}, x.copy()))
    assert dict(spec.args)["slope"] == ("scalar", "f32", 0.2)


def test_a_reduction_over_another_dimension_is_refused():
    x = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(kp.PlanBuildError, match="dimension 1"):
        kp.BY_NAME["47_Sum_reduction_over_a_dimension"].spec(
            io_of([x], {"dim": 2}, np.zeros((2, 3, 1), np.float32)))


@pytest.mark.skipif(not (KB_COPY / "level1").is_dir(), reason="no KernelBench copy in .kb/")
def test_the_table_problems_exist_in_the_kernelbench_copy():
    found = {p.name: p for p in kp.kb.discover(KB_COPY, [1])}
    missing = [e.name for e in kp.PROBLEMS if e.name not in found]
    assert not missing
    for e in kp.PROBLEMS:
        source = found[e.name].path.read_text()
        assert "def forward" in source and "get_inputs" in source
        for attr in e.attrs:   # the model attributes a launch reads are the model's
            assert f"self.{attr}" in source, (e.name, attr)


# --------------------------------------------------------------------------- plans

LAYOUT = {"name": "kb_relu", "shared": 0, "num_warps": 4,
          "layout": [[0, 8], [8, 8], [16, 4], [24, 8], [32, 8]]}


def relu_io():
    return {"inputs": [{"kind": "tensor", "data_ptr": 0x7F0000000200, "nbytes": 4096,
                        "shape": [1024], "stride": [1], "dtype": "float32"}],
            "output": {"kind": "tensor", "data_ptr": 0x7F0000100000, "nbytes": 4096,
                       "shape": [1024], "stride": [1], "dtype": "float32"}, "attrs": {}}


def manifest_regions():
    return [{"name": "arg0", "address": "0x7f0000000000", "size": 8192, "role": "in"},
            {"name": "out0", "address": "0x7f0000100000", "size": 4096, "role": "out"},
            {"name": "other", "address": "0x7f0000200000", "size": 512, "role": "in"}]


def test_a_plan_binds_tensors_by_address_and_types_its_scalars():
    spec = kp.BY_NAME["19_ReLU"].spec(relu_io())
    plan = kp.plan_for(spec, relu_io(), manifest_regions(), LAYOUT)
    (launch,) = plan["launches"]
    assert launch["kernel"] == "kb_relu" and launch["format"] == "cubin"
    assert launch["grid"] == [1, 1, 1] and launch["block"] == [128, 1, 1]
    assert launch["args"] == [
        {"bind": "region", "name": "arg0", "offset": 0x200, "access": "read", "bytes": 4096},
        {"bind": "region", "name": "out0", "offset": 0, "access": "write", "bytes": 4096},
        {"bind": "scalar", "kind": "i32", "value": 1024},
        {"bind": "scalar", "kind": "u64", "value": 0},
        {"bind": "scalar", "kind": "u64", "value": 0}]
    assert "scratch" not in plan
    assert "x_ptr -> arg0+512" in plan["note"]


def test_the_plan_is_kpairs_and_passes_its_check(tmp_path):
    from kpair.plan import Plan, Target, TargetRegion, check_plan, kernarg
    from kpair.snapshot import Param

    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(b"\x7fELF not a real one")
    path = kp.write_plan(tmp_path / "plan", kp.BY_NAME["19_ReLU"].launches(relu_io()),
                         relu_io(), {"regions": manifest_regions()},
                         [{**LAYOUT, "cubin": str(cubin)}])
    assert (tmp_path / "plan" / "k0.cubin").read_bytes() == cubin.read_bytes()
    plan = Plan.read(path)
    target = Target({r["name"]: TargetRegion(r["size"], r["role"])
                     for r in manifest_regions()})
    layout = [Param(o, s, "bytes") for o, s in LAYOUT["layout"]]
    check_plan(plan, target, [layout])
    blob = kernarg(plan.launches[0], layout, {"arg0": 0x1000, "out0": 0x9000, "other": 0})
    assert len(blob) == 40 and int.from_bytes(blob[:8], "little") == 0x1200
    assert int.from_bytes(blob[16:20], "little") == 1024


def test_hidden_scratch_the_kernel_asks_for_is_declared():
    spec = kp.BY_NAME["19_ReLU"].spec(relu_io())
    plan = kp.plan_for(spec, relu_io(), manifest_regions(),
                       {**LAYOUT, "global_scratch_size": 64, "global_scratch_align": 512})
    assert plan["scratch"] == [{"name": "triton_global_scratch_0", "size": 64, "align": 512}]
    assert plan["launches"][0]["args"][3] == {"bind": "scratch",
                                              "name": "triton_global_scratch_0"}


@pytest.mark.parametrize("layout,match", [
    ([[0, 8], [8, 8]], "takes 2 parameters"),
    ([[0, 8], [8, 8], [16, 4], [24, 8], [32, 8], [40, 8]], "takes 6 parameters"),
    ([[0, 8], [8, 8], [16, 4], [24, 4]], "not a pointer")])
def test_a_layout_that_is_not_the_launch_is_refused(layout, match):
    spec = kp.BY_NAME["19_ReLU"].spec(relu_io())
    with pytest.raises(kp.PlanBuildError, match=match):
        kp.plan_for(spec, relu_io(), manifest_regions(), {**LAYOUT, "layout": layout})


def test_a_tensor_outside_the_range_is_refused():
    io = relu_io()
    io["inputs"][0]["data_ptr"] = 0x7F0000001F00   # starts inside arg0, ends past it
    spec = kp.BY_NAME["19_ReLU"].spec(io)
    with pytest.raises(kp.PlanBuildError, match=r"x_ptr \(in0\).*inside no region"):
        kp.plan_for(spec, io, manifest_regions(), LAYOUT)


# --------------------------------------------------------------------------- the driver

def fake_kpair(calls: list, *, pass_run: bool = True):
    """A stand-in for ``kpair_cmd``: capture runs nothing but writes what the child (io.json,
    a cubin) and a range capture (capture.json, snapshot.json) would; pair makes the harness;
    run writes a result."""
    def call(*args, timeout, env=None):
        calls.append(args)
        verb = args[0]
        if verb == "capture":
            assert env and "KB_GPU_GATE" in env
            cap = Path(args[args.index("-o") + 1])
            plan = json.loads(Path(args[-1]).read_text())
            records, ranges = [], []
            for i, p in enumerate(plan["problems"]):
                name = f"p{p['number']}"
                ranges.append({"name": name, "status": "captured", "snapshot": name})
                x_at, y_at = 0x7F0000000000 + (i << 24), 0x7F0000800000 + (i << 24)
                io = {"inputs": [{"kind": "tensor", "data_ptr": x_at, "nbytes": 4096,
                                  "shape": [1024], "stride": [1], "dtype": "float32"}],
                      "output": {"kind": "tensor", "data_ptr": y_at, "nbytes": 4096,
                                 "shape": [1024], "stride": [1], "dtype": "float32"},
                      "attrs": {"negative_slope": 0.01}}
                cubin = Path(plan["work"]) / f"{name}.cubin"
                cubin.write_bytes(b"cubin")
                records.append({"number": p["number"], "ok": True, "io": io,
                                "kernels": [{**LAYOUT, "cubin": str(cubin)}],
                                "self_check": {"allclose": True}})
                (cap / name).mkdir(parents=True)
                (cap / name / "snapshot.json").write_text(json.dumps({
                    "ops": [{"code_object": {"kernel_name": "vectorized_elementwise_kernel"}}],
                    "regions": [{"name": "x", "address": hex(x_at), "size": 4096, "role": "in"},
                                {"name": "y", "address": hex(y_at), "size": 4096,
                                 "role": "out"}]}))
            (cap / "capture.json").write_text(json.dumps({"ranges": ranges}))
            Path(plan["io"]).write_text(json.dumps(records))
            return {"exit_code": 0, "stdout": "", "stderr": "", "s": 0.1}
        if verb == "pair":
            Path(args[args.index("-o") + 1]).mkdir(parents=True)
            return {"exit_code": 0, "stdout": "{}", "stderr": "", "s": 0.1}
        if verb == "run":
            out = Path(args[args.index("-o") + 1])
            out.write_text(json.dumps({
                "status": "pass" if pass_run else "fail", "correct": pass_run,
                "speed": {"speedup": 1.25 if "r1" in out.name else 1.26,
                          "combined_ci95": [1.2, 1.3]} if pass_run else None}))
            return {"exit_code": 0 if pass_run else 1, "stdout": "", "stderr": "", "s": 0.1}
        raise AssertionError(args)
    return call


def driver_args(tmp_path, *extra):
    copy = tmp_path / "KernelBench" / "level1"
    copy.mkdir(parents=True, exist_ok=True)
    for name in ("19_ReLU", "20_LeakyReLU"):
        (copy / f"{name}.py").write_text("batch_size = 64\n")
    return ["run", "--kernelbench", str(tmp_path / "KernelBench"), "-o", str(tmp_path / "OUT"),
            "--work", str(tmp_path / "work"), "--sizes", str(tmp_path / "none.json"), *extra]


def test_the_driver_pairs_each_captured_range_with_its_plan(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(kp, "kpair_cmd", fake_kpair(calls))
    assert kp.main(driver_args(tmp_path, "--only", "19,20_LeakyReLU,21")) == 0
    rows = [json.loads(x) for x in (tmp_path / "OUT" / "results.jsonl").read_text().splitlines()]
    assert [(r["key"], r["outcome"]) for r in rows] == [
        ("level1/21_Sigmoid", "not in this KernelBench copy"),
        ("level1/19_ReLU", "pass"), ("level1/20_LeakyReLU", "pass")]
    captures = [c for c in calls if c[0] == "capture"]   # one process a problem
    assert sorted(c[c.index("--range") + 1] for c in captures) == ["p19", "p20"]
    pairs = [c for c in calls if c[0] == "pair"]
    assert len(pairs) == 2 and all("--plan" in c and "--policy" in c for c in pairs)
    runs = [c for c in calls if c[0] == "run"]
    assert len(runs) == 4 and all("--time-cap" in c for c in runs)
    leaky = rows[2]
    assert leaky["plan"]["kernels"] == ["kb_leaky_relu"]
    assert "slope = 0.01 (f32)" in leaky["plan"]["note"]
    assert leaky["rerun_inside"] is True and leaky["ref"]["kernels"] == [
        "vectorized_elementwise_kernel"]
    assert set(leaky["breakdown"]) == {"capture_s", "import_s", "gate_wait_s", "setup_s",
                                       "compile_s", "pair_s", "run_s", "rerun_s"}
    assert leaky["breakdown"]["run_s"] == 0.1
    summary = json.loads((tmp_path / "OUT" / "summary.json").read_text())
    assert summary["passed"] == 2 and summary["geomean_speedup_passed"] == 1.25
    assert summary["rerun_inside"] == 2
    assert summary["outcomes"] == {"not in this KernelBench copy": 1, "pass": 2}
    calls.clear()   # a second call resumes from results.jsonl: everything is decided
    assert kp.main(driver_args(tmp_path, "--only", "19,20")) == 0 and calls == []
    assert len((tmp_path / "OUT" / "results.jsonl").read_text().splitlines()) == 3


def test_a_failed_first_run_is_not_run_again(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(kp, "kpair_cmd", fake_kpair(calls, pass_run=False))
    assert kp.main(driver_args(tmp_path, "--only", "19")) == 0
    (row,) = [json.loads(x) for x in (tmp_path / "OUT" / "results.jsonl").read_text().splitlines()]
    assert row["outcome"] == "fail" and len(row["runs"]) == 1
    assert [c[0] for c in calls].count("run") == 1


def test_one_run_and_no_self_check_when_asked(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(kp, "kpair_cmd", fake_kpair(calls))
    assert kp.main(driver_args(tmp_path, "--only", "19", "--runs", "1", "--no-self-check",
                               "--keep")) == 0
    (row,) = [json.loads(x) for x in (tmp_path / "OUT" / "results.jsonl").read_text()
              .splitlines()]
    assert row["outcome"] == "pass" and len(row["runs"]) == 1 and "rerun_inside" not in row
    assert json.loads((tmp_path / "work" / "p19" / "plan.json").read_text())["self_check"] \
        is False
    assert (tmp_path / "work" / "p19" / "plan" / "opt.plan.json").exists()


def test_a_capture_the_deadline_cut_is_left_for_the_next_call(tmp_path, monkeypatch):
    calls: list = []
    real = fake_kpair(calls)

    def cut(*args, timeout, env=None):
        got = real(*args, timeout=timeout, env=env)
        if args[0] == "capture" and "p20" in args:   # killed at the call's deadline
            return {**got, "exit_code": 124, "stderr": "timed out after 100 s"}
        return got

    monkeypatch.setattr(kp, "kpair_cmd", cut)
    # 100 s: under --capture-timeout, so a capture that times out was cut by the deadline
    assert kp.main(driver_args(tmp_path, "--only", "19,20", "--deadline", "100")) == 3
    rows = [json.loads(x) for x in (tmp_path / "OUT" / "results.jsonl").read_text()
            .splitlines()]
    assert [(r["key"], r["outcome"]) for r in rows] == [("level1/19_ReLU", "pass")]
    calls.clear()
    monkeypatch.setattr(kp, "kpair_cmd", real)
    assert kp.main(driver_args(tmp_path, "--only", "19,20")) == 0
    assert [c[0] for c in calls] == ["capture", "pair", "run", "run"]
    assert all("p20" in " ".join(map(str, c)) for c in calls)


def test_an_unknown_problem_is_a_one_line_error(tmp_path):
    proc = subprocess.run([sys.executable, str(BENCH / "kernelbench_plans.py"),
                           *driver_args(tmp_path, "--only", "3_Batched")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "not in the table: 3_Batched" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_help():
    proc = subprocess.run([sys.executable, str(BENCH / "kernelbench_plans.py"), "run",
                           "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--budget-mib" in proc.stdout and "--only" in proc.stdout


# --------------------------------------------------------------------------- with Triton

class _Storage:
    def __init__(self, arr):
        self.arr = arr

    def data_ptr(self):
        return self.arr.ctypes.data

    def cpu(self):
        return self

    def copy_(self, other):
        pass


class _Dtype:
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return f"torch.{self.name}"


class NpTensor:
    """A numpy array dressed as a torch tensor for Triton's interpreter (which reads host
    memory through ``data_ptr``)."""

    def __init__(self, arr, ptr=None):
        self.arr, self.dtype = arr, _Dtype(str(arr.dtype))
        self._ptr = arr.ctypes.data if ptr is None else ptr

    def data_ptr(self):
        return self._ptr

    def untyped_storage(self):
        return _Storage(self.arr)

    def storage_offset(self):
        return (self._ptr - self.arr.ctypes.data) // self.arr.itemsize

    def size(self):
        return self.arr.shape

    def stride(self):
        return tuple(s // self.arr.itemsize for s in self.arr.strides)

    def new_empty(self, *a, **k):
        return self

    def set_(self, storage, offset, size, stride):
        return NpTensor(self.arr, storage.data_ptr() + offset * self.arr.itemsize)


def interpret_all() -> dict:
    """Every table problem's kernel run by Triton's interpreter (set TRITON_INTERPRET=1
    before calling): {name: [passed, max abs error, max |expected|]}."""
    kernels = kp.load_kernels()
    out = {}
    for e in kp.PROBLEMS:
        inputs, attrs, expected = case(e.name)
        y = np.full(expected.shape, np.nan, np.float32)
        work = e.launches(io_of(inputs, attrs, y))
        tensors = {f"in{i}": NpTensor(a) for i, a in
                   enumerate(a for a in inputs if isinstance(a, np.ndarray))}
        tensors["out"] = NpTensor(y)
        for name, size in work.scratch.items():   # poisoned, as kpair fills plan scratch
            tensors[name] = NpTensor(np.full(size // 4, np.nan, np.float32))
        for spec in work.launches:
            args = [tensors[b[1]] if b[0] != "scalar" else b[2] for _, b in spec.args]
            getattr(kernels, spec.kernel)[spec.grid](*args, **spec.constexprs)
        err = float(np.nanmax(np.abs(y - expected))) if not np.isnan(y).all() else math.inf
        out[e.name] = [bool(np.allclose(y, expected, atol=1e-5, rtol=1e-4)), err,
                       float(np.abs(expected).max())]
    return out


def _has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def _numpy_before_2_4() -> bool:
    return tuple(int(v) for v in np.__version__.split(".")[:2]) < (2, 4)


@pytest.mark.skipif(not _numpy_before_2_4(), reason="Triton 3.6's interpreter turns "
                    "1-element arrays into ints, which numpy 2.4 refuses")
@pytest.mark.skipif(not _has_triton(), reason="Triton is not installed")
def test_every_kernel_matches_numpy_in_tritons_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, __file__], capture_output=True, text=True,
                          env=env, timeout=600, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(results) == {e.name for e in kp.PROBLEMS}
    bad = {k: v for k, v in results.items() if not v[0]}
    assert not bad, bad


@pytest.mark.skipif(not _has_triton(), reason="Triton is not installed")
def test_every_kernel_compiles_for_sm90_and_its_cubin_takes_the_plan(tmp_path):
    pytest.importorskip("elftools")
    from kpair.harness import load_plan
    from kpair.plan import Plan, Target, TargetRegion, check_plan
    from kpair.snapshot import Param

    kernels = kp.load_kernels()
    for e in kp.PROBLEMS:
        inputs, attrs, expected = case(e.name)
        io = io_of(inputs, attrs, np.zeros(expected.shape, np.float32))
        for i, t in enumerate([*kp._tensors(io), io["output"]]):   # as the allocator aligns
            t["data_ptr"] = 0x7F0000000000 + (i << 24)
        work = e.launches(io)
        dest = tmp_path / e.name
        dest.mkdir()
        compiled = [kp.compile_kernel(getattr(kernels, spec.kernel), spec, io, 90, dest)
                    for spec in work.launches]
        for spec, kernel in zip(work.launches, compiled, strict=True):
            assert kernel["layout"] is not None, e.name
            assert len(kernel["layout"]) == len(spec.args) + len(kp.HIDDEN), e.name
        regions = fake_regions(io)
        path = kp.write_plan(dest / "plan", work, io, {"regions": regions}, compiled)
        plan = Plan.read(path)
        target = Target({r["name"]: TargetRegion(r["size"], r["role"]) for r in regions})
        check_plan(plan, target, [[Param(o, s, "bytes") for o, s in k["layout"]]
                                  for k in compiled])
        # kpair pair's own reading of the plan on an sm_90 range: each cubin's format,
        # architecture, kernel symbol and .nv.info layout.
        _, codes, layouts = load_plan(path, range_manifest(regions))
        assert [f for _, f in codes] == ["cubin"] * len(work.launches)
        assert [[(q.offset, q.size) for q in lay] for lay in layouts] == \
            [[tuple(x) for x in k["layout"]] for k in compiled]


def range_manifest(regions: list[dict]):
    """A CUDA sm_90 manifest holding ``regions`` (roles as given), for pair-time checks."""
    from kpair.snapshot import BlobRef, CodeObject, Kernarg, Launch, Manifest, Region

    def blob(n):
        return BlobRef("blobs/x.zst", n, "0" * 64)

    return Manifest(backend="cuda", arch="sm_90", code=CodeObject(blob(10), "cubin", "k"),
                    launch=Launch(), kernarg=Kernarg(blob(8), ()),
                    regions=tuple(Region(r["name"], int(r["address"], 16), r["size"],
                                         blob(r["size"]), blob(r["size"]), role=r["role"])
                                  for r in regions))


if __name__ == "__main__":   # the interpreter run, in its own process (TRITON_INTERPRET=1)
    print(json.dumps(interpret_all()))
