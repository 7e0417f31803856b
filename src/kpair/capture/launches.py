"""One launch as CUPTI shows it, decoded: geometry, stream, attributes, the kernarg bytes.

``decode_launch`` reads a launch API's parameter struct (valid only inside the callback) into
a ``LaunchInfo`` of plain values; ``kernarg_bytes`` then rebuilds the argument blob exactly as
the driver receives it, from either form a launch may use: ``kernelParams`` (an array of
pointers to each argument, laid out by the kernel's parameter offsets) or ``extra`` (one
packed buffer: ``CU_LAUNCH_PARAM_BUFFER_POINTER``/``_SIZE`` pairs).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

from ..snapshot import LaunchAttribute
from . import cupti

ATTRIBUTE_NAMES = {
    1: "ACCESS_POLICY_WINDOW", 2: "COOPERATIVE", 3: "SYNCHRONIZATION_POLICY",
    4: "CLUSTER_DIMENSION", 5: "CLUSTER_SCHEDULING_POLICY_PREFERENCE",
    6: "PROGRAMMATIC_STREAM_SERIALIZATION", 7: "PROGRAMMATIC_EVENT", 8: "PRIORITY",
    9: "MEM_SYNC_DOMAIN_MAP", 10: "MEM_SYNC_DOMAIN", 11: "PREFERRED_CLUSTER_DIMENSION",
    12: "LAUNCH_COMPLETION_EVENT", 13: "DEVICE_UPDATABLE_KERNEL_NODE",
    14: "PREFERRED_SHARED_MEMORY_CARVEOUT",
}
_PARAM_END, _PARAM_BUFFER_POINTER, _PARAM_BUFFER_SIZE = 0, 1, 2
_MAX_EXTRA_ENTRIES = 64


class KernargError(Exception):
    """The kernarg of a launch cannot be rebuilt (no layout for a kernelParams launch)."""


@dataclass(frozen=True)
class LaunchInfo:
    api: str
    function: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_shared_bytes: int
    stream: int
    kernel_params: int
    extra: int
    attributes: tuple[LaunchAttribute, ...] = ()


def _attribute(attr_id: int, value: bytes) -> LaunchAttribute:
    return LaunchAttribute(attr_id, ATTRIBUTE_NAMES.get(attr_id, f"ATTRIBUTE_{attr_id}"),
                           bytes(value))


def decode_launch(cbid: int, params: int) -> LaunchInfo:
    """The launch whose ``*_params`` struct is at address ``params`` (callback ``cbid``)."""
    api = cupti.LAUNCH_CBIDS[cbid]
    if api.startswith("cuLaunchKernelEx"):
        p = cupti.LaunchKernelExParams.from_address(params)
        c = cupti.LaunchConfig.from_address(p.config)
        attrs = []
        if c.attrs and c.numAttrs:
            entries = (cupti.LaunchAttributeEntry * c.numAttrs).from_address(c.attrs)
            # id 0 is CU_LAUNCH_ATTRIBUTE_IGNORE: a placeholder the driver skips.
            attrs = [_attribute(e.id, bytes(e.value)) for e in entries if e.id != 0]
        return LaunchInfo(api, p.f or 0, (c.gridDimX, c.gridDimY, c.gridDimZ),
                          (c.blockDimX, c.blockDimY, c.blockDimZ), c.sharedMemBytes,
                          c.hStream or 0, p.kernelParams or 0, p.extra or 0, tuple(attrs))
    cooperative = api.startswith("cuLaunchCooperativeKernel")
    struct = cupti.LaunchCooperativeParams if cooperative else cupti.LaunchKernelParams
    p = struct.from_address(params)
    attrs = ()
    if cooperative:
        # Replay goes through cuLaunchKernelEx, where cooperation is an attribute.
        attrs = (_attribute(2, (1).to_bytes(4, "little").ljust(64, b"\0")),)
    return LaunchInfo(api, p.f or 0, (p.gridDimX, p.gridDimY, p.gridDimZ),
                      (p.blockDimX, p.blockDimY, p.blockDimZ), p.sharedMemBytes,
                      p.hStream or 0, p.kernelParams or 0,
                      0 if cooperative else (p.extra or 0), attrs)


def _extra_buffer(extra: int) -> bytes | None:
    words = (ctypes.c_void_p * (2 * _MAX_EXTRA_ENTRIES)).from_address(extra)
    pointer = size = None
    for i in range(0, len(words), 2):
        key = words[i] or 0
        if key == _PARAM_END:
            break
        value = words[i + 1] or 0
        if key == _PARAM_BUFFER_POINTER:
            pointer = value
        elif key == _PARAM_BUFFER_SIZE and value:
            size = ctypes.c_size_t.from_address(value).value
    if pointer is None or size is None:
        return None
    return ctypes.string_at(pointer, size)


def kernarg_bytes(launch: LaunchInfo, layout: Sequence[tuple[int, int]] | None
                  ) -> tuple[bytes, list[tuple[int, int]], str]:
    """(blob, layout, how): the argument bytes as launched and the layout to record.

    Without a driver layout, an ``extra`` buffer is recorded as one opaque parameter; a
    ``kernelParams`` launch cannot be rebuilt at all (the sizes are not in the call).
    """
    if launch.extra:
        blob = _extra_buffer(launch.extra)
        if blob is not None:
            if layout and max(o + s for o, s in layout) <= len(blob):
                return blob, list(layout), "extra buffer"
            return blob, ([(0, len(blob))] if blob else []), "extra buffer (opaque)"
    if not launch.kernel_params:
        if layout:
            raise KernargError("the launch passed neither kernelParams nor an extra buffer, "
                               f"but the kernel takes {len(layout)} parameters")
        return b"", [], "no parameters"
    if layout is None:
        raise KernargError("the kernel's parameter layout is unknown (cuFuncGetParamInfo and "
                           "cuKernelGetParamInfo failed), so its kernelParams cannot be read")
    if not layout:
        return b"", [], "no parameters"
    blob = bytearray(max(o + s for o, s in layout))
    pointers = (ctypes.c_void_p * len(layout)).from_address(launch.kernel_params)
    for i, (offset, size) in enumerate(layout):
        if not pointers[i]:
            raise KernargError(f"kernelParams[{i}] is NULL")
        blob[offset:offset + size] = ctypes.string_at(pointers[i], size)
    return bytes(blob), list(layout), "kernelParams"
