"""Regenerable regions in CUDA capture (issue 48) on a real GPU: inputs made by seeded
torch.randn/rand/zeros (and an in-place scale) are stored as the kernels that made them, not
their bytes; the range replays byte-exact from a snapshot whose stored bytes (the code
objects and the output's post-state) are under 1% of its 2 GiB of region bytes;
``--store-bytes`` stores them as bytes. Skips cleanly without PyTorch with CUDA,
cuda-bindings or CUPTI (the CPU half is tests/test_capture_chains.py)."""

from __future__ import annotations

import json

import pytest

from torch_capture import capture, kpair, region_at

pytestmark = pytest.mark.gpu

#: x: 2 GiB of randn scaled in place, w: rand, y: zeros (the declared output, written by the
#: range). A small matmul first, so cuBLAS's handle and workspace exist before the range.
PROGRAM = """
import json, torch, kpair
torch.manual_seed(0)
x = torch.randn(ROWS, 8192, device="cuda")
x.mul_(0.5)
w = torch.rand(8192, 32, device="cuda")
y = torch.zeros(ROWS, 32, device="cuda")
torch.relu(torch.ones(64, 64, device="cuda") @ torch.ones(64, 64, device="cuda"))
torch.cuda.synchronize()
with kpair.mark("mm", outputs=[y]):
    torch.matmul(x, w, out=y)
    y.relu_()
torch.cuda.synchronize()
print(json.dumps({k: [t.data_ptr(), t.nbytes] for k, t in dict(x=x, w=w, y=y).items()}))
"""


def _capture(tmp_path, *options: str, rows: int = 65536):
    (r,), tensors, (snap,), stderr = capture(tmp_path / "cap", ["mm"],
                                             PROGRAM.replace("ROWS", str(rows)),
                                             "--max-region-bytes", "4GiB", *options)
    return r, tensors, snap, stderr


def test_inputs_made_on_the_gpu_are_stored_as_chains_and_replay_byte_exact(gpu, tmp_path):
    r, t, snap, stderr = _capture(tmp_path)
    m = snap.manifest
    x, w, y = (region_at(m, t[k][0]) for k in ("x", "w", "y"))
    made = {name: reg.regen is not None for name, reg in (("x", x), ("w", w), ("y", y))}
    assert made == {"x": True, "w": True, "y": True}, (made, r, stderr)
    assert [op.label for op in x.regen.ops][-1] != x.regen.ops[0].label   # randn, then mul_
    assert y.role == "out" and x.role == "in" and w.role == "in"
    assert r["regenerated"] >= 3 and "chain_pre" not in r   # verified after the program
    assert "regenerable region(s) verified" in stderr
    assert r["stored_bytes"] <= r["region_bytes"] // 100, r
    proc = kpair("replay", "--json", "--runs", "2", str(snap.root))
    report = json.loads(proc.stdout)
    assert report["status"] == "byte-exact", report
    print(json.dumps({k: r[k] for k in ("region_bytes", "stored_bytes", "regenerated",
                                        "capture_s")}))


def test_store_bytes_stores_every_region_as_bytes(gpu, tmp_path):
    r, _, snap, _ = _capture(tmp_path, "--store-bytes", rows=4096)
    assert r["regenerated"] == 0
    assert all(reg.regen is None for reg in snap.manifest.regions)
