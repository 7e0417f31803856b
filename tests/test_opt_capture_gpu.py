"""Captured candidates and PTX/fatbin plans on a real GPU (the CPU half is
tests/test_opt_capture.py). One PyTorch program marks an eager forward and its
``torch.compile`` forward over the same tensors (``kpair.mark``, outputs declared); both are
captured in one run (``kpair capture --range eager --range compiled``), the compiled range is
bound to the eager one (``kpair pair --opt-capture``) and judged under KernelBench's own
tolerance; a plan launching kp_add from PTX and from a fatbin (tests/data) runs against a
recorded CUDA dispatch. Skips cleanly without PyTorch with CUDA, cuda-bindings or CUPTI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import run_json
from torch_capture import DATA, capture, forwards, kpair, record_kp_add

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def torch_gpu(cuda, gpu):
    """An sm_90 device (``cuda``) that capture can run on (conftest's ``gpu``)."""


@pytest.mark.parametrize("body,cols", [("torch.relu(x * w + b)", 512),
                                       ("torch.relu(x @ w + b)", 384)],
                         ids=["elementwise", "matmul"])
def test_the_compiled_forward_bound_to_the_eager_one_passes(torch_gpu, tmp_path, body, cols):
    # elementwise: three ATen kernels against one Triton kernel; with a matmul: the compiled
    # range calls cuBLAS too, its parameter block's pointers relocated
    snaps = capture(tmp_path / "cap", ["eager", "compiled"],
                    forwards(body, 512, 512, cols)).snaps
    eager, compiled = (s.root for s in snaps)
    y = next(r for r in snaps[0].manifest.regions if r.role == "out")
    policy = tmp_path / "policy.json"   # KernelBench's own: atol = rtol = 1e-2
    policy.write_text(json.dumps({
        "schema": "kpair.validation_policy", "schema_version": 1, "default": "byte-exact",
        "tolerances": [{"region": y.name, "range": [0, y.size], "dtype": "float32",
                        "criterion": "allclose", "atol": 1e-2, "rtol": 1e-2}]}))
    h = tmp_path / "H"
    proc = kpair("pair", str(eager), "--opt-capture", str(compiled), "--policy", str(policy),
                 "-o", str(h), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["range_ops"] >= 2 and doc["plan_launches"] >= 1
    note = json.loads((h / "plan" / "opt.plan.json").read_text())["note"]
    assert f"-> {y.name} (declared output)" in note, note
    proc = kpair("run", str(h), "--json", "--time-cap", "5")
    result = json.loads(proc.stdout)
    assert result["status"] == "pass", result.get("correctness") or result.get("error")
    assert all(t["passed"] is not False for t in result["trust"].values())


@pytest.mark.parametrize("fmt", ["ptx", "fatbin"])
def test_a_plan_of_ptx_or_a_fatbin_runs_on_cuda(cuda, tmp_path, fmt):
    from kpair.harness import create_harness, fatbin_members
    from kpair.pipeline import RunOptions

    n = 1 << 20
    a, b, c = record_kp_add(tmp_path / "s", n)
    np.testing.assert_array_equal(c, a + b)
    fatbin = (DATA / "kp_add_sm90.fatbin").read_bytes()
    d = tmp_path / "plan"
    d.mkdir()
    ptx = dict((k, m) for k, _, m in fatbin_members(fatbin))["ptx"]
    # nvcc 13 wrote PTX ISA 9.0; kp_add needs nothing past 7.8 (sm_90's first), which every
    # CUDA 12 driver JIT-compiles.
    (d / f"k.{fmt}").write_bytes(fatbin if fmt == "fatbin" else
                                 ptx.replace(b".version 9.0", b".version 7.8"))
    (d / "opt.plan.json").write_text(json.dumps({
        "schema": "kpair.plan", "schema_version": 1, "launches": [{
            "code": f"k.{fmt}", "kernel": "kp_add", "grid": [n // 128, 1, 1],
            "block": [128, 1, 1], "args": [
                {"bind": "region", "name": "a"}, {"bind": "region", "name": "b"},
                {"bind": "region", "name": "c", "access": "write"},
                {"bind": "scalar", "kind": "i32", "value": n}]}]}))
    h = create_harness(tmp_path / "s", tmp_path / "H", plan=d / "opt.plan.json")
    r = run_json(h.root, RunOptions(time_cap_s=2.0, timeout_s=300))
    assert r["status"] == "pass", r.get("correctness") or r.get("error")
    assert r["replay"]["plan_launches"] == 1
