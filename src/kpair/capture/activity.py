"""CUPTI's Activity API through ctypes: the GPU's own start/end timestamps of every kernel.

Why the Activity API and not launch callbacks with CUDA events: events around each launch
add work to the program's streams and host synchronisation to read them back; activity
records are written by CUPTI from the GPU's timestamps and handed over in buffers, so the
program runs as it would (no eager module loading either: a name is all profiling needs).

Lifetime: ``KernelActivity(cupti, sink).start()`` registers the buffer callbacks and enables
``CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL`` (the ``KERNEL`` kind would serialise kernels);
CUPTI asks for empty buffers and returns full ones on its own thread, where each kernel
record is decoded and passed to ``sink``; ``stop()`` flushes every buffer (forced) and
disables the kind. The process's CUDA work must be synchronised before ``stop`` for the last
records to be complete.

Record layout: ``CUpti_ActivityKernel4`` to ``CUpti_ActivityKernel10`` (CUDA 11 to 13) share
their first 112 bytes, which hold everything read here (offsets printed by ``offsetof``
against CUDA 13.0's ``cupti_activity.h``; tests check them). Records are walked with
``cuptiActivityGetNextRecord``, so a newer, longer struct version is stepped over correctly.
"""

from __future__ import annotations

import ctypes
import struct
import sys
import threading
from collections.abc import Callable, Iterator
from typing import NamedTuple

from .cupti import Cupti

KIND_KERNEL, KIND_CONCURRENT_KERNEL = 3, 10
FLUSH_FORCED = 1
ERROR_MAX_LIMIT_REACHED = 12  # cuptiActivityGetNextRecord: no more records in this buffer
BUFFER_BYTES = 8 << 20
ALIGNMENT = 8  # ACTIVITY_RECORD_ALIGNMENT

#: The shared prefix of CUpti_ActivityKernel4..10: kind, cacheConfig, sharedMemoryConfig,
#: registersPerThread, partitionedGlobalCache{Requested,Executed}, start, end, completed,
#: deviceId, contextId, streamId, grid{X,Y,Z}, block{X,Y,Z}, static/dynamicSharedMemory,
#: localMemoryPerThread, localMemoryTotal, correlationId, gridId, name.
KERNEL_PREFIX = struct.Struct("<IBBHIIQQQIII3i3iiiIIIqQ")  # 112 bytes, no padding

RequestFunc = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p),
                               ctypes.POINTER(ctypes.c_size_t),
                               ctypes.POINTER(ctypes.c_size_t))
CompleteFunc = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p,
                                ctypes.c_size_t, ctypes.c_size_t)


class KernelRecord(NamedTuple):
    """The fields of one kernel activity record that profiling uses (times in ns)."""

    kind: int
    registers: int
    start: int
    end: int
    device: int
    context: int
    stream: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    static_shared: int
    dynamic_shared: int
    correlation: int
    grid_id: int
    name_address: int

    @property
    def complete(self) -> bool:
        """Both timestamps known (a forced flush may deliver a kernel still running: 0)."""
        return self.start != 0 and self.end >= self.start

    @property
    def duration(self) -> int:
        return self.end - self.start


def decode_kernel(data: bytes | bytearray | memoryview, offset: int = 0) -> KernelRecord:
    """The kernel record at ``offset`` of ``data`` (its kind must be KERNEL or
    CONCURRENT_KERNEL; the caller checks)."""
    (kind, _cache, _smem, registers, _req, _exe, start, end, _completed, device, context,
     stream, gx, gy, gz, bx, by, bz, static_shared, dynamic_shared, _lpt, _ltot, correlation,
     grid_id, name) = KERNEL_PREFIX.unpack_from(data, offset)
    return KernelRecord(kind, registers, start, end, device, context, stream, (gx, gy, gz),
                        (bx, by, bz), static_shared, dynamic_shared, correlation, grid_id, name)


def record_kind(data: bytes | bytearray | memoryview, offset: int) -> int:
    return struct.unpack_from("<I", data, offset)[0]


class KernelActivity:
    """Kernel activity records of this process, decoded and handed to ``sink`` in batches.

    ``sink(records, name_of)`` runs on CUPTI's buffer thread (or inside ``stop``'s flush);
    ``name_of(address)`` turns a record's ``name_address`` into the mangled kernel name
    (CUPTI shares one string per kernel, so it is read once per address).
    """

    def __init__(self, cupti: Cupti, sink: Callable[[list[KernelRecord], Callable[[int], str]],
                                                     None]):
        self.cupti, self.sink = cupti, sink
        self.errors: list[str] = []
        self.dropped = 0
        self.buffers = 0
        self._names: dict[int, str] = {}
        self._buffers: dict[int, ctypes.Array] = {}  # address → memory, alive while CUPTI has it
        self._lock = threading.Lock()
        self._enabled = False
        lib = cupti.lib
        lib.cuptiActivityRegisterCallbacks.argtypes = [RequestFunc, CompleteFunc]
        lib.cuptiActivityEnable.argtypes = [ctypes.c_int]
        lib.cuptiActivityDisable.argtypes = [ctypes.c_int]
        lib.cuptiActivityFlushAll.argtypes = [ctypes.c_uint32]
        lib.cuptiActivityGetNextRecord.argtypes = [ctypes.c_void_p, ctypes.c_size_t,
                                                   ctypes.POINTER(ctypes.c_void_p)]
        lib.cuptiActivityGetNumDroppedRecords.argtypes = [ctypes.c_void_p, ctypes.c_uint32,
                                                          ctypes.POINTER(ctypes.c_size_t)]
        for name in ("cuptiActivityRegisterCallbacks", "cuptiActivityEnable",
                     "cuptiActivityDisable", "cuptiActivityFlushAll",
                     "cuptiActivityGetNextRecord", "cuptiActivityGetNumDroppedRecords"):
            getattr(lib, name).restype = ctypes.c_int
        # C holds these: they must live as long as the registration.
        self._request = RequestFunc(self._on_request)
        self._complete = CompleteFunc(self._on_complete)

    def start(self) -> None:
        lib = self.cupti.lib
        self.cupti.check("cuptiActivityRegisterCallbacks",
                         lib.cuptiActivityRegisterCallbacks(self._request, self._complete))
        self.cupti.check("cuptiActivityEnable",
                         lib.cuptiActivityEnable(KIND_CONCURRENT_KERNEL))
        self._enabled = True

    def flush(self) -> None:
        """Deliver every buffer now, records of unfinished kernels included."""
        self.cupti.check("cuptiActivityFlushAll",
                         self.cupti.lib.cuptiActivityFlushAll(FLUSH_FORCED))

    def stop(self) -> None:
        if not self._enabled:
            return
        self.flush()
        self._enabled = False
        self.cupti.check("cuptiActivityDisable",
                         self.cupti.lib.cuptiActivityDisable(KIND_CONCURRENT_KERNEL))

    def name_of(self, address: int) -> str:
        name = self._names.get(address)
        if name is None:
            name = ctypes.string_at(address).decode(errors="replace") if address else "?"
            self._names[address] = name
        return name

    # ---------------------------------------------------------------- CUPTI's callbacks

    def _on_request(self, buffer, size, max_records) -> None:
        try:
            memory = (ctypes.c_uint64 * (BUFFER_BYTES // 8))()  # 8-byte aligned, zeroed
            address = ctypes.addressof(memory)
            with self._lock:
                self._buffers[address] = memory
            buffer[0], size[0], max_records[0] = address, BUFFER_BYTES, 0
        except Exception as e:  # no buffer: CUPTI drops records and counts them
            self._error(f"buffer request: {e!r}")
            buffer[0], size[0], max_records[0] = None, 0, 0

    def _on_complete(self, context, stream, buffer, size, valid) -> None:
        try:
            with self._lock:
                memory = self._buffers.pop(buffer, None)
            self.buffers += 1
            if valid:
                data = ctypes.string_at(buffer, valid)
                records = [decode_kernel(data, off) for off in self._offsets(buffer, valid)
                           if record_kind(data, off) in (KIND_KERNEL, KIND_CONCURRENT_KERNEL)]
                self.sink(records, self.name_of)
            dropped = ctypes.c_size_t()
            if self.cupti.lib.cuptiActivityGetNumDroppedRecords(context, stream,
                                                                ctypes.byref(dropped)) == 0:
                self.dropped += dropped.value
            del memory
        except Exception as e:  # never let an exception unwind into CUPTI
            self._error(f"buffer completion: {e!r}")

    def _offsets(self, buffer: int, valid: int) -> Iterator[int]:
        """Offsets of the records in a completed buffer, as CUPTI walks them."""
        record = ctypes.c_void_p(None)
        step = self.cupti.lib.cuptiActivityGetNextRecord
        while True:
            code = step(buffer, valid, ctypes.byref(record))
            if code == ERROR_MAX_LIMIT_REACHED:
                return
            self.cupti.check("cuptiActivityGetNextRecord", code)
            yield record.value - buffer

    def _error(self, text: str) -> None:
        if len(self.errors) < 100:
            self.errors.append(text)
            print(f"kpair profile: internal error in a CUPTI activity callback: {text}",
                  file=sys.stderr)
