"""Shared by the AMD tests: real code objects built from tests/amdgcn/*.cl with clang.

Tests that need LLVM skip with the install command when it is missing (.ci/run installs it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kpair.errors import BackendUnavailable
from kpair.toolchain import LLVM_INSTALL_HINT, compile_amdgcn, find_llvm_tool

AMDGCN_SRC = Path(__file__).parent / "amdgcn"
SOURCES = ("elementwise", "lds", "scratch", "vgprs", "calls")


def _llvm_missing() -> str | None:
    try:
        for tool in ("clang", "ld.lld", "llvm-objdump", "llvm-readelf"):
            find_llvm_tool(tool)
    except BackendUnavailable:
        return f"LLVM 19+ is not installed: {LLVM_INSTALL_HINT}"
    return None


_MISSING = _llvm_missing()
needs_llvm = pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")


def build(source: str, out_dir: Path, mcpu: str = "gfx942") -> Path:
    """tests/amdgcn/<source>.cl as a code object for ``mcpu``."""
    name = mcpu.replace(":", "_").replace("+", "p").replace("-", "m")
    return compile_amdgcn(AMDGCN_SRC / f"{source}.cl", out_dir / f"{source}-{name}.co",
                          mcpu=mcpu, flags=("-O2", f"-I{AMDGCN_SRC}"))
