"""kpair optimize on a real GPU: Triton retuning of a small hand-written Triton kernel captured
from a program (``kpair optimize --top 1 -- python prog.py``), and the cuda-source strategy on
the demo's matmul.cu (nvcc options, the tiled ``-DKP_OPT=1`` variant) and on a kernel that
declares its launch geometry. Assertions are on structure and statuses: which candidate wins
is the machine's."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import resources

import numpy as np
import pytest

from kpair.release import load_index
from kpair.session import read_attempts

pytestmark = pytest.mark.gpu

BUDGET = ["--timeout", "120", "--prune-max-blocks", "12", "--prune-time-cap", "1",
          "--time-cap", "3", "--seed", "1"]

TRITON_PROGRAM = '''
import torch
import triton
import triton.language as tl


@triton.jit
def kp_add(x_ptr, y_ptr, out_ptr, n, BLOCK_SIZE: tl.constexpr):
    # kpair: grid=cdiv(n, BLOCK_SIZE)
    pid = tl.program_id(0)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0 + tl.load(y_ptr + offs,
             mask=mask), mask=mask)


n = (1 << 22) + 3
x = torch.arange(n, device="cuda", dtype=torch.float32)
y = torch.ones(n, device="cuda", dtype=torch.float32)
out = torch.empty_like(x)
for _ in range(20):   # the most expensive kernel of this program by far
    kp_add[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK_SIZE=1024, num_warps=4)
torch.cuda.synchronize()
assert torch.equal(out, x * 2 + 1)
'''

SCALE_CU = r'''
// y = a * x, one element per thread; any block size works, the grid follows it.
// kpair: kernel=kp_scale block=128,256,512,1024 grid=ceil(n/bx)
extern "C" __global__ void kp_scale(const float *x, float *y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
'''


def kpair(*args: str, timeout: int = 1500) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kpair", *args], capture_output=True,
                          text=True, timeout=timeout)


def _one_row(rel):
    index = load_index(rel)
    rows = index.operators + index.refused
    assert len(rows) == 1, rows
    return rows[0], index


def _attempts(rel, row):
    prov = rel / row.paths.provenance
    return read_attempts(prov / "attempts.jsonl"), prov


def test_triton_retuning_of_a_captured_kernel(gpu_arch, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    prog = tmp_path / "prog.py"
    prog.write_text(TRITON_PROGRAM)
    rel = tmp_path / "rel"
    proc = kpair("optimize", "-o", str(rel), "--top", "1", "--strategy", "triton", *BUDGET,
                 "--", sys.executable, str(prog))
    assert proc.returncode == 0, proc.stderr[-4000:]
    row, _ = _one_row(rel)
    assert "kp_add" in (row.kernels.ref or ""), row
    attempts, prov = _attempts(rel, row)
    prune = [a for a in attempts if a.params["stage"] == "prune"]
    assert len(prune) >= 5 and all(a.strategy == "triton" for a in prune)
    # A pointwise kernel is byte-exact under any config: every candidate that ran passes,
    # including those whose BLOCK_SIZE changed the grid through the launch override.
    assert all(a.status == "pass" for a in prune), [(a.label, a.reason) for a in prune]
    assert any(a.params["constants"].get("BLOCK_SIZE", 1024) != 1024 for a in prune)
    if row.status == "pass" and row.paths.harness:
        assert (prov / "director_validation.json").is_file() and row.director.speedup
    else:
        assert row.reason, row


def test_inductor_baseline_is_measured_beside_the_search(gpu_arch, tmp_path):
    """--inductor-baseline on a torch.compile'd program: the program captured again under
    coordinate-descent tuning and max-autotune, the operator's kernel found there by source,
    Inductor's config measured on the operator's dispatch; the index and report carry it."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from pathlib import Path

    from kpair.release.index import BaselineRecord

    prog = Path(__file__).resolve().parents[2] / "benchmarks" / "programs" / "tiny_compiled.py"
    rel = tmp_path / "rel"
    proc = kpair("optimize", "-o", str(rel), "--top", "1", "--kernel-filter", "^triton_",
                 "--strategy", "triton", "--triton-limit", "6", "--inductor-baseline",
                 *BUDGET, "--", sys.executable, str(prog))
    assert proc.returncode == 0, proc.stderr[-4000:]
    work = rel.with_name("rel.work")
    for mode in ("coordinate-descent", "max-autotune"):
        assert json.loads((work / f"capture-{mode}" / "capture.json").read_text())[
            "dispatches"], mode
    row, index = _one_row(rel)
    record = BaselineRecord.read(rel / row.paths.provenance / "baseline.json")
    assert [e.mode for e in record.entries] == ["coordinate-descent", "max-autotune"]
    for e in record.entries:  # a number, or why there is none
        assert e.speedup or e.reason, e
    assert any(e.found for e in record.entries), record.entries
    assert [b.mode for b in row.baselines] == ["coordinate-descent", "max-autotune"]
    if any(b.speedup for b in row.baselines):
        assert index.summary.baselines and "## Against Inductor's own tuning" in \
            (rel / "report.md").read_text()


def _record(kit, source, kernel, args, launch, names, tmp_path, defines):
    from kpair.optimize.strategy import KernelSource
    from kpair.record import record_call
    from kpair.toolchain import compile_cuda

    ref = compile_cuda(source, tmp_path / "ref.cubin", arch=kit.arch, defines=defines)
    snap = tmp_path / f"1_{kernel}"
    record_call(ref, kernel, args, snap, names=names, backend="cuda", launch=launch,
                provenance=KernelSource.given(source, kernel, defines).provenance())
    return snap


def test_cuda_source_on_the_demo_matmul(kit, tmp_path):
    from kpair.snapshot import Launch

    n = 1024
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((n, n), np.float32), rng.standard_normal((n, n), np.float32),
            np.zeros((n, n), np.float32), np.int32(n)]
    src = resources.files("kpair.demo") / "csrc" / "matmul.cu"
    with resources.as_file(src) as path:
        snap = _record(kit, path, "kp_matmul", args, Launch((n // 32, n // 32, 1),
                                                             (32, 32, 1)),
                       ["a", "b", "c", "n"], tmp_path, {"KP_OPT": 0})
        rel = tmp_path / "rel"
        proc = kpair("optimize", "-o", str(rel), "--snapshot", str(snap), "--strategy",
                     "cuda-source", "--variant", "KP_OPT=1", *BUDGET)
    assert proc.returncode == 0, proc.stderr[-4000:]
    row, _ = _one_row(rel)
    attempts, _ = _attempts(rel, row)
    prune = [a for a in attempts if a.params["stage"] == "prune"]
    # 2 macro sets x 6 flag sets; builds that come out as the same cubin are evaluated once
    # (-Xptxas -O3 is ptxas's default, a register cap the kernel never reaches).
    built = [(a.candidate_sha256, json.dumps(a.params.get("launch"))) for a in prune]
    assert len(set(built)) == len(built) >= 6, built
    assert all(a.build and "nvcc" in a.build for a in prune)
    tiled = [a for a in prune if a.params["defines"]["KP_OPT"] == "1"]
    assert tiled and all(a.status == "pass" for a in tiled), [a.reason for a in tiled]
    # Shared-memory tiles against global loads at n=1024: the tiled build wins here.
    assert row.status == "pass" and row.paths.harness, row.reason
    director = json.loads((rel / row.rel / "provenance" / "director_validation.json")
                          .read_text())
    assert director["params"]["defines"]["KP_OPT"] == "1"


def test_cuda_source_tries_the_block_sizes_a_kernel_declares(kit, tmp_path):
    from kpair.snapshot import Launch

    n = (1 << 22) + 7
    src = tmp_path / "scale.cu"
    src.write_text(SCALE_CU)
    x = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    snap = _record(kit, src, "kp_scale", [x, np.zeros(n, np.float32), np.float32(1.5),
                                          np.int32(n)],
                   Launch((-(-n // 256), 1, 1), (256, 1, 1)), ["x", "y", "a", "n"], tmp_path,
                   {})
    rel = tmp_path / "rel"
    proc = kpair("optimize", "-o", str(rel), "--snapshot", str(snap), "--strategy",
                 "cuda-source", "--flags=-O3", *BUDGET)
    assert proc.returncode == 0, proc.stderr[-4000:]
    row, _ = _one_row(rel)
    attempts, _ = _attempts(rel, row)
    launches = [a.params["launch"] for a in attempts if a.params["stage"] == "prune"]
    assert None in launches
    assert {tuple(x["block"]) for x in launches if x} == {(128, 1, 1), (512, 1, 1),
                                                           (1024, 1, 1)}
    assert all(a.status == "pass" for a in attempts), [a.reason for a in attempts]
