"""The MCP tools' launch plans on CUDA: a kp_add dispatch (tests/data, sm_90) as an operator,
and plans of one kernel with its own signature (c = b + a, parameters in another order)
submitted through ``Workspace.submit`` as CUDA source (nvcc), PTX text (ptxas) and Triton
source (compiled for the launch, its signature from the plan's bindings): each passes;
a plan binding a 4-byte scalar where the cubin has a pointer is refused before any launch. Needs
an sm_90 GPU, nvcc and ptxas; the Triton case needs Triton."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
DATA = Path(__file__).parent / "data"
N = 1 << 20

CUDA_SRC = r"""
extern "C" __global__ void my_add(int n, const float *b, const float *a, float *c) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"""

TRITON_SRC = """
@triton.jit
def tri_add(a_ptr, b_ptr, c_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(c_ptr + offs, tl.load(a_ptr + offs, mask=m) + tl.load(b_ptr + offs, mask=m),
             mask=m)
"""


@pytest.fixture(scope="module")
def ws(cuda, tmp_path_factory):
    from kpair.mcp.workspace import Workspace
    from kpair.pipeline import RunOptions
    from kpair.record import record_call
    from kpair.snapshot import Launch

    d = tmp_path_factory.mktemp("mcpgpu")
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(N, dtype=np.float32) for _ in range(2))
    c = np.zeros(N, np.float32)
    (d / "w").mkdir()
    record_call(DATA / "kp_add_sm90.cubin", "kp_add", [a, b, c, np.int32(N)], d / "w" / "add",
                names=["a", "b", "c", "n"], backend="cuda",
                launch=Launch(grid=(N // 256, 1, 1), block=(256, 1, 1)))
    quick = RunOptions(time_cap_s=0.5, min_blocks=4, max_blocks=8, replicates=1,
                       timeout_s=300)
    w = Workspace(d / "w", quick, quick=quick)
    yield w
    w.close()


def _plan(code: str, kernel: str, args: list[dict], block: int = 256, grid: int | None = None
          ) -> str:
    return json.dumps({"schema": "kpair.plan", "schema_version": 1, "launches": [{
        "code": code, "kernel": kernel, "grid": [grid or N // block, 1, 1],
        "block": [block, 1, 1], "args": args}]})


OWN = [{"bind": "scalar", "kind": "i32", "value": N}, {"bind": "region", "name": "b"},
       {"bind": "region", "name": "a"}, {"bind": "region", "name": "c", "access": "write"}]


def test_cuda_source_plan_passes(ws):
    out = ws.submit("add", "plan", code=_plan("k.cubin", "my_add", OWN),
                    objects={"k.cubin": {"form": "cuda", "code": CUDA_SRC}})
    assert out["status"] == "pass", out["summary"]
    assert "nvcc" in out["build"]


def test_ptx_plan_passes(ws, tmp_path):
    from kpair.toolchain import compile_cuda

    (tmp_path / "k.cu").write_text(CUDA_SRC)
    ptx = compile_cuda(tmp_path / "k.cu", tmp_path / "k.ptx", kind="ptx").read_text()
    out = ws.submit("add", "plan", code=_plan("k.cubin", "my_add", OWN),
                    objects={"k.cubin": {"form": "ptx", "code": ptx}})
    assert out["status"] == "pass", out["summary"]


def test_triton_source_plan_passes(ws):
    pytest.importorskip("triton")
    args = [{"bind": "region", "name": "a"}, {"bind": "region", "name": "b"},
            {"bind": "region", "name": "c", "access": "write"},
            {"bind": "scalar", "kind": "i32", "value": N}]
    out = ws.submit("add", "plan", code=_plan("add.py", "tri_add", args, grid=N // 1024),
                    objects={"add.py": {"form": "triton", "code": TRITON_SRC,
                                        "constants": {"BLOCK": 1024}, "num_warps": 4}})
    assert out["status"] == "pass", out["summary"]
    assert "triton.compile(tri_add" in out["build"]


def test_a_pointer_bound_to_a_small_scalar_is_refused(ws):
    from kpair.errors import KpairError

    bad = [OWN[0], {"bind": "scalar", "kind": "i32", "value": 0}, *OWN[2:]]
    with pytest.raises(KpairError, match=r"launch 0 \(my_add\) parameter 1 is 8 bytes"):
        ws.submit("add", "plan", code=_plan("k.cubin", "my_add", bad),
                  objects={"k.cubin": {"form": "cuda", "code": CUDA_SRC}})
