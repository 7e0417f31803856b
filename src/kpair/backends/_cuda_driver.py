"""What the cuda backend hands the driver: checked calls, and the byte layouts it builds.

``Driver`` wraps ``cuda.bindings.driver`` (imported lazily, by ``load_driver``) so that every
call is checked: a failure becomes ``DriverError(call, CUDA_ERROR_NAME, explanation)``.
The rest is pure and runs without a GPU, so CPU-only CI tests it: the architecture a cubin
was built for (read from its ELF header), the one virtual-address reservation that covers
every captured range, the ``kernelParams`` pointer array into a kernarg blob, and the
``CUlaunchAttribute`` bytes of a launch's captured attributes. ``nvml_facts`` adds what only
NVML (nvidia-ml-py, optional) knows: the driver's version string and the clocks.
"""

from __future__ import annotations

import contextlib
import ctypes
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import BackendUnavailable, SnapshotFormatError
from ..placement import granular_spans
from ..snapshot import LaunchAttribute, Param
from ._checked import CheckedCalls, stream_roles

INSTALL_HINT = "pip install 'kpair[cuda]'"

#: Reservations are aligned to 1 GiB: a delta that is a multiple of it keeps every alignment
#: a kernel can rely on, and the H200 probe got such a reservation at its requested address.
GIB = 1 << 30

#: sizeof(CUlaunchAttribute): u32 id, 4 pad bytes, 64-byte CUlaunchAttributeValue union.
ATTRIBUTE_BYTES, ATTRIBUTE_VALUE_BYTES = 72, 64

#: Attribute ids that carry handles valid only in the capturing process (events, graph
#: nodes): replaying them would hand the driver a stale handle, so replay leaves them out.
#: They order work *between* kernels, which an isolated replay of one kernel does not have.
DROPPED_ATTRIBUTES = {7: "PROGRAMMATIC_EVENT", 12: "LAUNCH_COMPLETION_EVENT",
                      13: "DEVICE_UPDATABLE_KERNEL_NODE"}
#: ACCESS_POLICY_WINDOW's value starts with a device pointer (base_ptr), moved on relocation.
ACCESS_POLICY_WINDOW = 1

_EM_CUDA = 190


def load_driver():
    """Import ``cuda.bindings.driver``; BackendUnavailable with the install hint if missing."""
    try:
        from cuda.bindings import driver
    except ImportError as e:
        raise BackendUnavailable(f"the cuda backend needs NVIDIA's cuda-bindings, which cannot "
                                 f"be imported ({e}): {INSTALL_HINT}") from None
    return driver


class Driver(CheckedCalls):
    """Checked access to the driver: ``drv("cuMemAlloc", size)`` returns the call's values."""

    ROLES = stream_roles("cuda")

    def __init__(self, module):
        super().__init__(module, module.CUresult.CUDA_SUCCESS)

    def error_name(self, err) -> tuple[str, str]:
        try:
            e1, name = self.mod.cuGetErrorName(err)
            e2, text = self.mod.cuGetErrorString(err)
        except Exception:  # noqa: BLE001 - an unknown code still gets reported
            return f"CUresult {int(err)}", ""
        name = name.decode() if e1 == self.success and name else f"CUresult {int(err)}"
        text = text.decode() if e2 == self.success and text else ""
        return name, text


def c_string(raw: bytes | str) -> str:
    """A fixed-size C char buffer as the bindings return it: up to the first NUL, stripped."""
    text = raw.decode(errors="replace") if isinstance(raw, (bytes, bytearray)) else str(raw)
    return text.split("\0", 1)[0].strip()


# --------------------------------------------------------------------------- code objects


def cubin_arch(image: bytes) -> str | None:
    """``sm_XY`` a cubin was built for, from its ELF header; None if ``image`` is no cubin.

    The SM number sits in ``e_flags``: bits 8-15 from ELF ABI version 8 on (CUDA 12.8+
    toolchains), bits 0-7 before.
    """
    if len(image) < 52 or image[:4] != b"\x7fELF" or image[4] != 2:
        return None
    endian = "<" if image[5] == 1 else ">"
    (machine,) = struct.unpack_from(endian + "H", image, 18)
    if machine != _EM_CUDA:
        return None
    (flags,) = struct.unpack_from(endian + "I", image, 48)
    sm = (flags >> 8) & 0xFF if image[8] >= 8 else flags & 0xFF
    return f"sm_{sm}" if sm else None


def ptx_target(image: bytes) -> str | None:
    """The ``.target`` of a PTX image (``sm_90``), or None."""
    for line in image[:8192].decode("ascii", "replace").splitlines():
        parts = line.split()
        if parts[:1] == [".target"] and len(parts) > 1:
            return parts[1].split(",")[0]
    return None


# --------------------------------------------------------------------------- placement


@dataclass(frozen=True)
class SpanPlan:
    """One reservation ``[base, base + size)`` holding every granular span to be mapped."""

    base: int
    size: int
    spans: tuple[tuple[int, int], ...]

    @property
    def mapped_bytes(self) -> int:
        return sum(hi - lo for lo, hi in self.spans)


def plan_span(ranges: Sequence[tuple[int, int]], granule: int, align: int = GIB) -> SpanPlan:
    """The reservation the probe got exactly: from the lowest range rounded down to ``align``,
    its size a multiple of ``align``, covering the ``granule``-aligned spans of ``ranges``."""
    if not ranges:
        raise ValueError("no ranges to place")
    if align % granule:
        raise ValueError(f"alignment {align} is not a multiple of the granularity {granule}")
    spans = granular_spans(ranges, granule)
    base = spans[0][0] // align * align
    size = -(-(spans[-1][1] - base) // align) * align
    return SpanPlan(base, size, tuple(spans))


# --------------------------------------------------------------------------- launch inputs


class ParamArray:
    """A kernarg blob in pinned-down host memory and the ``void*[]`` pointing into it.

    ``address`` is what ``cuLaunchKernelEx`` takes as ``kernelParams``: entry i points at
    parameter i's offset in the blob, and the driver copies each parameter's size from there.
    The object owns both buffers; keep it alive until the launch call returns.
    """

    def __init__(self, kernarg: bytes, params: Sequence[Param]):
        end = max((p.offset + p.size for p in params), default=0)
        if end > len(kernarg):
            raise SnapshotFormatError(f"parameter layout ends at byte {end}, the kernarg blob "
                                      f"holds {len(kernarg)}", field="kernarg.params")
        self.blob = ctypes.create_string_buffer(bytes(kernarg), max(len(kernarg), 1))
        base = ctypes.addressof(self.blob)
        self.pointers = (ctypes.c_void_p * max(len(params), 1))(
            *[base + p.offset for p in params])
        self.count = len(params)
        self.address = ctypes.addressof(self.pointers) if params else 0
        # Without a layout the blob goes whole through ``extra`` (BUFFER_POINTER/SIZE/END).
        self._size = ctypes.c_size_t(len(kernarg))
        self._extra = (ctypes.c_void_p * 5)(1, base, 2, ctypes.addressof(self._size), 0)
        self.extra = 0 if params or not kernarg else ctypes.addressof(self._extra)


def attribute_bytes(attr: LaunchAttribute, *, lo: int = 0, hi: int = 0, delta: int = 0) -> bytes:
    """The 72-byte ``CUlaunchAttribute`` for a captured attribute (value zero-padded to 64).

    An access-policy window whose base pointer lies in the captured span [lo, hi) moves with
    the regions when they are relocated by ``delta``.
    """
    if len(attr.value) > ATTRIBUTE_VALUE_BYTES:
        raise SnapshotFormatError(f"launch attribute {attr.name or attr.id} has a "
                                  f"{len(attr.value)}-byte value; CUlaunchAttributeValue holds "
                                  f"{ATTRIBUTE_VALUE_BYTES}", field="launch.attributes")
    value = bytearray(attr.value.ljust(ATTRIBUTE_VALUE_BYTES, b"\0"))
    if attr.id == ACCESS_POLICY_WINDOW and delta:
        (ptr,) = struct.unpack_from("<Q", value)
        if lo <= ptr < hi:
            struct.pack_into("<Q", value, 0, (ptr + delta) % 2**64)
    return struct.pack("<I4x", attr.id) + bytes(value)


def replayed_attributes(attrs: Sequence[LaunchAttribute]) -> list[LaunchAttribute]:
    """The captured attributes that replay passes on (see DROPPED_ATTRIBUTES)."""
    return [a for a in attrs if a.id not in DROPPED_ATTRIBUTES]


# --------------------------------------------------------------------------- NVML


def nvml_facts(bus_id: str | None, ordinal: int) -> dict:
    """Driver version and clocks through NVML (nvidia-ml-py), when it can be imported."""
    try:
        import pynvml
    except ImportError:
        return {"nvml": "unavailable: pip install nvidia-ml-py"}
    try:
        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - NVML is optional: say why it is missing
        return {"nvml": f"unavailable: {e}"}
    try:
        handle = None
        if bus_id:
            try:
                handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)
            except Exception:  # noqa: BLE001 - fall back to the ordinal
                handle = None
        if handle is None:
            handle = pynvml.nvmlDeviceGetHandleByIndex(ordinal)
        version = pynvml.nvmlSystemGetDriverVersion()
        clocks = {
            "sm": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "mem": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
            "sm_max": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "mem_max": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM),
        }
        facts = {"driver": version.decode() if isinstance(version, bytes) else version,
                 "clocks_mhz": clocks}
        with contextlib.suppress(Exception):  # optional fact
            facts["temperature_c"] = pynvml.nvmlDeviceGetTemperature(
                handle, pynvml.NVML_TEMPERATURE_GPU)
        return facts
    except Exception as e:  # noqa: BLE001 - NVML is optional: say why it is missing
        return {"nvml": f"error: {e}"}
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
