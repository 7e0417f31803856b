"""One GPU stream device, shared by the cuda and hip backends.

A CUDA and a HIP device replay the same way: a non-blocking replay stream, two timing
events, buffers from the driver's allocator, the captured ranges placed through its
virtual-memory API (``SpanPlacement``), pristine copies staged in device memory and copied
back before every launch, a cache flush by a memset, a teardown that never raises.
``StreamDevice`` holds that once. It talks to the vendor through ``self.api``, a
``CheckedCalls`` adapter (cuda's ``Driver``, hip's ``Runtime``) that names the vendor's
call for each role (``_checked.STREAM_CALLS``: role -> the CUDA call, the HIP call), and
gives two argument shapes: ``access(desc)`` (``cuMemSetAccess`` takes a list,
``hipMemSetAccess`` one descriptor) and ``host(data)`` (the host bytes a copy call takes).

A backend subclass opens the device (sets ``stream``, ``_start``/``_end`` events,
``_prop``/``_access``, ``granularity``, ``flush_bytes``), loads code objects, launches,
reports facts, and adds what only it has (CUDA: the timing gate, check kernels, memory
renewal; HIP: the relocation fallback, the kernarg buffer). ``_is_open``,
``_before_release`` and ``_after_release`` frame ``close``.

Timing gate (CUDA): where ``gated``, ``_timed`` first enqueues a wait on a device flag
(``wait_value32`` on ``_flag``, flags ``_wait_geq``), then the start event, the work and
the end event, and only then opens the gate from ``_gate_stream`` (``write_value32``):
the events time the work, not the host's launch latency. Ungated (HIP; CUDA where stream
memory operations are refused) the events are recorded around the work as it is enqueued.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

from ..errors import BackendUnavailable
from ._checked import CheckedCalls
from ._vmm import SpanPlacement
from .base import Device

#: From this size on ``StreamDevice.read`` copies into the returned bytes directly (a 16 MiB
#: copy costs 12 ms on a 2-core CI machine; small reads are many and cost their calls).
_DIRECT_READ = 1 << 16
_new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
_new_bytes.argtypes, _new_bytes.restype = (ctypes.c_void_p, ctypes.c_ssize_t), ctypes.py_object
_bytes_address = ctypes.pythonapi.PyBytes_AsString
_bytes_address.argtypes, _bytes_address.restype = (ctypes.py_object,), ctypes.c_void_p


def init_driver(api: CheckedCalls, missing: str, hint: str = "") -> None:
    """Initialise the vendor's driver through ``api`` (its ``init`` role): BackendUnavailable
    saying ``missing`` where the library cannot be loaded, or naming the error (then
    ``hint``) where it refuses."""
    try:
        err = getattr(api.mod, api.ROLES["init"])(0)[0]
    except RuntimeError as e:  # the bindings cannot dlopen the driver library
        raise BackendUnavailable(f"{missing}: {e}") from None
    if err != api.success:
        name, text = api.error_name(err)
        raise BackendUnavailable(f"{api.ROLES['init']} failed: {name} ({text}){hint}")


def count_devices(api: CheckedCalls, missing: str) -> int:
    """How many devices the vendor's driver shows this process; no context is created."""
    init_driver(api, missing)
    return int(api("device_count"))


class StreamDevice(SpanPlacement, Device):
    """A ``Device`` on a GPU stream: memory, placement, copies, timing with events and the
    teardown, through the vendor adapter ``api``."""

    #: Whether ``_timed`` waits behind the timing gate (a CUDA device sets it when it can).
    gated = False

    def _start_state(self, api: CheckedCalls, device: int) -> None:
        """What every stream device owns before it opens (``close`` releases all of it)."""
        self.api = api
        self.ordinal = int(device)
        self._streams: list = []
        self._events: list = []
        self._allocs: dict[int, int] = {}     # alloc pointer -> bytes (copies, buffers)
        self._mapped: list[tuple[int, int]] = []
        self._handles: list = []
        self._reservations: list[tuple[int, int]] = []
        self._modules: list = []
        self._staged: list[tuple[int, int, int]] = []   # (address, pristine copy, bytes)
        self._span, self._delta = (0, 0), 0
        self._flush_ptr, self._flush_value = 0, 0
        self._gate_value = 0

    # ------------------------------------------------------------------ buffers

    def _alloc(self, size: int) -> int:
        ptr = int(self.api("alloc", size))
        self._allocs[ptr] = size
        return ptr

    def _free(self, ptr: int) -> None:
        """Give back a buffer of ``_alloc`` before the device closes."""
        self.api("free", ptr)
        del self._allocs[ptr]

    # ------------------------------------------------------------------ placement

    def _vmm_reserve(self, size: int, align: int, address: int) -> int:
        return self.api("address_reserve", size, align, address, 0)

    def _vmm_free(self, base: int, size: int) -> None:
        self.api("address_free", base, size)

    def _map_span(self, address: int, size: int) -> None:
        handle = self.api("mem_create", size, self._prop, 0)
        self._handles.append(handle)
        self.api("mem_map", address, size, 0, handle, 0)
        self._mapped.append((address, size))
        self.api("mem_set_access", address, size, self.api.access(self._access), 1)
        # Fresh physical memory holds whatever it held: zero it so guard bytes are defined.
        self.api("memset8_async", address, 0, size, self.stream)
        self.api("sync", self.stream)

    def mapped_ranges(self) -> list[tuple[int, int]]:
        return [(address, address + size) for address, size in self._mapped]

    # ------------------------------------------------------------------ memory

    def write(self, address: int, data: bytes) -> None:
        self.api("sync", self.stream)
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
        self.api("sync", self.stream, context=" after a host-to-device copy")

    def patch(self, writes: Sequence[tuple[int, bytes]]) -> None:
        """Each write a copy on the replay stream, ordered before the next launch there,
        without a wait of its own (pageable bytes are staged by the time the call returns)."""
        for address, data in writes:
            self.api("htod_async", address, self.api.host(data), len(data), self.stream)

    def read(self, address: int, size: int) -> bytes:
        """The bytes at ``address``; a large read lands straight in the ``bytes`` object it
        returns (made uninitialised by CPython's ``PyBytes_FromStringAndSize(NULL, n)``,
        filled before anything else sees it) rather than in a buffer copied once more."""
        self.api("sync", self.stream)
        if size < _DIRECT_READ:
            out = bytearray(size)
            if size:
                self.api("dtoh", out, address, size)
            return bytes(out)
        data = _new_bytes(None, size)
        self.api("dtoh", _bytes_address(data), address, size)
        return data

    def stage(self, address: int, data: bytes) -> None:
        if not data:
            return
        pristine = self._alloc(len(data))
        self._upload(pristine, data)
        self._staged.append((address, pristine, len(data)))

    def restore(self) -> None:
        for address, pristine, size in self._staged:
            self.api("dtod_async", address, pristine, size, self.stream)
        self.api("sync", self.stream, context=" after restoring pre-state")

    def flush_cache(self) -> None:
        if not self._flush_ptr:
            self._flush_ptr = self._alloc(self.flush_bytes)
        self._flush_value ^= 0x5A5A5A5A
        self.api("memset32_async", self._flush_ptr, self._flush_value,
                 self.flush_bytes // 4, self.stream)
        self.api("sync", self.stream)

    def fill(self, address: int, size: int, word: int) -> None:
        if address % 4 or size % 4:
            super().fill(address, size, word)
            return
        # Stream-ordered before the launch that follows; read() and write() wait for it.
        self.api("memset32_async", address, word & 0xFFFFFFFF, size // 4, self.stream)

    # ------------------------------------------------------------------ timing

    def synchronize(self) -> None:
        """Wait for all work on the device, on every stream (not only the replay stream)."""
        self.api("sync_all")

    def _timed(self, enqueue, context: str) -> float:
        """Seconds between events around ``enqueue()``'s work, behind the timing gate."""
        api = self.api
        if self.gated:
            self._gate_value = (self._gate_value + 1) % 2**32 or 1
            value = self._gate_value
            api("wait_value32", self.stream, self._flag, value, self._wait_geq)
        try:
            api("event_record", self._start, self.stream)
            enqueue()
            api("event_record", self._end, self.stream)
        finally:
            opened = api.quiet("write_value32", self._gate_stream, self._flag,
                               value, 0) if self.gated else api.success
        if opened != api.success:
            if isinstance(opened, Exception):
                raise opened
            raise api.error(f"{api.ROLES['write_value32']} (opening the timing gate)", opened)
        api("event_sync", self._end, context=context)
        return float(api("event_elapsed", self._start, self._end)) * 1e-3

    def _best_of_8(self, op, context: str) -> float:
        """The shortest of 8 event-timed, gated runs of ``op(i)`` (i = 0..7), in seconds."""
        return min(self._timed(lambda i=i: op(i), context) for i in range(8))

    def measure_bandwidth(self, nbytes: int) -> float:
        """Best of 8 event-timed, gated memsets of ``nbytes`` bytes (bytes written per s)."""
        n = max(-(-int(nbytes) // 4) * 4, 4)
        buffer = int(self.api("alloc", n))
        try:
            best = self._best_of_8(lambda i: self.api("memset32_async", buffer, i, n // 4,
                                                      self.stream), " after a memset")
        finally:
            self.api("free", buffer)
        return n / max(best, 1e-9)

    # ------------------------------------------------------------------ teardown

    def _is_open(self) -> bool:
        """Whether there is anything for ``close`` to release."""
        raise NotImplementedError

    def _before_release(self) -> None:
        """What must happen before the streams are waited for (CUDA: open the gate)."""

    def _after_release(self) -> None:
        """The vendor's last steps, after every buffer, module and stream is gone."""

    def close(self) -> None:
        """Release everything, best effort: errors here are dropped, never raised."""
        if not self._is_open():
            return
        q = self.api.quiet
        self._before_release()
        for stream in self._streams:
            q("sync", stream)
        for ptr in self._allocs:
            q("free", ptr)
        # Mapped spans without handles are the HIP relocation's malloc, freed above.
        for address, size in self._mapped if self._handles else ():
            q("mem_unmap", address, size)
        for handle in self._handles:
            q("mem_release", handle)
        for base, size in self._reservations:
            q("address_free", base, size)
        for module in self._modules:
            q("module_unload", module)
        for event in self._events:
            q("event_destroy", event)
        for stream in self._streams:
            q("stream_destroy", stream)
        for owned in (self._allocs, self._mapped, self._handles, self._reservations,
                      self._modules, self._events, self._streams, self._staged):
            owned.clear()
        self._after_release()


__all__ = ["StreamDevice", "count_devices", "init_driver"]
