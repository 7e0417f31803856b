"""What the benchmark scripts share: the CUDA test kernels they build, and how they print."""

from __future__ import annotations

import json
from pathlib import Path

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


def emit(doc: dict, path: Path | None) -> None:
    """Print ``doc`` as indented JSON, and write it to ``path`` when one is given."""
    text = json.dumps(doc, indent=1)
    if path:
        path.write_text(text + "\n")
    print(text)
