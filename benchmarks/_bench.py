"""What the benchmark scripts share: the CUDA test kernels they build, the dispatches they
record with them, and how they print."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def cuda_test_kernels(tmp: Path) -> tuple[str, Path, Path]:
    """(arch, axpy cubin, tiled GEMM cubin) built from tests/cuda for this machine's GPU."""
    from kpair.backends import open_device
    from kpair.toolchain import compile_cubin

    with open_device("cuda") as dev:
        arch = dev.arch()
    src = ROOT / "tests" / "cuda"
    return (arch, compile_cubin(src / "elementwise.cu", tmp / "elementwise.cubin", arch=arch),
            compile_cubin(src / "gemm.cu", tmp / "gemm.cubin", arch=arch))


def record_axpy(cubin: Path, out: Path, n: int, rng: np.random.Generator):
    """A recorded y = 1.5 x + y over ``n`` random floats (tests/cuda/elementwise.cu)."""
    from kpair.record import record_call
    from kpair.snapshot import Launch

    x, y = rng.standard_normal(n, np.float32), rng.standard_normal(n, np.float32)
    return record_call(cubin, "axpy", [x, y, np.float32(1.5), np.int32(n)], out,
                       backend="cuda", launch=Launch((n // 256, 1, 1), (256, 1, 1)),
                       names=["x", "y", "a", "n"])


def record_gemm(cubin: Path, out: Path, m: int, rng: np.random.Generator,
                kernel: str = "gemm_tiled"):
    """A recorded ``m``x``m`` fp32 GEMM of random matrices (tests/cuda/gemm.cu), 16x16 blocks."""
    from kpair.record import record_call
    from kpair.snapshot import Launch

    a, b = rng.standard_normal((m, m), np.float32), rng.standard_normal((m, m), np.float32)
    return record_call(cubin, kernel, [a, b, np.zeros((m, m), np.float32)] + [np.int32(m)] * 3,
                       out, backend="cuda", launch=Launch((m // 16, m // 16, 1), (16, 16, 1)),
                       names=["A", "B", "C", "M", "N", "K"])


def device_line() -> str:
    """The GPU's name, driver and UUID (nvidia-smi), or the host's processor."""
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,uuid",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        import platform
        return f"host {platform.processor() or platform.machine()}"


@contextlib.contextmanager
def hogs(n: int):
    """``n`` busy-loop processes for the duration of the block."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def emit(doc: dict, path: Path | None) -> None:
    """Print ``doc`` as indented JSON, and write it to ``path`` when one is given."""
    text = json.dumps(doc, indent=1)
    if path:
        path.write_text(text + "\n")
    print(text)
