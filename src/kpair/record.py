"""Record a real call of a kernel on numpy inputs into a snapshot, without a capture tool.

``record_call(lib, "saxpy", [n, a, x, y], out)`` copies every numpy array argument into one
freshly mapped arena on the device (so the captured regions form one compact span, with gaps
between them for guard bands), launches the kernel there, stores the arena's pre- and
post-state per array as regions and the scalars in the kernarg, and copies the results back
into the caller's arrays — the call really happens. Any backend works: a C function in a
shared object on ``host``, an nvcc-built cubin on ``cuda``, a clang-built hsaco on ``hip``
(its layout must match the code object's metadata: AbiMismatch otherwise). Used by tests,
examples and ``kpair demo``; real programs are captured with ``kpair capture`` instead.
"""

from __future__ import annotations

import os
import struct
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from . import __version__
from ._util import utc_now
from .backends import open_device
from .errors import AbiMismatch, UsageError
from .snapshot import (
    DTYPE_HINTS,
    SCALAR_FORMATS,
    CodeObject,
    Kernarg,
    Launch,
    Manifest,
    Param,
    Region,
    Snapshot,
    SnapshotWriter,
    detect_format,
)

#: numpy dtype → kernarg kind for scalar arguments.
_SCALAR_KINDS = {
    np.dtype(np.int8): "i8", np.dtype(np.uint8): "u8", np.dtype(np.int16): "i16",
    np.dtype(np.uint16): "u16", np.dtype(np.int32): "i32", np.dtype(np.uint32): "u32",
    np.dtype(np.int64): "i64", np.dtype(np.uint64): "u64", np.dtype(np.float32): "f32",
    np.dtype(np.float64): "f64",
}

#: Arena layout: arrays start on this alignment, separated by at least GAP bytes.
ALIGN = 256
GAP = 256


def _scalar(value: object, index: int) -> tuple[str, object]:
    if isinstance(value, np.generic):
        kind = _SCALAR_KINDS.get(value.dtype)
        if kind is None:
            raise UsageError(f"argument {index}: unsupported scalar dtype {value.dtype}")
        return kind, value.item()
    if isinstance(value, bool):
        raise UsageError(f"argument {index}: pass booleans as np.int32 or np.uint8")
    if isinstance(value, int):
        return "i64", value
    if isinstance(value, float):
        return "f64", value
    raise UsageError(f"argument {index}: expected a numpy array or a scalar, "
                     f"got {type(value).__name__}")


def record_call(library: str | os.PathLike, symbol: str, args: Sequence[object],
                out: str | os.PathLike, *, names: Sequence[str] | None = None,
                backend: str = "host", launch: Launch | None = None,
                provenance: dict | None = None, device_options: dict | None = None) -> Snapshot:
    """Launch ``symbol`` from the code object ``library`` on ``args`` and snapshot the call."""
    image = Path(library).read_bytes()
    fmt = detect_format(image)
    launch = launch or Launch()
    if names is not None and len(names) != len(args):
        raise UsageError(f"{len(names)} names for {len(args)} arguments")
    arrays = [(i, a) for i, a in enumerate(args) if isinstance(a, np.ndarray)]
    for i, a in arrays:
        if not a.flags.c_contiguous or a.nbytes == 0:
            raise UsageError(f"argument {i}: arrays must be C-contiguous and non-empty")

    offsets, cursor = {}, GAP
    for i, a in arrays:
        offsets[i] = cursor
        cursor = -(-(cursor + a.nbytes + GAP) // ALIGN) * ALIGN
    writer = SnapshotWriter(out)
    with open_device(backend, **(device_options or {})) as dev:
        # Relocating the range [0, cursor) maps a fresh arena anywhere: delta is its base.
        base = dev.map([(0, cursor)], relocate=True).delta
        kernel = dev.load(image, symbol, fmt=fmt)

        params, kernarg, offset = [], bytearray(), 0
        for i, a in enumerate(args):
            name = names[i] if names else f"arg{i}"
            if isinstance(a, np.ndarray):
                kind, value = "pointer", base + offsets[i]
                dev.write(value, a.tobytes())
            else:
                kind, value = _scalar(a, i)
            size = struct.calcsize(SCALAR_FORMATS[kind])
            offset = -(-offset // size) * size
            kernarg += bytes(offset - len(kernarg)) + struct.pack(SCALAR_FORMATS[kind], value)
            params.append(Param(offset, size, kind, name))
            offset += size
        kernarg = bytes(kernarg)
        layout = kernel.param_layout() if backend == "hip" else None
        if layout is not None and layout != [(p.offset, p.size) for p in params]:
            raise AbiMismatch(f"kernel {symbol!r} takes (offset, size) {layout}; the "
                              f"arguments give {[(p.offset, p.size) for p in params]}")

        dev.launch(kernel, launch, kernarg, params)
        regions = []
        for i, a in arrays:
            address = base + offsets[i]
            post = dev.read(address, a.nbytes)
            regions.append(Region(params[i].name, address, a.nbytes,
                                  writer.put(a.tobytes()), writer.put(post),
                                  str(a.dtype) if str(a.dtype) in DTYPE_HINTS else None))
            np.copyto(a, np.frombuffer(post, dtype=a.dtype).reshape(a.shape))
        env, dev_arch = dev.environment(), dev.arch()

    manifest = Manifest(
        backend=backend, arch=dev_arch,
        code=CodeObject(writer.put(image), fmt, symbol),
        launch=launch, kernarg=Kernarg(writer.put(kernarg), tuple(params)),
        regions=tuple(regions), environment=env,
        provenance={"recorded_by": f"kpair {__version__} record_call",
                    "library": str(library), "command": list(sys.argv),
                    "time": utc_now(),
                    **(provenance or {})})
    return writer.finish(manifest)
