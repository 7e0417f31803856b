"""Building host code objects with the system C compiler (``cc``).

Used by tests, ``kpair demo`` and anyone who wants a host pair from C sources. Builds are
deterministic flags-wise: ``-ffp-contract=off`` keeps the compiler from fusing a*b+c into
an FMA in one build and not in the other, which would make honest pairs differ in the last
bit; no ``-march=native``, so a code object runs on any machine of the architecture.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from .errors import BackendUnavailable, KpairError

BASE_FLAGS = ("-shared", "-fPIC", "-ffp-contract=off", "-fno-fast-math", "-std=c11")


def find_cc() -> str:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    raise BackendUnavailable("no C compiler found (set CC, or install one: "
                             "apt-get install gcc)")


def compile_shared(source: str | os.PathLike, out: str | os.PathLike, *,
                   flags: Sequence[str] = ("-O2",), defines: dict | None = None) -> Path:
    """Compile one C file into a shared object at ``out``; the error carries the compiler's."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [find_cc(), *BASE_FLAGS, *flags,
           *(f"-D{k}={v}" for k, v in (defines or {}).items()),
           "-o", str(out), str(source), "-lm"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise KpairError(f"compiling {source} failed:\n$ {' '.join(cmd)}\n{proc.stderr}")
    return out


# --------------------------------------------------------------------------- CUDA (nvcc)

#: What ``compile_cuda`` can produce, and nvcc's flag for it.
CUDA_OUTPUTS = {"cubin": "-cubin", "ptx": "-ptx", "fatbin": "-fatbin"}


def find_nvcc() -> str:
    for name in (os.environ.get("NVCC"), "nvcc", "/usr/local/cuda/bin/nvcc"):
        if name and shutil.which(name):
            return name
    raise BackendUnavailable("nvcc (the CUDA compiler) was not found: set NVCC or install "
                             "the CUDA toolkit")


def compile_cuda(source: str | os.PathLike, out: str | os.PathLike, *, arch: str = "sm_90",
                 kind: str = "cubin", flags: Sequence[str] = ("-O3",),
                 defines: dict | None = None) -> Path:
    """Compile one .cu file into a cubin, PTX or fatbin at ``out`` with nvcc.

    ``arch`` is a real architecture (``sm_90``); for PTX its virtual twin (``compute_90``)
    is used. Kernels meant for kpair should be ``extern "C"`` so their names are plain.
    """
    if kind not in CUDA_OUTPUTS:
        raise KpairError(f"kind must be one of {', '.join(CUDA_OUTPUTS)}, not {kind!r}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    target = arch.replace("sm_", "compute_") if kind == "ptx" else arch
    cmd = [find_nvcc(), CUDA_OUTPUTS[kind], f"-arch={target}", *flags,
           *(f"-D{k}={v}" for k, v in (defines or {}).items()), "-o", str(out), str(source)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise KpairError(f"compiling {source} failed:\n$ {' '.join(cmd)}\n{proc.stderr}")
    return out


def compile_cubin(source: str | os.PathLike, out: str | os.PathLike, *, arch: str = "sm_90",
                  flags: Sequence[str] = ("-O3",)) -> Path:
    """``nvcc -cubin -arch=<arch> -O3``: the cubin the cuda backend loads."""
    return compile_cuda(source, out, arch=arch, kind="cubin", flags=flags)
