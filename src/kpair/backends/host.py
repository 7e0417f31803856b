"""The ``host`` backend: kernels are C functions in ELF shared objects, run on the CPU.

It exists so the whole pipeline (record, pair, replay, judge, time, release) runs on any
machine, CI included. A host "kernel" is called once per launch with its arguments decoded
from the kernarg blob by the snapshot's parameter kinds (the C ABI needs to know integer
from floating point); grid and block are recorded but mean nothing here.

Regions are placed with ``mmap(MAP_FIXED_NOREPLACE)`` at their captured pages when those are
free in this process; otherwise one mapping covers the whole captured span and every region
moves by the same page-multiple delta.

Timing reads CPU time, not wall time, so that other processes on the machine do not land in
the samples: ``timed_launch`` returns the CPU time this process consumed during the call
(``CLOCK_PROCESS_CPUTIME_ID``: the calling thread's, plus every other thread's, exited ones
included), and ``window_clock`` — the clock of the timing-integrity window, which runs from
before the launch until ``synchronize`` finds every other thread idle or gone — is the same
clock. Preemption by other processes stops both; work a kernel hands to another thread of
this process counts in the window whether or not it ends before the call returns, and
``synchronize`` waits while such a thread is runnable (waiting for a CPU under load) as well
as while it runs. A multi-threaded kernel is thus charged the CPU time of all its threads,
not its latency. Linux reads the process clock exactly for the calling thread and for
threads that sleep or have exited; for another thread still running it may lag by up to one
scheduler tick — that only makes a thread's hidden work look larger.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import platform
import struct
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import AbiMismatch, ArchitectureMismatch, PlacementError, SymbolNotFound
from ..placement import granular_spans
from ..snapshot import SCALAR_FORMATS, Launch, Param
from .base import Device, Kernel, Mapping

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_PROT_RW = 0x1 | 0x2
_MAP_PRIVATE, _MAP_ANONYMOUS, _MAP_FIXED_NOREPLACE = 0x02, 0x20, 0x100000
_MAP_FAILED = ctypes.c_void_p(-1).value

#: ELF e_machine values of the architectures we name.
ELF_MACHINES = {62: "x86_64", 183: "aarch64", 21: "ppc64le", 243: "riscv64", 3: "i386"}

#: The C type each kernarg kind is passed as (its bytes are read with SCALAR_FORMATS).
_CTYPES = {
    "pointer": ctypes.c_void_p, "i8": ctypes.c_int8, "u8": ctypes.c_uint8,
    "i16": ctypes.c_int16, "u16": ctypes.c_uint16, "i32": ctypes.c_int32,
    "u32": ctypes.c_uint32, "i64": ctypes.c_int64, "u64": ctypes.c_uint64,
    "f32": ctypes.c_float, "f64": ctypes.c_double,
}


#: memfds of every code object this process loaded (see HostDevice.load).
_LOADED: list[int] = []


def host_arch() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def elf_arch(image: bytes) -> str:
    """The architecture an ELF shared object was built for; ArchitectureMismatch if not ELF."""
    if len(image) < 20 or image[:4] != b"\x7fELF":
        raise ArchitectureMismatch("host code object is not an ELF file (no \\x7fELF magic)")
    endian = "<" if image[5] == 1 else ">"
    (machine,) = struct.unpack_from(endian + "H", image, 18)
    return ELF_MACHINES.get(machine, f"elf-machine-{machine}")


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.memset.restype = ctypes.c_void_p
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    return libc


def _other_threads_cpu() -> dict[int, float] | None:
    """CPU seconds of every other thread of this process, by thread id (Linux), or None.

    Each thread's own CPU clock (clock id ``(~tid << 3) | 6``, as glibc builds it for
    ``pthread_getcpuclockid``) is exact; ``process_time() - thread_time()`` is not (it
    jumps by a scheduler tick now and then)."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return None
    me, out = threading.get_native_id(), {}
    for tid in tids:
        if tid != me:
            with contextlib.suppress(OSError):  # the thread exited meanwhile
                out[tid] = time.clock_gettime((~tid << 3) | 6)
    return out


def _threads_runnable(tids: object) -> bool:
    """Whether any of these threads of this process is running or waiting for a CPU (state R
    in /proc): under load a thread can wait in the run queue for many polls, gaining no CPU
    time, yet it has work left."""
    for tid in tids:
        try:
            fd = os.open(f"/proc/self/task/{tid}/stat", os.O_RDONLY)
        except OSError:  # the thread exited meanwhile
            continue
        try:
            stat = os.read(fd, 512)
        finally:
            os.close(fd)
        if stat[stat.rindex(b")") + 2:][:1] == b"R":
            return True
    return False


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _cpu_s() -> float:
    """CPU seconds of this whole process (every thread, exited ones too): the host's clock."""
    return time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID)


#: synchronize() polls at this interval; a kernel's threads are done when they have gone,
#: or stayed idle for _IDLE_POLLS polls (a persistent thread pool never goes away).
_POLL_S, _IDLE_POLLS, _SYNC_LIMIT_S = 0.0005, 10, 120.0


def _llc_bytes() -> int:
    best = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
        best = max(best, int(text.rstrip("KM")) * scale)
    return best or (32 << 20)


class HostKernel(Kernel):
    def __init__(self, name: str, fn: ctypes._CFuncPtr, path: Path):
        self.name, self.fn, self.path = name, fn, path


class HostDevice(Device):
    backend = "host"

    def __init__(self, *, device: int = 0, flush_bytes: int | None = None):
        # One host, one "device": the ordinal names a worker slot of a pool (``--workers``),
        # recorded in the environment; the slots share the CPUs.
        self.ordinal = int(device)
        self._libc = _libc()
        self._maps: list[tuple[int, int]] = []
        self._staged: list[tuple[int, bytes]] = []
        self._libs: list[ctypes.CDLL] = []
        # Twice the last-level cache, so one pass evicts what the kernel left behind.
        self._flush_bytes = min(2 * _llc_bytes(), 256 << 20) if flush_bytes is None \
            else flush_bytes
        self._flush: np.ndarray | None = None  # allocated on first use
        self._threads_before: int | None = None  # other threads when the last launch began

    def arch(self) -> str:
        return host_arch()

    def environment(self) -> dict:
        cpu = ""
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        return {"backend": "host", "arch": self.arch(), "device": cpu or platform.processor(),
                "cpus": os.cpu_count(), "platform": platform.platform(),
                "python": sys.version.split()[0], "llc_bytes": _llc_bytes(),
                "timer": "process CPU time (CLOCK_PROCESS_CPUTIME_ID)"}

    def load(self, image: bytes, kernel_name: str, *, fmt: str = "elf-so") -> HostKernel:
        if fmt != "elf-so":
            raise ArchitectureMismatch(f"the host backend runs ELF shared objects, not {fmt}")
        arch = elf_arch(image)
        if arch != self.arch():
            raise ArchitectureMismatch(f"code object is built for {arch}, this host is "
                                       f"{self.arch()}")
        # An anonymous in-memory file: loading writes nothing to disk, so it works sealed too.
        # It stays open as long as the process: the library is never unloaded, and the
        # dynamic loader would hand back the old library for a reused /proc/self/fd/N name.
        fd = os.memfd_create(f"kpair-k{len(_LOADED)}", 0)
        _LOADED.append(fd)
        os.write(fd, image)
        path = Path(f"/proc/self/fd/{fd}")
        try:
            lib = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL | os.RTLD_NOW)
        except OSError as e:
            raise ArchitectureMismatch(f"cannot load code object: {e}") from None
        self._libs.append(lib)
        try:
            fn = getattr(lib, kernel_name)
        except AttributeError:
            raise SymbolNotFound(f"kernel {kernel_name!r} is not exported by the code "
                                 "object") from None
        fn.restype = None
        return HostKernel(kernel_name, fn, path)

    def _mmap(self, address: int | None, size: int) -> int | None:
        flags = _MAP_PRIVATE | _MAP_ANONYMOUS | (_MAP_FIXED_NOREPLACE if address else 0)
        got = self._libc.mmap(address or None, size, _PROT_RW, flags, -1, 0)
        if got in (None, _MAP_FAILED):
            return None
        if address is not None and got != address:  # old kernels treat the flag as a hint
            self._libc.munmap(got, size)
            return None
        self._maps.append((got, size))
        return got

    def map(self, ranges: Sequence[tuple[int, int]], *, relocate: bool = False) -> Mapping:
        spans = granular_spans(ranges, PAGE)
        if not relocate:
            placed = [self._mmap(lo, hi - lo) for lo, hi in spans]
            if all(p is not None for p in placed):
                return Mapping("captured", 0, {"spans": len(spans)})
            self._unmap()
        lo, hi = spans[0][0], spans[-1][1]
        base = self._mmap(None, hi - lo)
        if base is None:
            raise PlacementError(f"cannot map {hi - lo} bytes for the relocated span "
                                 f"(errno {ctypes.get_errno()})")
        reason = "forced" if relocate else "captured pages are in use in this process"
        return Mapping("relocated", base - lo, {"spans": 1, "reason": reason})

    def write(self, address: int, data: bytes) -> None:
        ctypes.memmove(address, data, len(data))

    def read(self, address: int, size: int) -> bytes:
        return ctypes.string_at(address, size)

    def stage(self, address: int, data: bytes) -> None:
        self._staged.append((address, bytes(data)))

    def restore(self) -> None:
        for address, data in self._staged:
            ctypes.memmove(address, data, len(data))

    def flush_cache(self) -> None:
        if self._flush is None:
            self._flush = np.zeros(self._flush_bytes, dtype=np.uint8)
        self._flush += 1

    def _args(self, kernarg: bytes, params: Sequence[Param]) -> list:
        args = []
        for i, p in enumerate(params):
            if p.kind not in _CTYPES:
                raise AbiMismatch(f"parameter {i} has kind {p.kind!r}: the host backend calls "
                                  "C functions and needs a scalar or pointer kind")
            value = struct.unpack_from(SCALAR_FORMATS[p.kind], kernarg, p.offset)[0]
            args.append(_CTYPES[p.kind](value))
        return args

    def launch(self, kernel: HostKernel, launch: Launch, kernarg: bytes,
               params: Sequence[Param]) -> None:
        args = self._args(kernarg, params)
        self._threads_before = _thread_count() - 1
        kernel.fn(*args)

    def timed_launch(self, kernel: HostKernel, launch: Launch, kernarg: bytes,
                     params: Sequence[Param]) -> float:
        args = self._args(kernarg, params)
        fn = kernel.fn
        self._threads_before = _thread_count() - 1
        clock = time.CLOCK_PROCESS_CPUTIME_ID
        t0 = time.clock_gettime_ns(clock)
        fn(*args)
        return (time.clock_gettime_ns(clock) - t0) * 1e-9

    def window_clock(self) -> float:
        return _cpu_s()

    def synchronize(self) -> None:
        """Wait until the threads the last launch started have exited or gone idle.

        A host kernel that hands its work to a thread and returns looks instantly fast to
        ``timed_launch``; this is the host's "every stream": no other thread may gain CPU time
        over a poll or be runnable at its end, and the thread count must fall back to what it
        was before the launch (or stay idle for a while: a persistent pool). Gives up after
        two minutes."""
        last = _other_threads_cpu()
        if last is None:
            return
        deadline, idle = time.monotonic() + _SYNC_LIMIT_S, 0
        while time.monotonic() < deadline:
            time.sleep(_POLL_S)
            now = _other_threads_cpu() or {}
            busy = any(t - last.get(tid, 0.0) > 0.1 * _POLL_S for tid, t in now.items()) \
                or _threads_runnable(now)
            last = now
            if busy:
                idle = 0
                continue
            idle += 1
            if self._threads_before is None or len(now) <= self._threads_before \
                    or idle >= _IDLE_POLLS:
                return

    def mapped_ranges(self) -> list[tuple[int, int]]:
        return [(address, address + size) for address, size in self._maps]

    def measure_bandwidth(self, nbytes: int) -> float:
        """libc memset of ``nbytes`` through ctypes, timed like a kernel call: best of 32."""
        n = max(int(nbytes), 64)
        buf = np.empty(n, np.uint8)
        address, memset, best = buf.ctypes.data, self._libc.memset, math.inf
        clock = time.CLOCK_PROCESS_CPUTIME_ID
        for i in range(32):
            t0 = time.clock_gettime_ns(clock)
            memset(address, i & 0xFF, n)
            best = min(best, time.clock_gettime_ns(clock) - t0)
        return n / (max(best, 1) * 1e-9)

    def _unmap(self) -> None:
        for address, size in self._maps:
            self._libc.munmap(address, size)
        self._maps.clear()

    def seal(self) -> dict:
        from ._sandbox import SandboxUnavailable, seal

        try:
            return seal()
        except SandboxUnavailable as e:
            return {"mechanism": None, "why": str(e)}

    def close(self) -> None:
        self._unmap()
        self._staged.clear()


def device_count() -> int:
    """One host device; a pool on it takes its worker slots from ``--workers``."""
    return 1


def open_device(**options: object) -> HostDevice:
    return HostDevice(**options)  # type: ignore[arg-type]
