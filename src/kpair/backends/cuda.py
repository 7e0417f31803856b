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
from ._stream import StreamDevice, count_devices, init_driver
from .base import Kernel, Mapping

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


class CudaDevice(DeviceChecks, StreamDevice):
    """The stream device (``kpair.backends._stream``) on cuda-bindings' driver, with the
    timing gate, the check kernels (``DeviceChecks``) and memory renewal."""

    backend = "cuda"

    def timing_model(self) -> TimingModel:
        return GPU_TIMING

    def __init__(self, driver_module, *, device: int = 0, flush_bytes: int | None = None,
                 gate: bool = True):
        self._d = driver_module
        self.drv = Driver(driver_module)
        self._start_state(self.drv, device)
        self._ctx = None
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
        init_driver(drv, "no NVIDIA driver",
                    "; is an NVIDIA GPU visible to this process?")
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

    def _try_gate(self) -> bool:
        geq = self._wait_geq = self._d.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ.value
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

    # ------------------------------------------------------------------ memory

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

    def stage(self, address: int, data: bytes) -> None:
        super().stage(address, data)
        if data:
            self._table_stale = True

    def restore(self) -> None:
        if len(self._staged) > 1 and self.compares_in_place:
            self._restore_batched()
            self.drv("cuStreamSynchronize", self.stream, context=" after restoring pre-state")
        else:
            super().restore()

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

    def copy(self, dst: int, src: int, size: int) -> None:
        """``size`` bytes from ``src`` to ``dst`` on the replay stream (a range's or a plan's
        copy step), waited for."""
        self.drv("cuMemcpyDtoDAsync", dst, src, size, self.stream)
        self.drv("cuStreamSynchronize", self.stream, context=" after a copy")

    def timed_sequence(self, steps: Sequence[tuple]) -> float:
        """Seconds between one event pair around ``steps``, enqueued in order on the replay
        stream (``kpair.program``): ("kernel", kernel, launch, kernarg, params),
        ("memset", address, size, word) or ("copy", dst, src, size)."""
        ready = [self._prepare(*s[1:]) if s[0] == "kernel" else None for s in steps]

        def enqueue() -> None:
            for s, r in zip(steps, ready, strict=True):
                if s[0] == "kernel":
                    self._launch(s[1], r)
                elif s[0] == "memset":
                    self.fill(s[1], s[2], s[3])
                else:
                    self.drv("cuMemcpyDtoDAsync", s[1], s[2], s[3], self.stream)

        return self._timed(enqueue, " after a timed sequence")

    # ------------------------------------------------------------------ memory renewal

    def _spacer(self) -> object | None:
        """A random number of granules (1 to ``SPACER_GRANULES``, whatever the regions'
        size) taken just before a renewal's new pages and given back after it, so that each
        renewal lands at a random place among the free pages. Without it, on the H200 the
        replicates of a 4 µs kernel alternated between two levels (1.04x and 1.17x, even
        against odd; 2026-12-04), as if every other renewal got the same pages back. A
        spacer no larger than the regions leaves a small harness only a handful of
        placements: on an H100 the replicates of a 4.5 µs kernel stayed on one of two levels
        for several renewals in a row (2026-12-05), so that the replicates of one run agreed
        more than the runs did. None where there is no room for it."""
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

    # ------------------------------------------------------------------ bandwidth

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

    def _is_open(self) -> bool:
        return self._ctx is not None

    def _before_release(self) -> None:
        if self._gate_value:  # never leave the replay stream waiting on a closed gate
            self.drv.quiet("cuStreamWriteValue32", self._gate_stream, self._flag,
                           0xFFFFFFFF, 0)

    def _after_release(self) -> None:
        self._spare.clear()
        self._checks, self._table = None, 0
        self.drv.quiet("cuDevicePrimaryCtxRelease", self.dev)
        self._ctx = None


def device_count() -> int:
    """How many CUDA devices this process sees (``CUDA_VISIBLE_DEVICES`` applies); no context
    is created."""
    return count_devices(Driver(load_driver()), "no NVIDIA driver")


def open_device(**options: object) -> CudaDevice:
    """Open a CUDA device: options ``device`` (ordinal), ``flush_bytes``, ``gate``."""
    unknown = set(options) - {"device", "flush_bytes", "gate"}
    if unknown:
        raise UsageError(f"unknown cuda backend option(s) {sorted(unknown)}; known: device, "
                         "flush_bytes, gate")
    return CudaDevice(load_driver(), **options)  # type: ignore[arg-type]
