"""The ``cuda`` backend: replay captured dispatches on NVIDIA GPUs through cuda-bindings.

Lifetime: ``open_device(device=0)`` imports ``cuda.bindings.driver`` (BackendUnavailable with
the install hint if it is missing), retains the device's primary context and creates the
replay stream, a second stream that only opens the timing gate, and two timing events.
``map`` reserves one virtual-address span for every captured range and backs the granular
spans inside it with physical memory; ``load`` keeps each module until ``close``; ``stage``
keeps a pristine copy of each region in device memory, which ``restore`` copies back
device-to-device. ``close`` releases everything and never raises: after a sticky error
(an illegal address poisons the context) every call fails fast, and the error worth
reporting is the one that already propagates.

Timing: ``timed_launch`` first enqueues ``cuStreamWaitValue32`` on a device flag, then the
start event, the kernel and the end event, and only then opens the gate from the second
stream. The GPU thus reaches the start event with the kernel already queued behind it, so
the events time the kernel, not Python's launch latency. If the driver refuses stream
memory operations, timing runs ungated and ``environment()`` says so.

Checks in place: the trust checks compare regions far more often than they need their bytes
(``Device.keep``/``compare``/``check_fills``/``digest``). Here those run as kernels
(``_cuda_checks``: PTX JIT-compiled by the driver, loaded on first use and self-tested; if
either fails, the base class's read-back versions are used and ``environment()`` says why).
A ``CudaHeld`` copy lives in a ``cuMemAlloc`` buffer, masked under a key of its own (a
kernel that reads it learns nothing of ref's answers), with a digest of its stored bytes
taken when it was made, under a key of its own too (this process's key xor the mask); keys
reach the check kernels in a table that is zeroed on the stream right after. Every compare
re-digests the copy in the same pass, so a kernel that overwrote a copy (it lives in device
memory that candidate code could address) makes the compare answer "unknown" and the caller
reads the region instead. Only a compare's three counters come back to the host.
Host memory: no pinned (page-locked) staging buffer. With unified addressing a kernel can
write page-locked host memory it knows the address of, so a verdict would depend on bytes
candidate code can reach between a copy and its use; reading far less through pageable
memory avoids that question. ``restore`` copies every staged region back in one
``kp_copy`` launch (a table of copies) instead of one ``cuMemcpyDtoDAsync`` per region.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..errors import (
    ArchitectureMismatch,
    BackendUnavailable,
    DriverError,
    SymbolNotFound,
    UsageError,
)
from ..measure import GPU_TIMING, TimingModel
from ..snapshot import Launch, Param
from ._cuda_checks import DeviceChecks
from ._cuda_driver import (
    ATTRIBUTE_BYTES,
    Driver,
    ParamArray,
    attribute_bytes,
    c_string,
    cubin_arch,
    load_driver,
    nvml_facts,
    ptx_target,
    replayed_attributes,
)
from ._vmm import SpanPlacement
from .base import Device, Kernel, Mapping

if TYPE_CHECKING:
    from ..policy.mutation import Patch

#: Above this much dynamic shared memory a kernel must opt in (MAX_DYNAMIC_SHARED_SIZE_BYTES).
DEFAULT_DYNAMIC_SMEM = 48 << 10
#: Load failures that mean "this image is not for this device / driver".
_ARCH_ERRORS = {"CUDA_ERROR_NO_BINARY_FOR_GPU", "CUDA_ERROR_INVALID_IMAGE",
                "CUDA_ERROR_INVALID_PTX", "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
                "CUDA_ERROR_JIT_COMPILER_NOT_FOUND", "CUDA_ERROR_INVALID_SOURCE"}
_PREPARED_PER_KERNEL = 8
#: The most granules a renewal's spacer takes (``CudaDevice._spacer``): 512 MiB of 2 MiB.
SPACER_GRANULES = 256
#: A patch of up to this many runs is a copy per run; more go through one kp_copy launch,
#: of at most _GRID_ROWS rows (grid y) each.
_FEW_RUNS = 4
_GRID_ROWS = 65535
#: From this size on ``CudaDevice.read`` copies into the returned bytes directly (a 16 MiB
#: copy costs 12 ms on a 2-core CI machine; small reads are many and cost their calls).
_DIRECT_READ = 1 << 16
_new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
_new_bytes.argtypes, _new_bytes.restype = (ctypes.c_void_p, ctypes.c_ssize_t), ctypes.py_object
_bytes_address = ctypes.pythonapi.PyBytes_AsString
_bytes_address.argtypes, _bytes_address.restype = (ctypes.py_object,), ctypes.c_void_p


class CudaKernel(Kernel):
    """A CUfunction, its module, its driver-reported layout and its prepared launches."""

    def __init__(self, name: str, function, module, layout: list[tuple[int, int]] | None,
                 image_arch: str | None):
        self.name, self.function, self.module = name, function, module
        self.image_arch = image_arch
        self._layout = layout
        self.dynamic_smem_limit = DEFAULT_DYNAMIC_SMEM
        self.prepared: dict[tuple, tuple] = {}

    def param_layout(self) -> list[tuple[int, int]] | None:
        return self._layout


class CudaDevice(DeviceChecks, SpanPlacement, Device):
    backend = "cuda"

    def timing_model(self) -> TimingModel:
        return GPU_TIMING

    def __init__(self, driver_module, *, device: int = 0, flush_bytes: int | None = None,
                 gate: bool = True):
        d = self._d = driver_module
        self.drv = Driver(d)
        self.ordinal = int(device)
        self._ctx = None
        self._streams: list = []
        self._events: list = []
        self._allocs: dict[int, int] = {}     # cuMemAlloc pointer -> bytes (copies, buffers)
        self._mapped: list[tuple[int, int]] = []
        self._handles: list = []
        self._reservations: list[tuple[int, int]] = []
        self._modules: list = []
        self._staged: list[tuple[int, int, int]] = []   # (address, pristine copy, bytes)
        self._span, self._delta = (0, 0), 0
        self._flush_ptr, self._flush_value = 0, 0
        self._gate_value = 0
        self._checks: tuple | None = None        # (kp_diff, kp_copy, kp_fill) once loaded
        self._checks_status = "not loaded"
        self._key = secrets.randbits(64)
        self._counters = 0                        # kp_diff's rows and output triples
        self._fill_rows = 0                       # kp_fill's rows
        self._spare: dict[int, list[int]] = {}    # dropped held buffers, by size
        self._table, self._table_stale = 0, True  # kp_copy's table of staged copies
        self._table_rows = b""
        self._scratch = (0, 0)                    # scatter's table and bytes: (ptr, size)
        self._scattered: tuple = ((), b"")        # the last scatter's patches and its upload
        try:
            self._open(flush_bytes, gate)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ setup and facts

    def _open(self, flush_bytes: int | None, gate: bool) -> None:
        d, drv = self._d, self.drv
        try:
            err = d.cuInit(0)[0]
        except RuntimeError as e:  # cuda-bindings cannot dlopen libcuda.so.1
            raise BackendUnavailable(f"no NVIDIA driver: {e}") from None
        if err != drv.success:
            name, text = drv.error_name(err)
            raise BackendUnavailable(f"cuInit failed: {name} ({text}); is an NVIDIA GPU "
                                     "visible to this process?")
        count = drv("cuDeviceGetCount")
        if not 0 <= self.ordinal < count:
            raise UsageError(f"CUDA device {self.ordinal} does not exist ({count} visible)")
        self.dev = drv("cuDeviceGet", self.ordinal)
        self._ctx = drv("cuDevicePrimaryCtxRetain", self.dev)
        drv("cuCtxSetCurrent", self._ctx)
        a = d.CUdevice_attribute
        self.cc = (self._attr(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                   self._attr(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR))
        self.l2_bytes = self._attr(a.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
        self.sm_count = self._attr(a.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        self.flush_bytes = int(flush_bytes) if flush_bytes else 2 * self.l2_bytes
        flags = d.CUstream_flags.CU_STREAM_NON_BLOCKING.value
        self.stream = self._new(self._streams, "cuStreamCreate", flags)
        self._gate_stream = self._new(self._streams, "cuStreamCreate", flags)
        default = d.CUevent_flags.CU_EVENT_DEFAULT.value
        self._start = self._new(self._events, "cuEventCreate", default)
        self._end = self._new(self._events, "cuEventCreate", default)

        loc = d.CUmemLocation()
        loc.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        loc.id = self.ordinal
        self._prop = d.CUmemAllocationProp()
        self._prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        self._prop.location = loc
        self._access = d.CUmemAccessDesc()
        self._access.location = loc
        self._access.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self.granularity = int(drv(
            "cuMemGetAllocationGranularity", self._prop,
            d.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM))

        self._flag = self._alloc(4)
        drv("cuMemsetD32", self._flag, 0, 1)
        self.gated = gate and self._try_gate()

    def _attr(self, attribute) -> int:
        return int(self.drv("cuDeviceGetAttribute", attribute, self.dev))

    def _new(self, owner: list, call: str, flags: int):
        handle = self.drv(call, flags)
        owner.append(handle)
        return handle

    def _alloc(self, size: int) -> int:
        ptr = int(self.drv("cuMemAlloc", size))
        self._allocs[ptr] = size
        return ptr

    def _free(self, ptr: int) -> None:
        """Give back a buffer of ``_alloc`` before the device closes."""
        self.drv("cuMemFree", ptr)
        del self._allocs[ptr]

    def _try_gate(self) -> bool:
        geq = self._d.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ.value
        try:  # already satisfied (flag 0 >= 0): returns at once where supported
            self.drv("cuStreamWaitValue32", self.stream, self._flag, 0, geq)
            self.drv("cuStreamSynchronize", self.stream)
        except DriverError:
            return False
        return True

    def arch(self) -> str:
        return f"sm_{self.cc[0]}{self.cc[1]}"

    def environment(self) -> dict:
        drv = self.drv
        name = c_string(drv("cuDeviceGetName", 256, self.dev))
        version = int(drv("cuDriverGetVersion"))
        bus_id = c_string(drv("cuDeviceGetPCIBusId", 32, self.dev))
        try:
            from cuda.bindings import __version__ as bindings_version
        except ImportError:
            bindings_version = None
        self.compares_in_place  # noqa: B018 - loads the check kernels: sets _checks_status
        env = {
            "backend": "cuda", "arch": self.arch(),
            "device": name,
            "device_ordinal": self.ordinal, "pci_bus_id": bus_id,
            "compute_capability": f"{self.cc[0]}.{self.cc[1]}", "sm_count": self.sm_count,
            "l2_bytes": self.l2_bytes, "memory_bytes": int(drv("cuDeviceTotalMem", self.dev)),
            "driver_cuda_version": f"{version // 1000}.{version % 1000 // 10}",
            "cuda_bindings": bindings_version, "vmm_granularity": self.granularity,
            "flush_bytes": self.flush_bytes,
            "timing": {"clock": "CUDA events around the kernel on the replay stream",
                       "gate": "cuStreamWaitValue32" if self.gated else None},
            "module_loading": os.environ.get("CUDA_MODULE_LOADING", "default"),
            "checks_in_place": self._checks_status,
            # Where a kernel can read pageable host memory (HMM, ATS), kpair's host memory is
            # in its reach too: see format.md, "Limits".
            "pageable_memory_access": bool(self._attr(
                self._d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS)),
        }
        env.update(nvml_facts(bus_id, self.ordinal))
        return env

    def clocks(self) -> dict | None:
        """SM and memory clocks now (MHz) through NVML, or None where NVML is unavailable."""
        facts = nvml_facts(None, self.ordinal)
        return facts.get("clocks_mhz")

    # ------------------------------------------------------------------ code objects

    def load(self, image: bytes, kernel_name: str, *, fmt: str = "cubin") -> CudaKernel:
        if fmt not in ("cubin", "fatbin", "ptx"):
            raise ArchitectureMismatch(f"the cuda backend loads cubin, fatbin or PTX images, "
                                       f"not {fmt}")
        built = cubin_arch(image) if fmt == "cubin" else ptx_target(image) \
            if fmt == "ptx" else None
        data = image + b"\0" if fmt == "ptx" and not image.endswith(b"\0") else image
        try:
            module = self.drv("cuModuleLoadData", data)
        except DriverError as e:
            if e.code in _ARCH_ERRORS:
                what = f"{fmt} image built for {built}" if built else f"{fmt} image"
                raise ArchitectureMismatch(f"{what} cannot run on this {self.arch()} device: "
                                           f"{e.code} ({e.explanation})") from None
            raise
        self._modules.append(module)
        try:
            function = self.drv("cuModuleGetFunction", module, kernel_name.encode())
        except DriverError as e:
            if e.code == "CUDA_ERROR_NOT_FOUND":
                raise SymbolNotFound(f"kernel {kernel_name!r} is not in the {fmt} image "
                                     "(names are exact: C++ kernels need their mangled "
                                     "name)") from None
            raise
        return CudaKernel(kernel_name, function, module, self._param_layout(function), built)

    def unload(self, kernel: CudaKernel) -> None:
        """Unload ``kernel``'s module (each load made its own)."""
        if kernel.module in self._modules:
            self._modules.remove(kernel.module)
            self.drv("cuModuleUnload", kernel.module)

    def _param_layout(self, function) -> list[tuple[int, int]] | None:
        get = getattr(self._d, "cuFuncGetParamInfo", None)
        if get is None:  # bindings older than CUDA 12.4
            return None
        invalid = self._d.CUresult.CUDA_ERROR_INVALID_VALUE
        layout = []
        for i in range(4096):
            err, offset, size = get(function, i)
            if err == invalid:   # past the last parameter
                return layout
            if err != self.drv.success:
                return None
            layout.append((int(offset), int(size)))
        return None

    # ------------------------------------------------------------------ placement

    _VMM_API = "cuMemAddressReserve"

    def map(self, ranges: Sequence[tuple[int, int]], *, relocate: bool = False) -> Mapping:
        return self._place_span(ranges, relocate)

    def _vmm_reserve(self, size: int, align: int, address: int) -> int:
        return self.drv("cuMemAddressReserve", size, align, address, 0)

    def _vmm_free(self, base: int, size: int) -> None:
        self.drv("cuMemAddressFree", base, size)

    def _map_span(self, address: int, size: int) -> None:
        handle = self.drv("cuMemCreate", size, self._prop, 0)
        self._handles.append(handle)
        self.drv("cuMemMap", address, size, 0, handle, 0)
        self._mapped.append((address, size))
        self.drv("cuMemSetAccess", address, size, [self._access], 1)
        # Fresh physical memory holds whatever it held: zero it so guard bytes are defined.
        self.drv("cuMemsetD8Async", address, 0, size, self.stream)
        self.drv("cuStreamSynchronize", self.stream)

    # ------------------------------------------------------------------ memory

    def write(self, address: int, data: bytes) -> None:
        self.drv("cuStreamSynchronize", self.stream)
        if data:
            self._upload(address, data)

    def _upload(self, address: int, data: bytes) -> None:
        """Host bytes to the device, landed before this returns.

        On the replay stream, then waited for: a plain ``cuMemcpyHtoD`` from pageable memory
        returns once the bytes are staged, before the DMA to the destination has completed
        (CUDA's "API synchronization behavior"), and it runs on the legacy stream, which the
        non-blocking replay stream does not wait for. A launch right after it could read the
        region half old. (benchmarks/htod_order.py looks for that on a device: 0 of 40 rounds
        of 64 MiB on the H200, so the ordering rests on the documented semantics.)"""
        self.patch(((address, data),))
        self.drv("cuStreamSynchronize", self.stream, context=" after a host-to-device copy")

    def patch(self, writes: Sequence[tuple[int, bytes]]) -> None:
        """Each write a copy on the replay stream, ordered before the next launch there,
        without a wait of its own (pageable bytes are staged by the time the call returns)."""
        for address, data in writes:
            self.drv("cuMemcpyHtoDAsync", address, data, len(data), self.stream)

    def scatter(self, patches: Sequence[tuple[int, Patch]]) -> None:
        """Every run of every patch in one upload and one ``kp_copy`` launch (a table row per
        run) instead of a copy each; the scratch is cleared on the stream right after, so the
        kernel launched next finds no list of what changed where. The upload's bytes are
        built once for the two launches of a block (the same patches)."""
        runs = sum(len(p.offsets) for _, p in patches)
        if runs <= _FEW_RUNS or not self.compares_in_place:
            return super().scatter(patches)
        last = self._scattered[0]
        if len(last) != len(patches) or any(a != b or p is not q for (a, p), (b, q)
                                            in zip(patches, last, strict=True)):
            need = sum(len(p.offsets) * (32 + p.size) for _, p in patches)
            if self._scratch[1] < need:
                if self._scratch[0]:
                    self._free(self._scratch[0])
                self._scratch = (self._alloc(need), need)
            table = np.zeros((runs, 4), "<u8")      # (dst, src, bytes, no mask)
            data = self._scratch[0] + 32 * runs
            row = 0
            for address, p in patches:
                n = len(p.offsets)
                table[row:row + n, 0] = address + p.offsets
                table[row:row + n, 1] = data + np.arange(n, dtype=np.uint64) * p.size
                table[row:row + n, 2] = p.size
                data, row = data + n * p.size, row + n
            self._scattered = (tuple(patches),
                               b"".join([table.tobytes(), *(p.data for _, p in patches)]))
        buf, blob = self._scratch[0], self._scattered[1]
        self.patch(((buf, blob),))
        for at in range(0, runs, _GRID_ROWS):
            self._run_check(self._checks[1], 1, min(_GRID_ROWS, runs - at),
                            struct.pack("<Q", buf + 32 * at))
        self.drv("cuMemsetD8Async", buf, 0, len(blob), self.stream)

    def read(self, address: int, size: int) -> bytes:
        """The bytes at ``address``; a large read lands straight in the ``bytes`` object it
        returns (made uninitialised by CPython's ``PyBytes_FromStringAndSize(NULL, n)``,
        filled before anything else sees it) rather than in a buffer copied once more."""
        self.drv("cuStreamSynchronize", self.stream)
        if size < _DIRECT_READ:
            out = bytearray(size)
            if size:
                self.drv("cuMemcpyDtoH", out, address, size)
            return bytes(out)
        data = _new_bytes(None, size)
        self.drv("cuMemcpyDtoH", _bytes_address(data), address, size)
        return data

    def stage(self, address: int, data: bytes) -> None:
        if not data:
            return
        pristine = self._alloc(len(data))
        self._upload(pristine, data)
        self._staged.append((address, pristine, len(data)))
        self._table_stale = True

    def restore(self) -> None:
        if len(self._staged) > 1 and self.compares_in_place:
            self._restore_batched()
        else:
            for address, pristine, size in self._staged:
                self.drv("cuMemcpyDtoDAsync", address, pristine, size, self.stream)
        self.drv("cuStreamSynchronize", self.stream, context=" after restoring pre-state")

    def _restore_batched(self) -> None:
        """Every staged copy in one kp_copy launch (grid y: one row of blocks per region)."""
        n = len(self._staged)
        if self._table_stale:
            if self._table:
                self._free(self._table)
            self._table = self._alloc(32 * n)
            self._table_rows = b"".join(struct.pack("<QQQQ", a, p, size, 0)
                                        for a, p, size in self._staged)
            self._table_stale = False
        # Uploaded before every launch: a kernel launched since could have rewritten it.
        self.patch(((self._table, self._table_rows),))
        biggest = max(size for _, _, size in self._staged)
        self._run_check(self._checks[1], self._blocks(biggest), n,
                        struct.pack("<Q", self._table))

    def flush_cache(self) -> None:
        if not self._flush_ptr:
            self._flush_ptr = self._alloc(self.flush_bytes)
        self._flush_value ^= 0x5A5A5A5A
        self.drv("cuMemsetD32Async", self._flush_ptr, self._flush_value,
                 self.flush_bytes // 4, self.stream)
        self.drv("cuStreamSynchronize", self.stream)

    # ------------------------------------------------------------------ launches

    def _prepare(self, kernel: CudaKernel, launch: Launch, kernarg: bytes,
                 params: Sequence[Param]) -> tuple:
        key = (launch, kernarg, tuple(params), self._delta)
        ready = kernel.prepared.get(key)
        if ready is not None:
            return ready
        d = self._d
        dyn = launch.dynamic_shared_bytes
        if dyn > kernel.dynamic_smem_limit:
            self.drv("cuFuncSetAttribute", kernel.function,
                     d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                     dyn, context=f" (kernel {kernel.name}, {dyn} bytes of dynamic shared "
                     "memory)")
            kernel.dynamic_smem_limit = dyn
        config = d.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = launch.grid
        config.blockDimX, config.blockDimY, config.blockDimZ = launch.block
        config.sharedMemBytes = dyn
        config.hStream = self.stream
        attrs = []
        for a in replayed_attributes(launch.attributes):
            entry = d.CUlaunchAttribute()
            raw = attribute_bytes(a, lo=self._span[0], hi=self._span[1], delta=self._delta)
            ctypes.memmove(entry.getPtr(), raw, ATTRIBUTE_BYTES)
            attrs.append(entry)
        config.attrs = attrs
        config.numAttrs = len(attrs)
        ready = (config, ParamArray(kernarg, params), attrs)
        if len(kernel.prepared) >= _PREPARED_PER_KERNEL:
            kernel.prepared.clear()
        kernel.prepared[key] = ready
        return ready

    def _launch(self, kernel: CudaKernel, ready: tuple) -> None:
        config, args, _ = ready
        self.drv("cuLaunchKernelEx", config, kernel.function, args.address, args.extra,
                 context=f" (kernel {kernel.name})")

    def launch(self, kernel: CudaKernel, launch: Launch, kernarg: bytes,
               params: Sequence[Param]) -> None:
        self._launch(kernel, self._prepare(kernel, launch, kernarg, params))
        self.drv("cuStreamSynchronize", self.stream,
                 context=f" after launching {kernel.name}")

    def timed_launch(self, kernel: CudaKernel, launch: Launch, kernarg: bytes,
                     params: Sequence[Param]) -> float:
        ready = self._prepare(kernel, launch, kernarg, params)
        return self._timed(lambda: self._launch(kernel, ready), f" after launching {kernel.name}")

    def _timed(self, enqueue, context: str) -> float:
        """Seconds between events around ``enqueue()``'s work, behind the timing gate."""
        drv = self.drv
        if self.gated:
            self._gate_value = (self._gate_value + 1) % 2**32 or 1
            value = self._gate_value
            drv("cuStreamWaitValue32", self.stream, self._flag, value,
                self._d.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ.value)
        try:
            drv("cuEventRecord", self._start, self.stream)
            enqueue()
            drv("cuEventRecord", self._end, self.stream)
        finally:
            opened = drv.quiet("cuStreamWriteValue32", self._gate_stream, self._flag,
                               value, 0) if self.gated else drv.success
        if opened != drv.success:
            if isinstance(opened, Exception):
                raise opened
            raise drv.error("cuStreamWriteValue32 (opening the timing gate)", opened)
        drv("cuEventSynchronize", self._end, context=context)
        return float(drv("cuEventElapsedTime", self._start, self._end)) * 1e-3

    # ------------------------------------------------------------------ trust-check support

    def synchronize(self) -> None:
        """Wait for all work in the context, on every stream (not only the replay stream)."""
        self.drv("cuCtxSynchronize")

    def fill(self, address: int, size: int, word: int) -> None:
        if address % 4 or size % 4:
            super().fill(address, size, word)
            return
        # Stream-ordered before the launch that follows; read() and write() wait for it.
        self.drv("cuMemsetD32Async", address, word & 0xFFFFFFFF, size // 4, self.stream)

    def mapped_ranges(self) -> list[tuple[int, int]]:
        return [(address, address + size) for address, size in self._mapped]

    def _spacer(self) -> object | None:
        """A random number of granules (1 to ``SPACER_GRANULES``, whatever the regions'
        size) taken just before a renewal's new pages and given back after it, so that each
        renewal lands at a random place among the free pages. Without it, on the H200 the
        replicates of a 4 µs kernel alternated between two levels (1.04x and 1.17x, even
        against odd, session 11), as if every other renewal got the same pages back. A
        spacer no larger than the regions (session 11 to 14) left a small harness only a
        handful of placements: on the H100 the replicates of a 4.5 µs kernel stayed on one
        of two levels for several renewals in a row (session 14), so that the replicates of
        one run agreed more than the runs did. None where there is no room for it."""
        try:
            return self.drv("cuMemCreate", (1 + secrets.randbelow(SPACER_GRANULES)) *
                            self.granularity, self._prop, 0)
        except DriverError:
            return None

    def renew_memory(self) -> bool:
        if not self._handles or len(self._handles) != len(self._mapped):
            return False
        self.drv("cuStreamSynchronize", self.stream)
        spacer = self._spacer()
        try:
            renewed = self._renew()
        finally:
            if spacer is not None:
                self.drv.quiet("cuMemRelease", spacer)
        # No room for new pages beside the spacer: once more without it.
        return renewed or (spacer is not None and self._renew())

    def _renew(self) -> bool:
        fresh: list = []
        try:   # all new handles before any old one goes: the new pages cannot be the old ones
            for _, size in self._mapped:
                fresh.append(self.drv("cuMemCreate", size, self._prop, 0))
        except DriverError:   # no room for a second copy: keep the placement there is
            for handle in fresh:
                self.drv.quiet("cuMemRelease", handle)
            return False
        for (address, size), new in zip(self._mapped, fresh, strict=True):
            self.drv("cuMemUnmap", address, size)
            self.drv("cuMemMap", address, size, 0, new, 0)
            self.drv("cuMemSetAccess", address, size, [self._access], 1)
            self.drv("cuMemsetD8Async", address, 0, size, self.stream)
        for old in self._handles:
            self.drv("cuMemRelease", old)
        self._handles = fresh
        if self._flush_ptr:
            # The cache flush's buffer moves too (the new one taken before the old is
            # freed): its dirty lines are written back during the timed launch, and what
            # that costs depends on where they lie, as for a region's pages.
            old_flush, self._flush_ptr = self._flush_ptr, self._alloc(self.flush_bytes)
            self._free(old_flush)
        self.drv("cuStreamSynchronize", self.stream)
        return True

    def _best_of_8(self, op, context: str) -> float:
        """The shortest of 8 event-timed, gated runs of ``op(i)`` (i = 0..7), in seconds."""
        return min(self._timed(lambda i=i: op(i), context) for i in range(8))

    def measure_bandwidth(self, nbytes: int) -> float:
        """Best of 8 event-timed, gated memsets of ``nbytes`` bytes (bytes written per s)."""
        n = max(-(-int(nbytes) // 4) * 4, 4)
        buffer = int(self.drv("cuMemAlloc", n))
        try:
            best = self._best_of_8(lambda i: self.drv("cuMemsetD32Async", buffer, i, n // 4,
                                                      self.stream), " after a memset")
        finally:
            self.drv("cuMemFree", buffer)
        return n / max(best, 1e-9)

    def measure_copy_bandwidth(self, nbytes: int) -> float:
        """Best of 8 event-timed, gated device-to-device copies of ``nbytes`` bytes, counting
        bytes read plus written per s (the speed of light's peak, ``kpair.sol``)."""
        n = max(int(nbytes), 4)
        src, dst = int(self.drv("cuMemAlloc", n)), int(self.drv("cuMemAlloc", n))
        try:
            self.drv("cuMemsetD8Async", src, 1, n, self.stream)
            best = self._best_of_8(lambda _: self.drv("cuMemcpyDtoDAsync", dst, src, n,
                                                      self.stream), " after a copy")
        finally:
            self.drv("cuMemFree", src)
            self.drv("cuMemFree", dst)
        return 2 * n / max(best, 1e-9)

    # ------------------------------------------------------------------ teardown

    def close(self) -> None:
        """Release everything, best effort: errors here are dropped, never raised."""
        q = self.drv.quiet
        if self._ctx is None:
            return
        if self._gate_value:  # never leave the replay stream waiting on a closed gate
            q("cuStreamWriteValue32", self._gate_stream, self._flag, 0xFFFFFFFF, 0)
        for stream in self._streams:
            q("cuStreamSynchronize", stream)
        for ptr in self._allocs:
            q("cuMemFree", ptr)
        for address, size in self._mapped:
            q("cuMemUnmap", address, size)
        for handle in self._handles:
            q("cuMemRelease", handle)
        for base, size in self._reservations:
            q("cuMemAddressFree", base, size)
        for module in self._modules:
            q("cuModuleUnload", module)
        for event in self._events:
            q("cuEventDestroy", event)
        for stream in self._streams:
            q("cuStreamDestroy", stream)
        for owned in (self._allocs, self._mapped, self._handles, self._reservations,
                      self._modules, self._events, self._streams, self._staged, self._spare):
            owned.clear()
        self._checks, self._table = None, 0
        q("cuDevicePrimaryCtxRelease", self.dev)
        self._ctx = None


def device_count() -> int:
    """How many CUDA devices this process sees (``CUDA_VISIBLE_DEVICES`` applies); no context
    is created."""
    d = load_driver()
    drv = Driver(d)
    try:
        err = d.cuInit(0)[0]
    except RuntimeError as e:
        raise BackendUnavailable(f"no NVIDIA driver: {e}") from None
    if err != drv.success:
        name, text = drv.error_name(err)
        raise BackendUnavailable(f"cuInit failed: {name} ({text})")
    return int(drv("cuDeviceGetCount"))


def open_device(**options: object) -> CudaDevice:
    """Open a CUDA device: options ``device`` (ordinal), ``flush_bytes``, ``gate``."""
    unknown = set(options) - {"device", "flush_bytes", "gate"}
    if unknown:
        raise UsageError(f"unknown cuda backend option(s) {sorted(unknown)}; known: device, "
                         "flush_bytes, gate")
    return CudaDevice(load_driver(), **options)  # type: ignore[arg-type]
