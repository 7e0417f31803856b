"""The ``host`` backend: kernels are C functions in ELF shared objects, run on the CPU.

It exists so the whole pipeline (record, pair, replay, judge, time, release) runs on any
machine, CI included. A host "kernel" is called once per launch with its arguments decoded
from the kernarg blob by the snapshot's parameter kinds (the C ABI needs to know integer
from floating point); grid and block are recorded but mean nothing here.

The candidate shares nothing with the judge. Each ``load`` starts an executor
(``host_executor.c``, built at first use; ``kpair.backends._sandbox``): a small C process
that holds only the worker's log as stdout/stderr, a write-only report pipe, the regions and
a read-only call page — no key, no Python, no verdict path, no command channel. It drops to
nobody when kpair runs as root, drops every capability, sets no_new_privs and rlimits, maps
the regions, installs its one, final seccomp filter, hands the judge the filter's listener
over the setup socket and closes it; only then does it load the code object (constructors
and IFUNC resolvers run under the final filter; the judge's thread answers its opens:
read-only ones while loading, none after). A failure reported on the setup socket is the
sandbox's (``SandboxUnavailable``, ``PlacementError``); anything that goes wrong from dlopen
on is the code object's (``KernelCrashed``; ``SymbolNotFound`` only if the judge's own
reading of the image agrees). The judge checks ``Seccomp_filters`` from outside after the
load. The judge (this process) makes itself non-dumpable, so a same-user process cannot read
its memory or environment. If the sandbox cannot be set up, nothing runs. Every call the
sandbox refuses reaches the judge (a record on the report pipe, or an open it refused
itself); ``refused_calls`` sums them over every load of a code object.

A launch has no protocol inside the executor's process: the executor's loop only stops
itself (``kill(getpid(), SIGSTOP)``) and then acts on its call page's op. The judge writes
the call's arguments into the page while the executor is stopped, SIGCONTs it and waits
(``waitpid(WUNTRACED)``) for its next stop. Nothing a kernel could answer, forge or skip is
in that path: the same wake, call and stop are timed for ref and opt, and a kernel that stops
itself early leaves its launch's outputs unfinished (judged so) and its deferred work to its
own next launch.

Regions live in memfds: ``map`` creates one per call, maps it MAP_SHARED here (the judge's
view, which ``write``/``read``/``stage``/``restore`` use) and chooses the executor
addresses: the captured pages (``MAP_FIXED_NOREPLACE`` in the executor; a collision with the
executor's own mappings is a PlacementError at load) or, relocated, one span at a fixed base
a fresh executor leaves free. ``Mapping`` and every address of this interface are executor
addresses.

Timing reads the executor's CPU time from outside (its process CPU clock, clock id
``(~pid << 3) | 2``): a timer patched inside it changes nothing, and other processes on the
machine land in no sample. Between its launches an executor is stopped (its own stop, or the
judge's SIGSTOP after ``synchronize``), so a thread a candidate leaves running gets no CPU
while another kernel is timed; its work is charged to its own next launch. ``timed_launch``
reads the clock while the executor is stopped (exact, every thread counted, exited ones
too) before and after one call; ``window_clock`` — the clock of the timing-integrity
window — is the CPU time of all executors; ``synchronize`` lets the last launched executor
run until its threads are idle or gone (a thread still runnable counts as busy), then stops
it again. A multi-threaded kernel is thus charged the CPU time of all its threads, not its
latency.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import errno
import fcntl
import hashlib
import math
import os
import platform
import select
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import (
    AbiMismatch,
    ArchitectureMismatch,
    DriverError,
    KpairError,
    PlacementError,
    SymbolNotFound,
)
from ..measure import HOST_TIMING, TimingModel
from ..placement import granular_spans
from ..snapshot import SCALAR_FORMATS, Launch, Param
from . import _sandbox
from .base import Device, Kernel, Mapping

if TYPE_CHECKING:
    from ..policy.mutation import Patch

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_PROT_RW = 0x1 | 0x2
_MAP_SHARED = 0x01
_MAP_FAILED = ctypes.c_void_p(-1).value

#: ELF e_machine values of the architectures we name.
ELF_MACHINES = {62: "x86_64", 183: "aarch64", 21: "ppc64le", 243: "riscv64", 3: "i386"}

#: Kernarg kinds the executor can pass; floats go in float registers, the rest in integer ones.
_FLOATS = {"f32": 4, "f64": 8}
_INTS = {"pointer", "i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64"}
#: The executor's trampoline: integer registers, float registers, 8-byte stack slots.
_NINT = {"x86_64": 6, "aarch64": 8}
_NFLOAT, _NSTACK = 8, 16
#: The call page's op word: what a SIGCONTed executor does (IDLE: stop again at once).
_OP_IDLE, _OP_CALL, _OP_EXIT, _OP_WAIT = 0, 1, 2, 3
_CALL = struct.Struct(f"=QQ8Q{_NFLOAT}Q{_NSTACK}Q")
_SETUP = struct.Struct("=8I4Q")
_REGION = struct.Struct("=4Q")
_REPLY = struct.Struct("=QIII")
_MAGIC = 0x3158504B
_ST_OK, _ST_SETUP, _ST_LOAD, _ST_SYMBOL, _ST_PLACE = range(5)
#: The sequence number of a refused-call record (its status is the system call's number).
_REFUSED = 0xFFFFFFFF
#: The sequence number of a load-failure record (written after dlopen began).
_LATE = 0xFFFFFFFE
#: The call page: one page, written by the judge, mapped read-only in the executor.
_PAGE_BYTES = max(PAGE, 4096)
#: The seccomp user-notification interface (linux/seccomp.h): struct seccomp_notif,
#: struct seccomp_notif_resp, SECCOMP_IOCTL_NOTIF_RECV / _SEND, the CONTINUE flag.
_NOTIF = struct.Struct("=QIIiIQ6Q")
_NOTIF_RESP = struct.Struct("=QqiI")
_NOTIF_RECV, _NOTIF_SEND, _NOTIF_CONTINUE = 0xC0502100, 0xC0182101, 1
#: A refused call made with SIGSYS blocked kills the executor before it can say which.
_UNNAMED = "(unnamed: made with SIGSYS blocked)"

#: Where relocated spans go in an executor: far above a small C program's heap, far below
#: its libraries and stack (x86_64 and aarch64 with 39-bit or more of address space).
_RELOCATE_BASE = 0x10_0000_0000
_USER_LO, _USER_HI = 1 << 20, (1 << 47) - (1 << 32)
#: Executor rlimits beyond the regions: address space, descriptors, tasks of its user.
_AS_EXTRA, _NOFILE, _NPROC_EXTRA = 8 << 30, 16, 256


class KernelCrashed(DriverError):
    """An executor died during (or right after) a launch: the kernel crashed it."""

    def __init__(self, how: str, role: str):
        if how == "SIGSYS":
            how = ("SIGSYS: it made a system call the sandbox refuses while SIGSYS was blocked "
                   "(system(), popen() and posix_spawn() block every signal), so the call "
                   "could not just fail with EPERM")
        KpairError.__init__(self, f"the host kernel crashed: {how} (in its executor, {role})")
        self.call, self.code, self.explanation = "host kernel call", how, role


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


@lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.memset.restype = ctypes.c_void_p
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    libc.ioctl.restype = ctypes.c_int
    libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
    return libc


def _undumpable() -> None:
    """PR_SET_DUMPABLE 0 on the judge: no same-user process reads its memory or environ."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)


def _tasks_of(uid: int) -> int:
    """Tasks (threads) whose real user is ``uid``: RLIMIT_NPROC counts them all."""
    n = 0
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            text = (p / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        with contextlib.suppress(KeyError, ValueError, IndexError):
            if int(fields["Uid"].split()[0]) == uid:
                n += int(fields["Threads"])
    return n


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


class _Refusals:
    """The system calls the sandbox refused one code object (every load of it), in the
    order the records arrived; distinct numbers beyond the first 64 are counted together.
    Executors' threads add to it (ref and its control copy share one tally): under a lock."""

    KEEP = 64

    def __init__(self) -> None:
        self.count, self.at_load = 0, 0
        self.by_nr: dict[int, int] = {}
        self.other = 0
        self._lock = threading.Lock()

    def add(self, nr: int, loading: bool) -> None:
        with self._lock:
            self.count += 1
            self.at_load += loading
            if nr in self.by_nr or len(self.by_nr) < self.KEEP:
                self.by_nr[nr] = self.by_nr.get(nr, 0) + 1
            else:
                self.other += 1

    def to_json(self) -> dict:
        calls = {}
        with self._lock:
            by_nr = dict(self.by_nr)
        for nr, n in by_nr.items():
            name = _sandbox.syscall_name(nr) if nr >= 0 else _UNNAMED
            calls[name] = calls.get(name, 0) + n
        if self.other:
            calls["(others)"] = self.other
        return {"count": self.count, "at_load": self.at_load, "calls": calls}


@dataclass
class _Arena:
    """One map() call: a memfd, its view in the judge, its spans at executor addresses."""

    fd: int
    size: int
    view: int                                  # judge address of offset 0
    spans: list[tuple[int, int, int]]          # (executor lo, executor hi, memfd offset)


class _Executor:
    """One executor process and the judge's side of it: its call page, its report pipe, its
    seccomp listener (served by a thread of the judge) and its stops."""

    def __init__(self, pid: int, report: int, page: int, page_view: int, role: str,
                 refusals: _Refusals | None = None):
        self.pid, self.report, self.role = pid, report, role
        self.page, self.page_view = page, page_view
        self.clock = ((~pid) << 3) | 2
        self.stopped, self.dead, self.last_cpu = False, None, 0.0
        # Stopped at the top of its loop: the next SIGCONT acts on the call page. False after
        # synchronize (it was stopped from outside, wherever it was).
        self.parked = False
        self.nonce, self.pending = int.from_bytes(os.urandom(8), "little"), b""
        self.refusals = refusals if refusals is not None else _Refusals()
        self.loading = True   # until its load stop: refusals then come from the load
        self.image, self.symbol = b"", ""   # what it loaded: a renewal spawns its successor
        self.listener: int | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closing = False

    def cpu(self) -> float:
        """The executor's CPU time; an executor whose clock cannot be read has ended, and
        says why (a timing of zero would hide the crash)."""
        if self.dead is None:
            try:
                self.last_cpu = time.clock_gettime(self.clock)
            except OSError:
                raise KernelCrashed(self._reap(block=False) or "its CPU clock cannot be read",
                                    self.role) from None
        return self.last_cpu

    def _reap(self, block: bool) -> str | None:
        """Why the executor ended (and reap it), or None if it still runs."""
        if self.dead is not None:
            return self.dead
        try:
            pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            self.dead = "it ended"
            return self.dead
        if pid == 0:
            return None
        if os.WIFSIGNALED(status):
            self._died_of(os.WTERMSIG(status))
        elif os.WIFEXITED(status):
            self.dead = f"it exited with status {os.WEXITSTATUS(status)}"
        else:
            return None
        return self.dead

    # -------------------------------------------------------------- reports and opens

    def serve(self, listener: int) -> None:
        """Answer the executor's opens (its seccomp listener) and read its report pipe on a
        thread of the judge, for as long as it lives: a kernel that floods the pipe or waits
        on an open never stalls the judge, and the judge never waits on the executor."""
        self.listener = listener
        self._thread = threading.Thread(target=self._serve, name=f"kpair-executor-{self.pid}",
                                        daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        poll = select.poll()
        live = {self.report: "report"}
        poll.register(self.report, select.POLLIN)
        if self.listener is not None:
            live[self.listener] = "listener"
            poll.register(self.listener, select.POLLIN)
        while live and not self._closing:
            try:
                events = poll.poll(500)
            except InterruptedError:
                continue
            for fd, mask in events:
                if live.get(fd) == "listener":
                    if mask & select.POLLIN:
                        with contextlib.suppress(Exception):   # never leave an open waiting
                            self._answer()
                    elif mask & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                        poll.unregister(fd)
                        live.pop(fd)
                elif live.get(fd) == "report" and not self._read_report():
                    poll.unregister(fd)
                    live.pop(fd)

    def _read_report(self) -> bool:
        """Read what the report pipe holds (without waiting); False at its end."""
        with self._lock:
            while True:
                try:
                    chunk = os.read(self.report, 1 << 16)
                except BlockingIOError:
                    break
                except InterruptedError:
                    continue
                except OSError:
                    return False
                if not chunk:
                    self._take_refusals()
                    return False
                self.pending += chunk
                if len(self.pending) > 1 << 20:   # junk a kernel wrote: keep the records
                    self._take_refusals()
                    self.pending = self.pending[-(1 << 16):]
            self._take_refusals()
        return True

    def _answer(self) -> None:
        """One open of the executor: let a read-only one through while its code object loads
        (SECCOMP_USER_NOTIF_FLAG_CONTINUE), refuse any other with EPERM and count it."""
        libc, buf = _libc(), ctypes.create_string_buffer(_NOTIF.size)
        # ctypes calls release the GIL: a wait here never holds up the judge.
        if libc.ioctl(self.listener, _NOTIF_RECV, buf) != 0:
            return   # the call was interrupted, or the executor has gone
        nid, _, _, nr, _, _, *args = _NOTIF.unpack(buf.raw)
        is_open, is_openat = (nr == _sandbox.syscall_number(n) for n in ("open", "openat"))
        flags = args[1] if is_open else args[2]
        loading = self.loading
        allowed = loading and (is_open or is_openat) and not flags & _sandbox.WRITE_FLAGS
        if not allowed:
            # Counted before the answer: once answered, the executor runs on, and a count
            # taken after it could miss this call (a call interrupted and made again is
            # counted twice: it was refused either way).
            with self._lock:
                self.refusals.add(nr, loading)
        resp = ctypes.create_string_buffer(
            _NOTIF_RESP.pack(nid, 0, 0, _NOTIF_CONTINUE) if allowed
            else _NOTIF_RESP.pack(nid, 0, -errno.EPERM, 0), _NOTIF_RESP.size)
        libc.ioctl(self.listener, _NOTIF_SEND, resp)   # fails only if interrupted or gone

    def _take_refusals(self) -> None:
        """Count and remove the refused-call records received so far (wherever they lie:
        a kernel's own bytes may come between them). The caller holds the lock."""
        mark = struct.pack("=QI", self.nonce, _REFUSED)
        at = self.pending.find(mark)
        while at >= 0 and len(self.pending) >= at + _REPLY.size:
            _, _, nr, _ = _REPLY.unpack_from(self.pending, at)
            self.refusals.add(nr, self.loading)
            self.pending = self.pending[:at] + self.pending[at + _REPLY.size:]
            at = self.pending.find(mark, at)

    def drain(self) -> None:
        """Count what the executor has reported so far (refusals from a thread that outlived
        its launch)."""
        self._read_report()

    def late_report(self) -> tuple[int, str] | None:
        """The load-failure record (status, message) the executor wrote after dlopen began,
        if any: written where a candidate's code could have written it too."""
        self._read_report()
        with self._lock:
            at = self.pending.find(struct.pack("=QI", self.nonce, _LATE))
            if at < 0 or len(self.pending) < at + _REPLY.size:
                return None
            _, _, status, n = _REPLY.unpack_from(self.pending, at)
            msg = self.pending[at + _REPLY.size:at + _REPLY.size + min(n, 4096)]
        return status, msg.decode(errors="replace")

    def _died_of(self, sig: int) -> None:
        self.dead = _signame(sig)
        if sig == signal.SIGSYS:   # a refused call it could not be told of: count it too
            with self._lock:
                self.refusals.add(-1, self.loading)

    # -------------------------------------------------------------- stops and calls

    def _wait_stop(self) -> None:
        """Wait until the executor is stopped again (every thread: a group stop), whoever
        stopped it; KernelCrashed if it ended instead."""
        while True:
            try:
                _, status = os.waitpid(self.pid, os.WUNTRACED)
            except ChildProcessError:
                self.dead = self.dead or "it ended"
                break
            except InterruptedError:
                continue
            if os.WIFSTOPPED(status):
                self.stopped = True
                return
            if os.WIFSIGNALED(status):
                self._died_of(os.WTERMSIG(status))
                break
            if os.WIFEXITED(status):
                self.dead = f"it exited with status {os.WEXITSTATUS(status)}"
                break
        raise KernelCrashed(self.dead, self.role)

    def cont(self) -> None:
        if self.stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)
            self.stopped = False

    def run_until_stopped(self) -> None:
        """SIGCONT, then wait for its next stop: the executor's own, at the end of its call
        (or a kernel's, earlier: then its outputs are what it left, and judged so)."""
        if self.dead is not None:
            raise KernelCrashed(self.dead, self.role)
        self.cont()
        self._wait_stop()

    def stop(self) -> None:
        """SIGSTOP from outside (synchronize), and wait until every thread has stopped."""
        if self.stopped or self.dead is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGSTOP)
        self._wait_stop()

    def _set_op(self, op: int) -> None:
        ctypes.c_uint64.from_address(self.page_view).value = op

    def park(self) -> None:
        """Bring an executor stopped from outside back to the top of its loop (op IDLE: it
        leaves the WAIT loop and stops itself), so the next SIGCONT makes a call."""
        if not self.parked:
            self.stop()
            self._set_op(_OP_IDLE)
            self.run_until_stopped()
            self.parked = True

    def prepare(self, record: bytes) -> None:
        """Write the next call into its call page (it is stopped, at the top of its loop)."""
        if self.dead is not None:
            raise KernelCrashed(self.dead, self.role)
        self.park()
        ctypes.memmove(self.page_view, record, len(record))

    def call(self, record: bytes) -> None:
        self.prepare(record)
        self.run_until_stopped()

    def wait(self) -> None:
        """Op WAIT and SIGCONT: its threads run, its main thread sleeps on the op word."""
        self.stop()
        self._set_op(_OP_WAIT)
        self.parked = False
        self.cont()

    def tasks(self) -> list[int]:
        try:
            return [int(t) for t in os.listdir(f"/proc/{self.pid}/task")]
        except OSError:
            return []

    def close(self) -> None:
        if self.dead is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self._reap(block=True)
        self._closing = True
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        for fd in (self.report, self.listener, self.page):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        if self.page_view:
            _libc().munmap(self.page_view, _PAGE_BYTES)
            self.page_view = 0


def _seccomp_filters(pid: int) -> int | None:
    """``Seccomp_filters`` of /proc/PID/status, read from outside (None if unreadable)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Seccomp_filters:"):
                return int(line.split(":", 1)[1])
    except (OSError, ValueError):
        return None
    return None


def _exports(image: bytes, symbol: str) -> bool | None:
    """Whether the ELF image's .dynsym defines the function ``symbol`` (read by the judge,
    not by the executor); None where it cannot tell."""
    import io

    try:
        from elftools.elf.elffile import ELFFile

        table = ELFFile(io.BytesIO(image)).get_section_by_name(".dynsym")
        if table is None:
            return None
        return any(s.name == symbol and s["st_shndx"] != "SHN_UNDEF"
                   for s in table.iter_symbols())
    except Exception:   # noqa: BLE001 - any malformed ELF: the judge cannot tell
        return None


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


class HostKernel(Kernel):
    def __init__(self, name: str, executor: _Executor):
        self.name, self.executor = name, executor

    @property
    def refusals(self) -> _Refusals:
        return self.executor.refusals


class HostDevice(Device):
    backend = "host"

    def timing_model(self) -> TimingModel:
        return HOST_TIMING   # see kpair.measure.TimingModel

    def __init__(self, *, device: int = 0, flush_bytes: int | None = None):
        # One host, one "device": the ordinal names a worker slot of a pool (``--workers``),
        # recorded in the environment; the slots share the CPUs.
        self.ordinal = int(device)
        self._libc = _libc()
        self._arenas: list[_Arena] = []
        self._index: list[tuple[int, int, int]] = []   # (executor lo, hi, judge address)
        self._staged: list[tuple[int, bytes]] = []
        self._executors: list[_Executor] = []
        self._kernels: list[HostKernel] = []   # loaded and not unloaded: renewal respawns them
        self._last: _Executor | None = None
        # Twice the last-level cache, so one pass evicts what the kernel left behind.
        self._flush_bytes = min(2 * _llc_bytes(), 256 << 20) if flush_bytes is None \
            else flush_bytes
        self._flush: np.ndarray | None = None  # allocated on first use
        self._threads_before: int | None = None  # other threads when the last launch began
        self._filter_bytes = 0
        self._rlimits: dict = {}
        #: Timed launches whose CPU time the kernel did not account (timed by wall clock).
        self.unaccounted = 0
        # Refused system calls per code object (sha256 of the image, symbol): every load of
        # the same code adds to one tally (replicates reload it; ref's control copy is ref).
        self._refusals: dict[tuple[str, str], _Refusals] = {}

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
                "timer": "executor process CPU time, read from outside (clock_getcpuclockid)"}

    # ------------------------------------------------------------------ placement

    def map(self, ranges: Sequence[tuple[int, int]], *, relocate: bool = False) -> Mapping:
        spans = granular_spans(ranges, PAGE)
        if not spans:
            return Mapping("captured", 0, {"spans": 0})
        lo, hi = spans[0][0], spans[-1][1]
        reason = "forced" if relocate else None
        if reason is None and (lo < _USER_LO or hi > _USER_HI):
            reason = "captured pages lie outside an executor's address space"
        if reason is None and any(a < h and lo_ < b for a, b, _ in self._index
                                  for lo_, h in spans):
            reason = "captured pages overlap an earlier placement"
        if reason is None:
            self._arena(spans, 0)
            return Mapping("captured", 0, {"spans": len(spans)})
        top = max((b for _, b, _ in self._index), default=_RELOCATE_BASE)
        base = max(_RELOCATE_BASE, -(-top // (1 << 30)) * (1 << 30))
        if base < hi and lo < base + (hi - lo):   # a delta, never the captured pages again
            base = -(-hi // (1 << 30)) * (1 << 30)
        delta = base - lo
        self._arena([(lo, hi)], delta)
        return Mapping("relocated", delta, {"spans": 1, "reason": reason})

    def _arena(self, spans: list[tuple[int, int]], delta: int) -> None:
        size = sum(h - lo for lo, h in spans)
        fd, view = self._memfd(size, len(self._arenas))
        out, offset = [], 0
        for lo, h in spans:
            out.append((lo + delta, h + delta, offset))
            self._index.append((lo + delta, h + delta, view + offset))
            offset += h - lo
        self._index.sort()
        self._arenas.append(_Arena(fd, size, view, out))

    def _memfd(self, size: int, number: int | str) -> tuple[int, int]:
        """A sealed-size memfd of ``size`` bytes and its MAP_SHARED view in the judge."""
        name = number if isinstance(number, str) else f"regions-{number}"
        fd = os.memfd_create(f"kpair-{name}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            view = self._libc.mmap(None, size, _PROT_RW, _MAP_SHARED, fd, 0)
            if view in (None, _MAP_FAILED):
                raise PlacementError(f"cannot map {size} bytes of regions in the judge "
                                     f"(errno {ctypes.get_errno()})")
        except BaseException:
            os.close(fd)
            raise
        return fd, view

    def renew_memory(self) -> bool:
        """Other physical pages under every region, and a fresh executor for every loaded
        kernel: what a re-run in a new process meets, for a replicate.

        Each arena gets a new memfd (its pages are allocated while the old ones are still
        held, so none of them can be an old one) holding a copy of the old bytes: a region's
        contents, guard bands and poison are unchanged, at the same executor addresses. An
        executor maps its arenas once, at spawn, so every loaded kernel is moved to a fresh
        executor of the same code object, confined the same way (``_spawn``); its refused
        calls go on adding to that code object's tally. False when nothing is placed."""
        if not self._arenas:
            return False
        fresh: list[_Arena] = []
        try:
            for a in self._arenas:
                fd, view = self._memfd(a.size, len(fresh))
                fresh.append(_Arena(fd, a.size, view, a.spans))
                ctypes.memmove(view, a.view, a.size)
        except BaseException:
            self._drop(fresh)
            raise
        old, self._arenas = self._arenas, fresh
        self._index = sorted((lo, hi, a.view + off) for a in fresh for lo, hi, off in a.spans)
        self._drop(old)
        for kernel in self._kernels:
            before = kernel.executor
            kernel.executor = self._spawn(before.image, before.symbol, before.role,
                                          before.refusals)
            if before in self._executors:
                self._retire(before)
        return True

    def _drop(self, arenas: list[_Arena]) -> None:
        for a in arenas:
            self._libc.munmap(a.view, a.size)
            os.close(a.fd)

    def _segments(self, address: int, size: int):
        """(judge address, bytes) pieces of the executor range [address, address + size)."""
        if not self._index:  # nothing placed: a plain memory device (tests, armor alone)
            yield address, size
            return
        end = address + size
        while address < end or size == 0:
            i = bisect.bisect_right(self._index, (address, 1 << 64, 0)) - 1
            if i < 0 or not (self._index[i][0] <= address < self._index[i][1]):
                raise PlacementError(f"address {address:#x} is in no placed region")
            lo, hi, judge = self._index[i]
            n = min(end, hi) - address
            yield judge + address - lo, n
            if size == 0:
                return
            address += n

    def write(self, address: int, data: bytes) -> None:
        data = bytes(data)
        done = 0
        for ptr, n in self._segments(address, len(data)):
            ctypes.memmove(ptr, data[done:done + n], n)
            done += n

    def read(self, address: int, size: int) -> bytes:
        return b"".join(ctypes.string_at(ptr, n) for ptr, n in self._segments(address, size))

    def scatter(self, patches: Sequence[tuple[int, Patch]]) -> None:
        for address, p in patches:
            first = address + int(p.offsets[0])
            span = int(p.offsets[-1] - p.offsets[0]) + p.size
            pieces = list(self._segments(first, span))
            if len(pieces) != 1:    # across placed regions: one write per run
                super().scatter([(address, p)])
                continue
            view = np.frombuffer((ctypes.c_char * span).from_address(pieces[0][0]), np.uint8)
            at = (p.offsets - p.offsets[0])[:, None] + np.arange(p.size)
            view[at.ravel()] = np.frombuffer(p.data, np.uint8)

    def stage(self, address: int, data: bytes) -> None:
        self._staged.append((address, bytes(data)))

    def restore(self) -> None:
        for address, data in self._staged:
            self.write(address, data)

    def flush_cache(self) -> None:
        # The executors share the last-level cache with this process: writing twice its
        # size here evicts what a kernel left there.
        if self._flush is None:
            self._flush = np.zeros(self._flush_bytes, dtype=np.uint8)
        self._flush += 1

    def mapped_ranges(self) -> list[tuple[int, int]]:
        return [(lo, hi) for lo, hi, _ in self._index]

    # ------------------------------------------------------------------ executors

    def run_rel(self, wait: float | None) -> float:
        from ..measure import host_run_rel

        return host_run_rel(wait)

    def sched_times(self) -> dict[int, tuple[int, int]] | None:
        """Per live executor (pid): ns it ran on a CPU and ns it waited for one, from the
        kernel's /proc/PID/schedstat, read from outside (nothing the executor runs can change
        it); None where the kernel does not keep them."""
        out = {}
        for ex in self._executors:
            try:
                with open(f"/proc/{ex.pid}/schedstat") as f:
                    on_cpu, waited = f.read().split()[:2]
                out[ex.pid] = (int(on_cpu), int(waited))
            except (OSError, ValueError):
                continue
        return out or None

    def load(self, image: bytes, kernel_name: str, *, fmt: str = "elf-so") -> HostKernel:
        if fmt != "elf-so":
            raise ArchitectureMismatch(f"the host backend runs ELF shared objects, not {fmt}")
        arch = elf_arch(image)
        if arch != self.arch():
            raise ArchitectureMismatch(f"code object is built for {arch}, this host is "
                                       f"{self.arch()}")
        _sandbox.check()
        _undumpable()
        key = (hashlib.sha256(image).hexdigest(), kernel_name)
        tally = self._refusals.setdefault(key, _Refusals())
        ex = self._spawn(image, kernel_name, f"kernel {kernel_name!r} #{len(self._executors)}",
                         tally)
        kernel = HostKernel(kernel_name, ex)
        self._kernels.append(kernel)
        return kernel

    def refused_calls(self, kernel: HostKernel) -> dict:
        """The system calls the sandbox refused ``kernel``'s code object, over every load of
        it on this device so far (at load: its ELF constructors): ``count``, ``at_load``,
        ``calls`` (name -> count)."""
        for ex in self._executors:
            if ex.refusals is kernel.refusals:
                ex.drain()
        return kernel.refusals.to_json()

    def unload(self, kernel: HostKernel) -> None:
        """End the kernel's executor (a replicate's fresh load replaces it)."""
        ex = kernel.executor
        if kernel in self._kernels:
            self._kernels.remove(kernel)
        if ex in self._executors:
            self._retire(ex)

    def _retire(self, ex: _Executor) -> None:
        ex.drain()   # its last refusals count for its code object
        ex.close()
        self._executors.remove(ex)
        if self._last is ex:
            self._last = None

    def code_digest(self, kernel: HostKernel) -> str | None:
        """sha256 of the executable pages of the kernel's code object as mapped in its
        executor now (read through /proc/PID/mem: possible for root, whom the executor's
        non-dumpable flag does not stop), or None where they cannot be read."""
        pid, h = kernel.executor.pid, hashlib.sha256()
        try:
            with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb") as mem:
                spans = [line.split()[0] for line in maps
                         if "kpair-code" in line and line.split()[1][2] == "x"]
                for span in spans:
                    lo, hi = (int(x, 16) for x in span.split("-"))
                    mem.seek(lo)
                    h.update(mem.read(hi - lo))
        except (OSError, ValueError, OverflowError):
            return None
        return h.hexdigest() if spans else None

    def _limits(self) -> dict:
        uid = _sandbox.NOBODY if os.geteuid() == 0 else os.getuid()
        regions = sum(a.size for a in self._arenas)
        return {"as_bytes": regions + _AS_EXTRA, "nofile": _NOFILE,
                "nproc": _tasks_of(uid) + _NPROC_EXTRA, "core": 0, "fsize": 0,
                "memlock": 0, "msgqueue": 0}

    def _spawn(self, image: bytes, symbol: str, role: str, refusals: _Refusals) -> _Executor:
        exe = _sandbox.executor()
        code = os.memfd_create("kpair-code", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        page, view = self._memfd(_PAGE_BYTES, "call-page")
        # The executor's descriptor of the call page is read-only: it can map it only so.
        page_ro = os.open(f"/proc/self/fd/{page}", os.O_RDONLY | os.O_CLOEXEC)
        judge_end, its_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        report_r, report_w = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(report_r, False)
        # Children's ends, moved above the numbers they take in the child (0..6+arenas).
        low = 7 + len(self._arenas)
        theirs = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 64 + low)
                  for fd in (its_end.fileno(), 2, report_w, code, page_ro,
                             *(a.fd for a in self._arenas))]
        try:
            os.write(code, image)
            fcntl.fcntl(code, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
                        | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL)
            log = theirs[1]
            actions = [(os.POSIX_SPAWN_DUP2, theirs[0], 0), (os.POSIX_SPAWN_DUP2, log, 1),
                       (os.POSIX_SPAWN_DUP2, log, 2), (os.POSIX_SPAWN_DUP2, theirs[2], 3),
                       (os.POSIX_SPAWN_DUP2, theirs[3], 4), (os.POSIX_SPAWN_DUP2, theirs[4], 5)]
            actions += [(os.POSIX_SPAWN_DUP2, fd, 6 + i) for i, fd in enumerate(theirs[5:])]
            pid = os.posix_spawn(str(exe), [str(exe), str(len(self._arenas))], {},
                                 file_actions=actions)
        except BaseException:
            judge_end.close()
            for fd in (report_r, page):
                os.close(fd)
            self._libc.munmap(view, _PAGE_BYTES)
            raise
        finally:
            its_end.close()
            for fd in (report_w, code, page_ro, *theirs):
                os.close(fd)
        ex = _Executor(pid, report_r, page, view, role, refusals)
        ex.image, ex.symbol = image, symbol
        self._executors.append(ex)
        try:
            with judge_end:
                status, msg, listener = self._setup(ex, judge_end, symbol)
            if status == _ST_OK:
                ex.serve(listener)
                self._loaded(ex, image, symbol)
        except BaseException:
            ex.close()
            self._executors.remove(ex)
            raise
        if status != _ST_OK:   # told before the load, on the trusted channel: the sandbox's
            ex.close()
            self._executors.remove(ex)
            if status == _ST_PLACE:
                raise PlacementError(f"{msg} (captured pages taken by the executor's own "
                                     "mappings: replay with relocation)")
            raise _sandbox.SandboxUnavailable(f"the host sandbox could not be set up: {msg}")
        return ex

    def _setup(self, ex: _Executor, sock: socket.socket, symbol: str
               ) -> tuple[int, str, int | None]:
        """Send the setup message; the executor's reply (status, message) and its seccomp
        listener. Everything on this socket comes before any candidate code runs (the
        executor closes it before dlopen): a failure here is the sandbox's."""
        filt = _sandbox.filter_for(ex.pid)
        limits = self._limits()
        self._filter_bytes, self._rlimits = len(filt), limits
        regions = [(lo, hi - lo, off, 6 + k) for k, a in enumerate(self._arenas)
                   for lo, hi, off in a.spans]
        name = symbol.encode()
        setup = _SETUP.pack(_MAGIC, os.getpid(), _sandbox.NOBODY, _sandbox.NOBODY,
                            len(regions), len(name), len(filt), _PAGE_BYTES,
                            limits["as_bytes"], limits["nproc"], limits["nofile"], ex.nonce)
        setup += b"".join(_REGION.pack(*r) for r in regions) + name + filt
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # it died: see below
            sock.sendall(setup)
        data, fds = b"", []
        while True:
            if len(data) >= _REPLY.size:
                nonce, _, status, n = _REPLY.unpack_from(data)
                if nonce != ex.nonce:
                    break
                if len(data) >= _REPLY.size + min(n, 4096):
                    msg = data[_REPLY.size:_REPLY.size + min(n, 4096)].decode(errors="replace")
                    for extra in fds[1:]:
                        os.close(extra)
                    if status == _ST_OK and not fds:
                        break
                    return status, msg, fds[0] if fds else None
            try:
                chunk, more, _, _ = socket.recv_fds(sock, 8192, 4, socket.MSG_CMSG_CLOEXEC)
            except InterruptedError:
                continue
            except OSError:
                chunk, more = b"", []
            for fd in more:   # never inherited by what the judge starts later
                os.set_inheritable(fd, False)
            fds += more
            if not chunk:
                break
            data += chunk
        for fd in fds:
            os.close(fd)
        how = ex._reap(block=True) or "its setup reply was malformed"
        raise _sandbox.SandboxUnavailable(f"the host executor ended during its setup, before "
                                          f"loading anything: {how}")

    def _loaded(self, ex: _Executor, image: bytes, symbol: str) -> None:
        """Wait for the executor's first stop (its code object loaded, its loop reached).
        From dlopen on the process may run the candidate's code: a failure now is the
        kernel's (KernelCrashed in its role), except a symbol the judge itself finds missing
        from the image (SymbolNotFound)."""
        try:
            ex._wait_stop()
        except KernelCrashed:
            late = ex.late_report()
            if late is not None and late[0] == _ST_SYMBOL and _exports(image, symbol) is False:
                raise SymbolNotFound(f"kernel {symbol!r} is not exported by the code object") \
                    from None
            said = f" (it reported: {late[1]!r})" if late is not None else ""
            raise KernelCrashed(f"its code object failed while loading: {ex.dead}{said}",
                                ex.role) from None
        ex.drain()   # it is stopped: every record it wrote while loading is in the pipe
        with ex._lock:
            ex.loading = False
        ex.parked = True
        found = _seccomp_filters(ex.pid)   # None: a kernel without the field (before 5.9)
        if found is not None and found != _sandbox.FILTERS:
            ex.close()
            raise KernelCrashed(f"{found} seccomp filters are in force in its executor after "
                                f"its code object loaded; the executor installed "
                                f"{_sandbox.FILTERS}", ex.role)

    # ------------------------------------------------------------------ launches

    def _record(self, kernarg: bytes, params: Sequence[Param]) -> bytes:
        nint = _NINT.get(self.arch(), 6)
        ints: list[int] = []
        floats: list[int] = []
        stack: list[int] = []
        for i, p in enumerate(params):
            if p.kind in _FLOATS:
                size = _FLOATS[p.kind]
                bits = int.from_bytes(kernarg[p.offset:p.offset + size], "little")
                if len(kernarg[p.offset:p.offset + size]) != size:
                    raise AbiMismatch(f"parameter {i} lies past the end of the kernarg blob")
                (floats if len(floats) < _NFLOAT else stack).append(bits)
            elif p.kind in _INTS:
                value = struct.unpack_from(SCALAR_FORMATS[p.kind], kernarg, p.offset)[0]
                (ints if len(ints) < nint else stack).append(value % (1 << 64))
            else:
                raise AbiMismatch(f"parameter {i} has kind {p.kind!r}: the host backend calls "
                                  "C functions and needs a scalar or pointer kind")
        if len(stack) > _NSTACK:
            raise AbiMismatch(f"{len(params)} parameters: the host backend passes at most "
                              f"{nint} integer and {_NFLOAT} floating-point ones in registers "
                              f"and {_NSTACK} more on the stack")
        pad = lambda v, n: v + [0] * (n - len(v))  # noqa: E731
        return _CALL.pack(_OP_CALL, len(stack), *pad(ints, 8), *pad(floats, _NFLOAT),
                          *pad(stack, _NSTACK))

    def _begin(self, kernel: HostKernel) -> _Executor:
        if not isinstance(kernel, HostKernel):
            raise AbiMismatch("not a host kernel")
        ex = kernel.executor
        if self._last is not None and self._last is not ex:
            self._last.stop()
        self._last = ex
        self._threads_before = max(len(ex.tasks()) - 1, 0)
        return ex

    def launch(self, kernel: HostKernel, launch: Launch, kernarg: bytes,
               params: Sequence[Param]) -> None:
        record = self._record(kernarg, params)
        self._begin(kernel).call(record)

    def timed_launch(self, kernel: HostKernel, launch: Launch, kernarg: bytes,
                     params: Sequence[Param]) -> float:
        record = self._record(kernarg, params)
        ex = self._begin(kernel)
        ex.prepare(record)   # stopped at the top of its loop, the call page written
        t0 = ex.cpu()        # stopped: every thread's time is accounted
        w0 = time.perf_counter()
        ex.run_until_stopped()
        wall = time.perf_counter() - w0
        t = ex.cpu() - t0
        if t <= 0:   # the stop was reported before its last slice was accounted: read again
            time.sleep(0.001)
            t = ex.cpu() - t0
        if t <= 0:
            # The kernel accounted none of it (in a VM, steal time reported late is taken
            # off the next slices, and can eat a whole short launch): time it by the wall
            # clock from its SIGCONT to its stop, an upper bound, never a faster sample.
            self.unaccounted += 1
            t = wall
        return t

    def window_clock(self) -> float:
        return sum(ex.cpu() for ex in self._executors)

    def synchronize(self) -> None:
        """Let the last launched executor run until its threads have exited or gone idle.

        A host kernel that hands its work to a thread and returns looks instantly fast to
        ``timed_launch``; this is the host's "every stream": no thread of the executor may
        gain CPU time over a poll or be runnable at its end, and its thread count must fall
        back to what it was before the launch (or stay idle for a while: a persistent pool).
        Then the executor is stopped again. Gives up after two minutes. An executor with
        one thread is not woken: that thread has stopped itself and waits for the next call.
        The executor's own thread makes no call meanwhile: the call page's op is WAIT, on
        which it sleeps (a futex on the op word) until the next call brings it back."""
        ex = self._last
        if ex is None or ex.dead is not None or len(ex.tasks()) <= 1:
            return   # stopped, and its one thread waits for the next call: nothing runs
        ex.wait()
        try:
            deadline, idle = time.monotonic() + _SYNC_LIMIT_S, 0
            last = _thread_cpu(ex)
            while time.monotonic() < deadline:
                time.sleep(_POLL_S)
                now = _thread_cpu(ex)
                busy = any(t - last.get(tid, 0.0) > 0.1 * _POLL_S for tid, t in now.items()) \
                    or _threads_runnable(ex.pid, now)
                last = now
                if busy:
                    idle = 0
                    continue
                idle += 1
                others = len(now) - 1
                if self._threads_before is None or others <= self._threads_before \
                        or idle >= _IDLE_POLLS:
                    return
        finally:
            ex.stop()

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

    def seal(self) -> dict:
        """Check the sandbox can be set up (SandboxUnavailable otherwise: nothing runs) and
        say what it is. The confinement itself happens in each executor, at load."""
        _sandbox.check()
        _undumpable()
        return _sandbox.describe(filter_bytes=len(_sandbox.filter_for(os.getpid())),
                                 rlimits=self._limits())

    def close(self) -> None:
        for ex in self._executors:
            ex.close()
        self._executors.clear()
        self._last = None
        self._kernels.clear()
        self._drop(self._arenas)
        self._arenas.clear()
        self._index.clear()
        self._staged.clear()


def _thread_cpu(ex: _Executor) -> dict[int, float]:
    """CPU seconds of every thread of an executor, by thread id (each thread's own clock,
    ``(~tid << 3) | 6``: exact when it sleeps)."""
    out = {}
    for tid in ex.tasks():
        with contextlib.suppress(OSError):  # the thread exited meanwhile
            out[tid] = time.clock_gettime((~tid << 3) | 6)
    return out


def _threads_runnable(pid: int, tids: object) -> bool:
    """Whether any of these threads is running or waiting for a CPU (state R in /proc):
    under load a thread can wait in the run queue for many polls, gaining no CPU time, yet
    it has work left."""
    for tid in tids:
        try:
            fd = os.open(f"/proc/{pid}/task/{tid}/stat", os.O_RDONLY)
        except OSError:  # the thread exited meanwhile
            continue
        try:
            stat = os.read(fd, 512)
        finally:
            os.close(fd)
        if stat[stat.rindex(b")") + 2:][:1] == b"R":
            return True
    return False


def device_count() -> int:
    """One host device; a pool on it takes its worker slots from ``--workers``."""
    return 1


def open_device(**options: object) -> HostDevice:
    return HostDevice(**options)  # type: ignore[arg-type]
