"""The ``hip`` backend: replay captured dispatches on AMD GPUs (gfx942 first) through hip-python.

Lifetime: ``open_device(device=0)`` imports hip-python's ``hip`` (BackendUnavailable with the
install hint if it is missing), selects the device, reads its target ID
(``gfx942:sramecc+:xnack-``) and creates the replay stream and two timing events. ``map``
reserves one virtual-address span for every captured range through HIP's virtual memory API
(``hipMemAddressReserve``/``hipMemCreate``/``hipMemMap``/``hipMemSetAccess``), with the span
rule of the cuda backend; where the API is refused, the regions are relocated into one
``hipMalloc`` buffer. ``load`` reads the code object's metadata note first (kpair.amd), so
a missing kernel or a code object for another target is refused with the reason before
the runtime sees it; modules stay loaded until ``close``. ``stage`` keeps a pristine copy
of each region in device memory; ``restore`` copies it back device-to-device before every
launch. ``close`` never raises: after a sticky error (a memory fault kills the queue) every
call fails fast and the error worth reporting is the one already propagating.

Kernel arguments: a code-object-v5 kernarg segment is the caller's *explicit* arguments
followed by *hidden* ones (block counts, group sizes, remainders, global offsets, grid
dimensions, and pointers to the printf buffer, hostcall buffer, heap, queue and so on).
kpair passes the explicit bytes, as captured, through ``extra``
(HIP_LAUNCH_PARAM_BUFFER_POINTER/SIZE/END) and lets the HIP runtime write the hidden ones
for the replaying dispatch. Why not pass the captured hidden bytes through the HSA level:
the geometric ones are a function of grid and block, which replay launches unchanged, so
the runtime writes the same values; the pointer ones name buffers of the *capturing*
process (its hostcall and printf buffers, its queue) that do not exist in the replaying one,
so copying them would hand the kernel dangling pointers. The captured blob keeps the hidden
bytes as evidence; ``launch`` sends ``kernarg[:explicit_size]``.

Timing: HIP events recorded on the replay stream around the kernel alone; the cache is made
cold by writing ``flush_bytes`` (twice L2 plus the Infinity Cache: 256 MiB on MI300) before
the start event.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..amd.codeobject import KernelMeta, read_code_object
from ..amd.target import TargetId, incompatibility
from ..errors import (
    AbiMismatch,
    ArchitectureMismatch,
    DriverError,
    SymbolNotFound,
    UsageError,
)
from ..measure import GPU_TIMING, TimingModel
from ..snapshot import Launch, Param
from ._hip_runtime import KernargBuffer, Runtime, load_hip
from ._stream import StreamDevice, count_devices, init_driver
from .base import Kernel, Mapping

MIB = 1 << 20
#: Memory-side last-level cache ("MALL", AMD Infinity Cache) per processor, which HIP's
#: device properties do not report: MI300A/X (gfx940-gfx942) and MI350 (gfx950) have 256 MiB.
INFINITY_CACHE = {"gfx940": 256 * MIB, "gfx941": 256 * MIB, "gfx942": 256 * MIB,
                  "gfx950": 256 * MIB}
#: Load failures that mean "this code object is not for this device".
_ARCH_ERRORS = {"hipErrorNoBinaryForGpu", "hipErrorInvalidImage", "hipErrorInvalidKernelFile",
                "hipErrorSharedObjectInitFailed"}
#: Relocation fallback alignment: a delta that is a multiple of it keeps every alignment.
_FALLBACK_ALIGN = 2 * MIB


class HipKernel(Kernel):
    """A hipFunction_t, its module, and what the metadata note says about the kernel."""

    def __init__(self, name: str, function, module, meta: KernelMeta, target: str):
        self.name, self.function, self.module, self.meta = name, function, module, meta
        self.target = target
        self.buffers: dict[bytes, KernargBuffer] = {}

    def param_layout(self) -> list[tuple[int, int]]:
        return self.meta.param_layout()


def _enum(mod, group: str, member: str):
    return getattr(getattr(mod, group), member)


class HipDevice(StreamDevice):
    """The stream device (``kpair.backends._stream``) on hip-python's runtime, with the
    relocation fallback and the kernarg buffer; timing runs ungated."""

    backend = "hip"

    def timing_model(self) -> TimingModel:
        return GPU_TIMING   # its run offset was measured on NVIDIA cards only

    def __init__(self, hip_module, *, device: int = 0, flush_bytes: int | None = None):
        self._h = hip_module
        self.rt = Runtime(hip_module)
        self._start_state(self.rt, device)
        self._open_ok = False
        try:
            self._open(flush_bytes)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ setup and facts

    def _open(self, flush_bytes: int | None) -> None:
        h, rt = self._h, self.rt
        init_driver(rt, "no ROCm runtime",
                    "; is an AMD GPU visible to this process (/dev/kfd, /dev/dri)?")
        self._open_ok = True
        count = rt("hipGetDeviceCount")
        if not 0 <= self.ordinal < count:
            raise UsageError(f"HIP device {self.ordinal} does not exist ({count} visible)")
        rt("hipSetDevice", self.ordinal)
        self.props = h.hipDeviceProp_t()
        rt("hipGetDeviceProperties", self.props, self.ordinal)
        self.target = TargetId.parse(_str(self.props.gcnArchName))
        self.l2_bytes = int(self.props.l2CacheSize)
        self.flush_bytes = int(flush_bytes) if flush_bytes else \
            2 * (self.l2_bytes + INFINITY_CACHE.get(self.target.processor, 0))
        flags = getattr(h, "hipStreamNonBlocking", 1)
        stream = rt("hipStreamCreateWithFlags", flags)
        self._streams.append(stream)
        self.stream = stream
        self._start, self._end = self._event(), self._event()

        self._prop = h.hipMemAllocationProp()
        self._prop.type = _enum(h, "hipMemAllocationType", "hipMemAllocationTypePinned")
        self._prop.location.type = _enum(h, "hipMemLocationType", "hipMemLocationTypeDevice")
        self._prop.location.id = self.ordinal
        self._access = h.hipMemAccessDesc()
        self._access.location.type = self._prop.location.type
        self._access.location.id = self.ordinal
        self._access.flags = _enum(h, "hipMemAccessFlags", "hipMemAccessFlagsProtReadWrite")
        try:
            self.granularity = int(rt(
                "hipMemGetAllocationGranularity", self._prop,
                _enum(h, "hipMemAllocationGranularity_flags",
                      "hipMemAllocationGranularityMinimum")))
        except DriverError:
            self.granularity = 0      # no virtual memory API: map() relocates

    def _event(self):
        event = self.rt("hipEventCreate")
        self._events.append(event)
        return event

    def arch(self) -> str:
        return self.target.processor

    def environment(self) -> dict:
        p = self.props
        try:
            version = _version(int(self.rt("hipRuntimeGetVersion")))
        except DriverError:
            version = None
        try:
            from hip import __version__ as hip_python
        except ImportError:
            hip_python = None
        return {
            "backend": "hip", "arch": self.arch(), "target_id": str(self.target),
            "device": _str(p.name), "device_ordinal": self.ordinal,
            "pci_bus_id": f"{int(p.pciDomainID):04x}:{int(p.pciBusID):02x}:"
                          f"{int(p.pciDeviceID):02x}.0",
            "compute_units": int(p.multiProcessorCount), "l2_bytes": self.l2_bytes,
            "memory_bytes": int(p.totalGlobalMem), "hip_runtime_version": version,
            "hip_python": hip_python, "vmm_granularity": self.granularity,
            "flush_bytes": self.flush_bytes,
            "timing": {"clock": "HIP events around the kernel on the replay stream",
                       "gate": None},
            "hidden_kernel_arguments": "written by the HIP runtime for each replay launch",
        }

    # ------------------------------------------------------------------ code objects

    def load(self, image: bytes, kernel_name: str, *, fmt: str = "hsaco") -> HipKernel:
        if fmt != "hsaco":
            raise ArchitectureMismatch(f"the hip backend loads AMDGPU code objects (hsaco), "
                                       f"not {fmt}")
        info = read_code_object(image)
        meta = info.kernel(kernel_name)
        why = incompatibility(info.target, self.target)
        if why:
            raise ArchitectureMismatch(f"code object for {info.target_text} cannot run on this "
                                       f"{self.target} device: {why}")
        try:
            module = self.rt("hipModuleLoadData", image)
        except DriverError as e:
            if e.code in _ARCH_ERRORS:
                raise ArchitectureMismatch(f"code object for {info.target_text} was refused "
                                           f"by this {self.target} device: {e.code} "
                                           f"({e.explanation})") from None
            raise
        self._modules.append(module)
        try:
            function = self.rt("hipModuleGetFunction", module, meta.name.encode())
        except DriverError as e:
            if e.code in ("hipErrorNotFound", "hipErrorInvalidDeviceFunction"):
                raise SymbolNotFound(f"kernel {meta.name!r} is in the metadata but the "
                                     f"runtime cannot find it: {e.code}") from None
            raise
        return HipKernel(meta.name, function, module, meta, info.target_text)

    # ------------------------------------------------------------------ placement

    _VMM_API = "hipMemAddressReserve"

    def map(self, ranges: Sequence[tuple[int, int]], *, relocate: bool = False) -> Mapping:
        if not self.granularity:
            return self._map_relocated(ranges, "no virtual memory API on this device")
        try:
            return self._place_span(ranges, relocate)
        except DriverError as e:
            return self._map_relocated(ranges, f"hipMemAddressReserve refused: {e}")

    def _map_relocated(self, ranges: Sequence[tuple[int, int]], reason: str) -> Mapping:
        """One hipMalloc buffer holding the whole captured span, moved by one delta."""
        lo = min(r[0] for r in ranges) // _FALLBACK_ALIGN * _FALLBACK_ALIGN
        hi = max(r[1] for r in ranges)
        size = hi - lo
        ptr = self._alloc(size + _FALLBACK_ALIGN)
        base = -(-ptr // _FALLBACK_ALIGN) * _FALLBACK_ALIGN
        self.rt("hipMemsetD8Async", base, 0, size, self.stream)
        self.rt("hipStreamSynchronize", self.stream)
        self._mapped.append((base, size))
        self._span, self._delta = (min(r[0] for r in ranges), hi), base - lo
        return Mapping("relocated", base - lo, {"reason": reason, "allocated_bytes": size})

    # ------------------------------------------------------------------ launches

    def _buffer(self, kernel: HipKernel, kernarg: bytes) -> KernargBuffer:
        need = kernel.meta.explicit_size
        if len(kernarg) < need:
            raise AbiMismatch(f"kernel {kernel.name!r} reads {need} bytes of explicit "
                              f"arguments, the kernarg blob holds {len(kernarg)}")
        explicit = bytes(kernarg[:need])
        buffer = kernel.buffers.get(explicit)
        if buffer is None:
            if len(kernel.buffers) >= 8:
                kernel.buffers.clear()
            buffer = kernel.buffers[explicit] = KernargBuffer(explicit)
        return buffer

    def _launch(self, kernel: HipKernel, launch: Launch, buffer: KernargBuffer) -> None:
        self.rt("hipModuleLaunchKernel", kernel.function, *launch.grid, *launch.block,
                launch.dynamic_shared_bytes, self.stream, None, buffer.address,
                context=f" (kernel {kernel.name})")

    def launch(self, kernel: HipKernel, launch: Launch, kernarg: bytes,
               params: Sequence[Param]) -> None:
        self._launch(kernel, launch, self._buffer(kernel, kernarg))
        self.rt("hipStreamSynchronize", self.stream,
                context=f" after launching {kernel.name}")

    def timed_launch(self, kernel: HipKernel, launch: Launch, kernarg: bytes,
                     params: Sequence[Param]) -> float:
        buffer = self._buffer(kernel, kernarg)
        return self._timed(lambda: self._launch(kernel, launch, buffer),
                           f" after launching {kernel.name}")

    # ------------------------------------------------------------------ teardown

    def _is_open(self) -> bool:
        return self._open_ok

    def _after_release(self) -> None:
        self._open_ok = False


def _str(value: object) -> str:
    if isinstance(value, (bytes, bytearray)):
        return value.split(b"\0", 1)[0].decode(errors="replace").strip()
    return str(value).split("\0", 1)[0].strip()


def _version(v: int) -> str:
    """``hipRuntimeGetVersion`` as major.minor.patch (it encodes major*1e7 + minor*1e5 + patch)."""
    return f"{v // 10_000_000}.{v // 100_000 % 100}.{v % 100_000}"


def device_count() -> int:
    """How many HIP devices this process sees (``HIP_VISIBLE_DEVICES`` applies)."""
    return count_devices(Runtime(load_hip()), "no ROCm runtime")


def open_device(**options: object) -> HipDevice:
    """Open a HIP device: options ``device`` (ordinal) and ``flush_bytes``."""
    unknown = set(options) - {"device", "flush_bytes"}
    if unknown:
        raise UsageError(f"unknown hip backend option(s) {sorted(unknown)}; known: device, "
                         "flush_bytes")
    return HipDevice(load_hip(), **options)  # type: ignore[arg-type]
