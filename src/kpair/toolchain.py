"""Building code objects: host shared objects with ``cc``, cubins with nvcc, AMDGPU code
objects with clang (``compile_amdgcn``).

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


# --------------------------------------------------------------------------- AMDGPU (LLVM)

#: What installs the LLVM tools the AMD pieces use (Debian 12 and later have them in main).
LLVM_INSTALL_HINT = "apt-get install clang-19 lld-19 llvm-19"
#: Versioned names first: an unversioned ``clang`` may be older than AMDGPU code object v5.
_LLVM_VERSIONS = ("-19", "-20", "-21", "-22", "")


def find_llvm_tool(name: str) -> str:
    """The path of an LLVM tool (``clang``, ``llvm-objdump``, ``llvm-readelf``, ``llvm-mc``,
    ``ld.lld``) of LLVM 19 or later; ``KPAIR_LLVM_BIN`` names a directory to look in first
    (ROCm's is /opt/rocm/llvm/bin)."""
    where = os.environ.get("KPAIR_LLVM_BIN")
    if where and shutil.which(name, path=where):
        return shutil.which(name, path=where)  # type: ignore[return-value]
    for suffix in _LLVM_VERSIONS:
        found = shutil.which(name + suffix)
        if found:
            return found
    found = shutil.which(name, path="/opt/rocm/llvm/bin")
    if found:
        return found
    raise BackendUnavailable(f"{name} (LLVM 19 or later) was not found: {LLVM_INSTALL_HINT}, "
                             "or set KPAIR_LLVM_BIN to a directory holding it")


#: clang's language flags per source suffix: OpenCL C needs no device library when the
#: kernels use amdgcn builtins (``__builtin_amdgcn_workitem_id_x`` ...) instead of libclc.
_AMDGCN_LANGUAGES = {".cl": ("-x", "cl", "-cl-std=CL2.0", "-nogpulib"),
                     ".s": ("-x", "assembler"), ".ll": ("-x", "ir")}


def compile_amdgcn(source: str | os.PathLike, out: str | os.PathLike, *, mcpu: str = "gfx942",
                   flags: Sequence[str] = ("-O2",), defines: dict | None = None) -> Path:
    """Build an AMDGPU code object (hsaco) at ``out`` from OpenCL C, LLVM IR or assembly with
    clang for ``amdgcn-amd-amdhsa``; ``mcpu`` is a target ID (``gfx942:sramecc+:xnack-``)."""
    suffix = Path(source).suffix
    if suffix not in _AMDGCN_LANGUAGES:
        raise KpairError(f"cannot build {source}: expected one of "
                         f"{', '.join(_AMDGCN_LANGUAGES)}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [find_llvm_tool("clang"), "-target", "amdgcn-amd-amdhsa", f"-mcpu={mcpu}",
           *_AMDGCN_LANGUAGES[suffix], *flags,
           *(f"-D{k}={v}" for k, v in (defines or {}).items()), "-o", str(out), str(source)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise KpairError(f"compiling {source} failed:\n$ {' '.join(cmd)}\n{proc.stderr}")
    return out
