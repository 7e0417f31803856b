"""Range capture on a real GPU: small PyTorch programs marked with ``kpair.mark`` and with
``torch.cuda.nvtx.range``, captured by ``kpair capture --range``, replayed by ``kpair replay``
byte-exact, with the roles the program's tensors call for. Skips cleanly without PyTorch
with CUDA, cuda-bindings or CUPTI (the CPU half is tests/test_range_capture.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from torch_capture import capture, kpair

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from range_capture_gpu import CONV  # noqa: E402

pytestmark = pytest.mark.gpu

#: matmul + bias + ReLU; the inputs made (and one warm-up pass run) before the range, so the
#: range holds the forward's kernels only. Prints the tensors' addresses as JSON.
MARKED = """
import json, torch, kpair
torch.manual_seed(0)
x = torch.randn(64, 128, device="cuda")
w = torch.randn(128, 96, device="cuda")
b = torch.randn(96, device="cuda")
torch.relu(x @ w + b)
torch.cuda.synchronize()
with kpair.mark("fwd") as m:
    y = torch.relu(x @ w + b)
    m.outputs(y)
torch.cuda.synchronize()
print(json.dumps({k: [t.data_ptr(), t.nbytes] for k, t in dict(x=x, w=w, b=b, y=y).items()}))
"""

#: softmax under an NVTX range (no kpair import): a zero_(), the softmax's result copied into a
#: buffer that outlives the range (PyTorch copies contiguous same-type tensors with a
#: device-to-device cudaMemcpyAsync: a copy operation), its temporary freed inside the range
#: (scratch), and an in-place update.
NVTX = """
import json, torch
torch.manual_seed(0)
x = torch.randn(256, 1000, device="cuda")
acc = torch.ones(256, 1000, device="cuda")
out = torch.empty(256, 1000, device="cuda")
torch.softmax(x, dim=-1)
torch.cuda.synchronize()
with torch.cuda.nvtx.range("softmax"):
    out.zero_()
    out.copy_(torch.softmax(x, dim=-1))
    acc.add_(out)
torch.cuda.synchronize()
print(json.dumps({k: [t.data_ptr(), t.nbytes] for k, t in dict(x=x, acc=acc, out=out).items()}))
"""


def _capture(tmp_path, name: str, program: str) -> tuple[dict, dict, object]:
    (r,), tensors, (snap,), _ = capture(tmp_path / "cap", [name], program)
    return r, tensors, snap


def _role_of(manifest, address: int) -> str | None:
    for reg in manifest.regions:
        if reg.address <= address < reg.end:
            return reg.role
    for s in manifest.scratch_regions:
        if s.address <= address < s.end:
            return "scratch"
    return None


def _replay(snapshot_dir) -> dict:
    proc = kpair("replay", "--json", "--runs", "3", str(snapshot_dir))
    try:
        return json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"kpair replay printed no report (exit {proc.returncode}): "
                             f"{proc.stderr}") from None


def test_a_marked_matmul_bias_relu_range_replays_byte_exact(gpu, tmp_path):
    r, t, snap = _capture(tmp_path, "fwd", MARKED)
    m = snap.manifest
    assert r["source"] == "mark" and r["kernels"] >= 2 and m.is_range
    assert {_role_of(m, t[k][0]) for k in ("x", "w", "b")} == {"in"}
    assert _role_of(m, t["y"][0]) == "out"           # declared through m.outputs(y)
    (o,) = m.output_spans                            # the tensor's bytes, not its block
    assert (m.region(o.region).address + o.offset, o.size) == tuple(t["y"])
    report = _replay(snap.root)
    assert report["status"] == "byte-exact", report
    assert report["ops"] == len(m.operations)


def test_an_nvtx_range_with_an_in_place_update_replays_byte_exact(gpu, tmp_path):
    r, t, snap = _capture(tmp_path, "softmax", NVTX)
    m = snap.manifest
    assert r["source"] == "nvtx" and r["kernels"] >= 2 and r["ops"] >= 4
    assert _role_of(m, t["x"][0]) == "in"
    assert _role_of(m, t["acc"][0]) == "inout"       # written, outlives the range
    assert _role_of(m, t["out"][0]) == "inout"       # no outputs declared: inout
    report = _replay(snap.root)
    assert report["status"] == "byte-exact", report


def test_a_host_to_device_copy_inside_a_range_refuses_it(gpu, tmp_path):
    program = ("import torch, kpair\nx = torch.ones(4, device='cuda')\n"
               "with kpair.mark('r'):\n    y = x + torch.tensor([1.0, 2, 3, 4]).cuda()\n")
    out = tmp_path / "cap"
    proc = kpair("capture", "-o", str(out), "--range", "r", "--", sys.executable, "-c",
                 program)
    assert proc.returncode == 0, proc.stderr
    (r,) = json.loads((out / "capture.json").read_text())["ranges"]
    assert r["status"] == "refused" and "host-to-device copy" in r["reason"], r
    assert "range 'r' not captured" in proc.stderr




def test_eager_and_compiled_conv_ranges_name_the_same_live_in_memory(gpu, tmp_path):
    # The first H100 run: the compiled range "read" a weight-sized and a bias-sized buffer no
    # region of the eager range held. Every live-in region of the compiled range must be
    # memory the eager one names too (what bind needs), and the model's weights and input
    # are live-in in both.
    # CONV: KernelBench level2/1_Conv2D_ReLU_BiasAdd, small, as kernelbench_ranges.py runs it
    _, t, (eager, compiled), _ = capture(tmp_path / "cap", ["conv_eager", "conv_compiled"],
                                         CONV)
    me, mc = eager.manifest, compiled.manifest
    for k in ("x", "weight", "conv_bias", "bias"):
        assert _role_of(me, t[k][0]) == "in", (k, me.regions)
        assert _role_of(mc, t[k][0]) == "in", (k, mc.regions)
    for r in mc.regions:
        if r.role == "in":
            assert any(o.address <= r.address and r.end <= o.end for o in me.regions), r
    for m, k in ((me, "y"), (mc, "z")):
        (o,) = m.output_spans
        assert (m.region(o.region).address + o.offset, o.size) == tuple(t[k])
