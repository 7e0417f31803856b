"""Capture on a real GPU: a PyTorch program captured by ``kpair capture``, replayed
byte-exact through the cuda backend; the program's exit status and a filter matching nothing.
Skips cleanly without PyTorch with CUDA, cuda-bindings or CUPTI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

PROGRAM = """
import torch
x = torch.randn(256, 1000, device="cuda")
y = torch.softmax(x, dim=-1)
torch.cuda.synchronize()
assert torch.allclose(y.sum(-1), torch.ones(256, device="cuda"))
raise SystemExit(3)
"""


def kpair(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kpair", *args], capture_output=True,
                          text=True, timeout=300)


def test_capture_softmax_then_replay_byte_exact(gpu, tmp_path):
    from kpair.backends import open_device
    from kpair.replay import Replay
    from kpair.snapshot import Snapshot

    out = tmp_path / "cap"
    proc = kpair("capture", "-o", str(out), "--kernel", "softmax", "--", sys.executable,
                 "-c", PROGRAM)
    assert proc.returncode == 3, proc.stderr      # the program's own status
    summary = json.loads((out / "capture.json").read_text())
    assert summary["exit_status"] == 3 and summary["captured"] == 1, summary["dispatches"]
    d = summary["dispatches"][0]
    assert "softmax" in d["demangled"].lower() and d["region_bytes"] <= d["segment_bytes"]
    snap = Snapshot.open(out / d["snapshot"])
    snap.verify()
    m = snap.manifest
    assert m.complete and m.code.format in ("cubin", "fatbin") and len(m.regions) >= 2
    with open_device("cuda") as dev:
        replay = Replay(dev, snap)
        kernel = dev.load(snap.code_object(), m.code.kernel_name, fmt=m.code.format)
        got = replay.run(kernel)
    assert got == replay.expected            # byte-exact against the captured post-state


def test_a_filter_that_matches_nothing_says_so(gpu, tmp_path):
    proc = kpair("capture", "-o", str(tmp_path / "none"), "--kernel", "no_such_kernel", "--",
                 sys.executable, "-c", "import torch; torch.ones(4, device='cuda').sum()")
    assert proc.returncode == 0, proc.stderr
    assert "no launch matched --kernel 'no_such_kernel'" in proc.stderr
