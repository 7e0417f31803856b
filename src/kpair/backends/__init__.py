"""Backend registry: which backend modules exist, opened lazily by name.

Importing this package imports no driver; ``open_device("cuda")`` is where cuda-bindings is
first imported, and a missing binding raises BackendUnavailable with the exact install command.
"""

from __future__ import annotations

import importlib
import re

from ..errors import UsageError
from .base import Device, Kernel, Mapping

#: backend name → module path; each module defines ``open_device(**options) -> Device``.
BACKENDS = {
    "host": "kpair.backends.host",
    "cuda": "kpair.backends.cuda",
    "hip": "kpair.backends.hip",
}


#: backend name → the architecture names its snapshots and harnesses may declare.
ARCHITECTURES = {
    "host": r"x86_64|aarch64|ppc64le|riscv64|i386",
    "cuda": r"sm_[0-9]{2,3}[a-z]?",
    "hip": r"gfx[0-9a-f]{3,4}",
}


def arch_accepted(backend: str, arch: str) -> bool:
    """Whether ``arch`` names an architecture of ``backend`` (not whether this machine has it:
    that is checked against the device when the harness runs)."""
    pattern = ARCHITECTURES.get(backend)
    return pattern is not None and re.fullmatch(pattern, arch) is not None


def open_device(name: str, **options: object) -> Device:
    if name not in BACKENDS:
        raise UsageError(f"unknown backend {name!r}; known: {', '.join(sorted(BACKENDS))}")
    module = importlib.import_module(BACKENDS[name])
    return module.open_device(**options)


def device_count(name: str) -> int:
    """How many devices of backend ``name`` this process can open (ordinals 0..n-1)."""
    if name not in BACKENDS:
        raise UsageError(f"unknown backend {name!r}; known: {', '.join(sorted(BACKENDS))}")
    return importlib.import_module(BACKENDS[name]).device_count()


__all__ = ["ARCHITECTURES", "BACKENDS", "Device", "Kernel", "Mapping", "arch_accepted",
           "device_count", "open_device"]
