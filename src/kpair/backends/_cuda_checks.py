"""The cuda backend's check kernels: ``kernels/checks.cu`` and the PTX built from it.

``kp_diff`` compares two byte ranges (or one against a repeated 32-bit word) and digests one
of them in a single pass: bytes that differ, the first differing offset, and ``digest64``
(``kpair.backends.base``) under a key. ``kp_copy`` runs a table of device-to-device copies in
one launch (the batched restore). The driver JIT-compiles the PTX for the device at load
(``cuModuleLoadData``), so no compiler is needed at run time. ``kernels/checks.ptx`` targets
compute_75; its first line names the sha256 of the source it was built from, and
``python -m kpair.backends._cuda_checks`` (needs nvcc) rebuilds it.
"""

from __future__ import annotations

import hashlib
from importlib import resources

#: nvcc command that produces the PTX from the source.
NVCC = ("nvcc", "-arch=compute_75", "-ptx")
_KERNELS = resources.files("kpair.backends") / "kernels"


def source() -> str:
    return (_KERNELS / "checks.cu").read_text()


def ptx() -> str:
    return (_KERNELS / "checks.ptx").read_text()


def ptx_source_sha256() -> str:
    """The sha256 of the source the shipped PTX says it was built from."""
    return ptx().split("sha256 ", 1)[1].split(")", 1)[0]


def _regenerate() -> None:  # pragma: no cover - a maintainer's tool, needs nvcc
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        cu, out = Path(tmp) / "checks.cu", Path(tmp) / "checks.ptx"
        cu.write_text(source())
        subprocess.run([*NVCC, str(cu), "-o", str(out)], check=True)
        digest = hashlib.sha256(source().encode()).hexdigest()
        target = Path(str(_KERNELS / "checks.ptx"))
        target.write_text(f"// kpair: built from checks.cu (sha256 {digest}) by "
                          f"{' '.join(NVCC)}\n" + out.read_text())
    sys.stdout.write(f"regenerated PTX from source {digest[:12]}\n")


if __name__ == "__main__":  # pragma: no cover
    _regenerate()
