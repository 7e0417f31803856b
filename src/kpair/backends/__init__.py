"""Backend registry: which backend modules exist, opened lazily by name.

Importing this package imports no driver; ``open_device("cuda")`` is where cuda-bindings is
first imported, and a missing binding raises BackendUnavailable with the exact install command.
"""

from __future__ import annotations

import importlib

from ..errors import UsageError
from .base import Device, Kernel, Mapping

#: backend name → module path; each module defines ``open_device(**options) -> Device``.
BACKENDS = {
    "host": "kpair.backends.host",
    "cuda": "kpair.backends.cuda",
    "hip": "kpair.backends.hip",
}


def open_device(name: str, **options: object) -> Device:
    if name not in BACKENDS:
        raise UsageError(f"unknown backend {name!r}; known: {', '.join(sorted(BACKENDS))}")
    module = importlib.import_module(BACKENDS[name])
    return module.open_device(**options)


__all__ = ["BACKENDS", "Device", "Kernel", "Mapping", "open_device"]
