"""Profiling on a real GPU: ``kpair profile`` ranks a program's kernels by GPU time (a large
matmul far above tiny adds), and ``kpair capture --top 2`` captures the first dispatch of the
two most expensive kernels, each replayed byte-exact through the cuda backend.
Skips cleanly without PyTorch with CUDA, cuda-bindings or CUPTI."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

#: An fp32 GEMM of 4096³ (milliseconds) launched 3 times, a 16M-element sum 3 times, and
#: 200 adds of 1,024 floats (microseconds each): the GEMM first by far; the adds are the
#: most launched but cheap. TF32 off keeps the GEMM a plain fp32 cuBLAS kernel.
PROGRAM = """
import torch
torch.backends.cuda.matmul.allow_tf32 = False
a = torch.randn(4096, 4096, device="cuda")
b = torch.randn(4096, 4096, device="cuda")
x = torch.randn(1024, device="cuda")
big = torch.randn(1 << 24, device="cuda")
for _ in range(3):
    c = a @ b
    s = big.sum()
for _ in range(200):
    x = x + 1.0
torch.cuda.synchronize()
print("done", float(c[0, 0]), float(s), float(x[0]))
"""


def kpair(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kpair", *args], capture_output=True,
                          text=True, timeout=600, cwd=cwd)


def test_profile_ranks_the_matmul_first(gpu, tmp_path):
    from kpair.capture.profile import read_profile

    out = tmp_path / "profile.json"
    proc = kpair("profile", "-o", str(out), "--top", "5", "--", sys.executable, "-c", PROGRAM)
    assert proc.returncode == 0, proc.stderr
    assert "done" in proc.stdout                   # the program ran, its output its own
    assert "found in sys.modules" not in proc.stderr, proc.stderr   # runpy's warning
    profile = read_profile(out)
    assert profile.exit_status == 0 and profile.dropped_records == 0
    if "CUDA_MODULE_LOADING" not in os.environ:    # profiling never asks for eager loading
        assert profile.environment["module_loading"] == "LAZY (default)"
    first = profile.kernels[0]
    assert first.launches == 3 and first.share > 0.5, profile.kernels[:4]
    assert any(word in first.demangled.lower()
               for word in ("gemm", "nvjet", "cutlass", "xmma")), first
    adds = [k for k in profile.kernels if k.launches >= 200]
    assert adds and all(k.share < first.share / 10 for k in adds), adds
    assert sum(k.share for k in profile.kernels) == pytest.approx(1.0)
    assert profile.launches >= 206 and profile.kernel_time_ns > 0
    # Times are plausible GPU times: a 4096³ fp32 GEMM takes more than 100 µs on any GPU.
    assert first.median_ns > 100_000 and first.min_ns <= first.median_ns <= first.max_ns
    print(proc.stderr)                             # the table, for the evidence log


def test_capture_top_2_captures_the_two_most_expensive_and_they_replay(gpu, tmp_path):
    from kpair.backends import open_device
    from kpair.capture.profile import read_profile
    from kpair.capture.summary import read_summary
    from kpair.replay import Replay
    from kpair.snapshot import Snapshot

    out = tmp_path / "cap"
    proc = kpair("capture", "-o", str(out), "--top", "2", "--", sys.executable, "-c", PROGRAM)
    assert proc.returncode == 0, proc.stderr
    summary = read_summary(out)
    profile = read_profile(out)                    # kept beside capture.json
    expected = [k.name for k in profile.kernels[:2]]
    assert [c.name for c in summary.profile.chosen] == expected
    assert summary.filter.names == expected and summary.filter.distinct
    captured = [d for d in summary.dispatches if d.status == "captured"]
    assert sorted(d.kernel for d in captured) == sorted(expected), summary.dispatches
    with open_device("cuda") as dev:
        for d in captured:
            snap = Snapshot.open(out / d.snapshot)
            snap.verify()
            m = snap.manifest
            replay = Replay(dev, snap)
            kernel = dev.load(snap.code_object(), m.code.kernel_name, fmt=m.code.format)
            got = replay.run(kernel)
            assert got == replay.expected, d.kernel   # byte-exact against the post-state


def test_profile_returns_the_program_status(gpu, tmp_path):
    proc = kpair("profile", "-o", str(tmp_path / "p.json"), "--", sys.executable, "-c",
                 "import torch; torch.ones(8, device='cuda').sum(); raise SystemExit(3)")
    assert proc.returncode == 3, proc.stderr
    from kpair.capture.profile import read_profile

    p = read_profile(tmp_path / "p.json")
    assert p.exit_status == 3 and p.launches >= 1
