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
    BackendUnavailable,
    DriverError,
    SymbolNotFound,
    UsageError,
)
from ..measure import GPU_TIMING, TimingModel
from ..snapshot import Launch, Param

# plan_span is pure placement arithmetic shared with the cuda backend (no driver import).
from ._hip_runtime import KernargBuffer, Runtime, load_hip
from ._vmm import SpanPlacement
from .base import Device, Kernel, Mapping

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


class HipDevice(SpanPlacement, Device):
    backend = "hip"

    def timing_model(self) -> TimingModel:
        return GPU_TIMING   # its run offset was measured on NVIDIA cards only

    def __init__(self, hip_module, *, device: int = 0, flush_bytes: int | None = None):
        self._h = hip_module
        self.rt = Runtime(hip_module)
        self.ordinal = int(device)
        self._open_ok = False
        self._streams: list = []
        self._events: list = []
        self._allocs: list[int] = []
        self._mapped: list[tuple[int, int]] = []
        self._handles: list = []
        self._reservations: list[tuple[int, int]] = []
        self._modules: list = []
        self._staged: list[tuple[int, int, int]] = []
        self._flush_ptr, self._flush_value = 0, 0
        try:
            self._open(flush_bytes)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ setup and facts

    def _open(self, flush_bytes: int | None) -> None:
        h, rt = self._h, self.rt
        try:
            err = h.hipInit(0)[0]
        except RuntimeError as e:  # hip-python cannot dlopen libamdhip64.so
            raise BackendUnavailable(f"no ROCm runtime: {e}") from None
        if err != rt.success:
            name, text = rt.error_name(err)
            raise BackendUnavailable(f"hipInit failed: {name} ({text}); is an AMD GPU "
                                     "visible to this process (/dev/kfd, /dev/dri)?")
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
        self._span, self._delta = (0, 0), 0

    def _event(self):
        event = self.rt("hipEventCreate")
        self._events.append(event)
        return event

    def _alloc(self, size: int) -> int:
        ptr = int(self.rt("hipMalloc", size))
        self._allocs.append(ptr)
        return ptr

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

    def _vmm_reserve(self, size: int, align: int, address: int) -> int:
        return self.rt("hipMemAddressReserve", size, align, address, 0)

    def _vmm_free(self, base: int, size: int) -> None:
        self.rt("hipMemAddressFree", base, size)

    def _map_span(self, address: int, size: int) -> None:
        handle = self.rt("hipMemCreate", size, self._prop, 0)
        self._handles.append(handle)
        self.rt("hipMemMap", address, size, 0, handle, 0)
        self._mapped.append((address, size))
        self.rt("hipMemSetAccess", address, size, self._access, 1)
        # Fresh physical memory holds whatever it held: zero it so guard bytes are defined.
        self.rt("hipMemsetD8Async", address, 0, size, self.stream)
        self.rt("hipStreamSynchronize", self.stream)

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

    # ------------------------------------------------------------------ memory

    def write(self, address: int, data: bytes) -> None:
        self.rt("hipStreamSynchronize", self.stream)
        if data:
            self._upload(address, data)

    def _upload(self, address: int, data: bytes) -> None:
        """Host bytes to the device on the replay stream, waited for: a null-stream copy is
        not ordered before work on the non-blocking replay stream (see CudaDevice._upload)."""
        self.patch(((address, data),))
        self.rt("hipStreamSynchronize", self.stream, context=" after a host-to-device copy")

    def patch(self, writes: Sequence[tuple[int, bytes]]) -> None:
        """Each write a copy on the replay stream, ordered before the next launch there (as
        ``CudaDevice.patch``); a fresh timed input is a copy per run here (no check kernels)."""
        for address, data in writes:
            self.rt("hipMemcpyHtoDAsync", address, bytes(data), len(data), self.stream)

    def read(self, address: int, size: int) -> bytes:
        self.rt("hipStreamSynchronize", self.stream)
        out = bytearray(size)
        if size:
            self.rt("hipMemcpyDtoH", out, address, size)
        return bytes(out)

    def stage(self, address: int, data: bytes) -> None:
        if not data:
            return
        pristine = self._alloc(len(data))
        self._upload(pristine, data)
        self._staged.append((address, pristine, len(data)))

    def restore(self) -> None:
        for address, pristine, size in self._staged:
            self.rt("hipMemcpyDtoDAsync", address, pristine, size, self.stream)
        self.rt("hipStreamSynchronize", self.stream, context=" after restoring pre-state")

    def flush_cache(self) -> None:
        if not self._flush_ptr:
            self._flush_ptr = self._alloc(self.flush_bytes)
        self._flush_value ^= 0x5A5A5A5A
        self.rt("hipMemsetD32Async", self._flush_ptr, self._flush_value,
                self.flush_bytes // 4, self.stream)
        self.rt("hipStreamSynchronize", self.stream)

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

    def _timed(self, enqueue, context: str) -> float:
        self.rt("hipEventRecord", self._start, self.stream)
        enqueue()
        self.rt("hipEventRecord", self._end, self.stream)
        self.rt("hipEventSynchronize", self._end, context=context)
        return float(self.rt("hipEventElapsedTime", self._start, self._end)) * 1e-3

    # ------------------------------------------------------------------ trust-check support

    def synchronize(self) -> None:
        self.rt("hipDeviceSynchronize")

    def fill(self, address: int, size: int, word: int) -> None:
        if address % 4 or size % 4:
            super().fill(address, size, word)
            return
        self.rt("hipMemsetD32Async", address, word & 0xFFFFFFFF, size // 4, self.stream)
        self.rt("hipStreamSynchronize", self.stream)

    def mapped_ranges(self) -> list[tuple[int, int]]:
        return [(address, address + size) for address, size in self._mapped]

    def measure_bandwidth(self, nbytes: int) -> float:
        n = max(-(-int(nbytes) // 4) * 4, 4)
        buffer = int(self.rt("hipMalloc", n))
        try:
            best = min(self._timed(lambda i=i: self.rt("hipMemsetD32Async", buffer, i, n // 4,
                                                       self.stream), " after a memset")
                       for i in range(8))
        finally:
            self.rt("hipFree", buffer)
        return n / max(best, 1e-9)

    # ------------------------------------------------------------------ teardown

    def close(self) -> None:
        """Release everything, best effort: errors here are dropped, never raised."""
        if not self._open_ok:
            return
        q = self.rt.quiet
        for stream in self._streams:
            q("hipStreamSynchronize", stream)
        for ptr in self._allocs:
            q("hipFree", ptr)
        for address, size in self._mapped if self._handles else ():
            q("hipMemUnmap", address, size)
        for handle in self._handles:
            q("hipMemRelease", handle)
        for base, size in self._reservations:
            q("hipMemAddressFree", base, size)
        for module in self._modules:
            q("hipModuleUnload", module)
        for event in self._events:
            q("hipEventDestroy", event)
        for stream in self._streams:
            q("hipStreamDestroy", stream)
        for owned in (self._allocs, self._mapped, self._handles, self._reservations,
                      self._modules, self._events, self._streams, self._staged):
            owned.clear()
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
    h = load_hip()
    rt = Runtime(h)
    try:
        err = h.hipInit(0)[0]
    except RuntimeError as e:
        raise BackendUnavailable(f"no ROCm runtime: {e}") from None
    if err != rt.success:
        name, text = rt.error_name(err)
        raise BackendUnavailable(f"hipInit failed: {name} ({text})")
    return int(rt("hipGetDeviceCount"))


def open_device(**options: object) -> HipDevice:
    """Open a HIP device: options ``device`` (ordinal) and ``flush_bytes``."""
    unknown = set(options) - {"device", "flush_bytes"}
    if unknown:
        raise UsageError(f"unknown hip backend option(s) {sorted(unknown)}; known: device, "
                         "flush_bytes")
    return HipDevice(load_hip(), **options)  # type: ignore[arg-type]
