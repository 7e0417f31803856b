"""The interface every backend implements: a ``Device`` that replays dispatches.

Lifetime: ``open_device(name)`` → ``Device``; ``device.map(ranges)`` places the captured
address ranges once (at their captured addresses when the platform allows, else uniformly
relocated); ``device.load(image, kernel_name)`` gives a ``Kernel``; then any number of
``stage``/``restore``/``launch``/``timed_launch``/``read`` calls; ``device.close()`` releases
everything. Addresses passed to ``write``/``read``/``stage`` are *replay* addresses (captured
address + ``Mapping.delta``). A device is used by one thread of one process.

``Device`` is four roles: ``DeviceFacts`` (arch, environment, clocks), ``Code`` (load, unload,
what can be told of the loaded code, seal), ``Memory`` (placement, reads, writes, pristine
copies, fills, held copies) and ``Launcher`` (launch, timed launch, synchronisation, the
backend's ``TimingModel``). Each method without a default is abstract; the rest have a safe
default a backend overrides when it can do better. The GPU backends share one
implementation of the memory and timing roles (``_stream.StreamDevice``).

The trust checks compare memory far more often than they need its bytes, so a device may
compare where the memory is: ``keep`` snapshots bytes into a ``Held`` copy (on the device for
a GPU), ``compare`` tells whether memory still equals a held copy, ``check_fill`` whether it
still holds a fill pattern, ``digest`` hashes it (``digest64``, keyed). The defaults here go
through ``read``, so every backend has them; a GPU backend overrides them with kernels and
then reads back only what a report needs.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..measure import TimingModel
from ..snapshot import Launch, Param
from ..snapshot.digest import digest64

if TYPE_CHECKING:
    from ..policy.mutation import Patch


@dataclass(frozen=True)
class Mapping:
    """Where the captured ranges went: ``mode`` is "captured" (delta 0) or "relocated"."""

    mode: str
    delta: int
    detail: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"mode": self.mode, "delta": self.delta, "delta_hex": _signed_hex(self.delta),
                **self.detail}


def _signed_hex(v: int) -> str:
    return f"-{hex(-v)}" if v < 0 else hex(v)


class Held:
    """A copy of ``size`` bytes kept by ``Device.keep`` (or ``hold``), valid until the device
    closes or ``Device.drop`` releases it. The base class keeps the bytes on the host (``data``);
    a backend's subclass keeps them where its memory is."""

    def __init__(self, size: int, data: bytes | None = None):
        self.size, self.data = size, data


_PHILOX_M = (np.uint64(0xD2511F53), np.uint64(0xCD9E8D57))
_PHILOX_W = (0x9E3779B9, 0xBB67AE85)
_LOW = np.uint64(0xFFFFFFFF)


def philox4x32(counters: np.ndarray, key: tuple[int, int], rounds: int = 10) -> np.ndarray:
    """Random123's Philox4x32 (``rounds`` rounds) of each row of ``counters`` (n x 4 uint32)
    under ``key`` (two 32-bit words): n x 4 uint32."""
    c = [counters[:, i].astype(np.uint64) for i in range(4)]
    k0, k1 = key
    for _ in range(rounds):
        p0, p1 = _PHILOX_M[0] * c[0], _PHILOX_M[1] * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ np.uint64(k0), p1 & _LOW,
             (p0 >> np.uint64(32)) ^ c[3] ^ np.uint64(k1), p0 & _LOW]
        k0, k1 = (k0 + _PHILOX_W[0]) % 2**32, (k1 + _PHILOX_W[1]) % 2**32
    return np.stack(c, axis=1).astype(np.uint32)


def mask_bytes(key: int, size: int) -> bytes:
    """The bytes a held copy of ``size`` bytes is xored with under its 64-bit ``key``: byte j
    is byte j % 16 of Philox4x32-10 of the counter (j // 16, 0) (little-endian words), the
    keystream the cuda backend's check kernels mask held copies with. Without the key,
    bytes of the stream tell nothing of the others (Philox is built as a keyed pseudorandom
    function, though not proven a cipher)."""
    chunks = np.arange(-(-size // 16), dtype=np.uint64)
    counters = np.zeros((chunks.size, 4), np.uint32)
    counters[:, 0], counters[:, 1] = chunks & _LOW, chunks >> np.uint64(32)
    out = philox4x32(counters, (key & 0xFFFFFFFF, key >> 32 & 0xFFFFFFFF))
    return out.astype("<u4").tobytes()[:size]


def byte_diff(a: bytes, b: bytes) -> tuple[int, int | None]:
    """(bytes that differ, first differing offset) of two equally long byte strings."""
    if a == b:
        return 0, None
    bad = np.flatnonzero(np.frombuffer(a, np.uint8) != np.frombuffer(b, np.uint8))
    return int(bad.size), int(bad[0])


def fill_bytes(word: int, size: int) -> bytes:
    """``size`` bytes of the little-endian 32-bit ``word`` repeated (``Device.fill``'s layout)."""
    return ((word & 0xFFFFFFFF).to_bytes(4, "little") * -(-size // 4))[:size]


class Kernel(ABC):
    """A loaded kernel: its name and, when the driver can tell, its parameter layout."""

    name: str

    def param_layout(self) -> list[tuple[int, int]] | None:
        """(offset, size) per parameter as the driver sees it, or None if it cannot tell."""
        return None


class DeviceFacts(ABC):
    """What a device is: the architecture snapshots are matched against, the facts recorded
    into snapshots and results, its clocks."""

    backend: str = ""

    @abstractmethod
    def arch(self) -> str:
        """The architecture string snapshots are matched against (``x86_64``, ``sm_90``)."""

    @abstractmethod
    def environment(self) -> dict:
        """Device, driver and host facts recorded into snapshots and results."""

    def clocks(self) -> dict | None:
        """Current clocks (MHz) where the backend can read them, else None. Recorded before
        and after the measurement: a speedup taken while clocks moved deserves a second look."""
        return None


class Code(ABC):
    """Code objects: load a kernel, give it back, and what the backend can tell of the code
    it runs (a digest of its bytes, the calls a sandbox refused it), and the confinement of
    the process before candidate code is loaded (``seal``)."""

    @abstractmethod
    def load(self, image: bytes, kernel_name: str, *, fmt: str) -> Kernel:
        """Load a code object and find ``kernel_name`` in it (SymbolNotFound if absent)."""

    def unload(self, kernel: Kernel) -> None:  # noqa: B027 - most backends keep it to close
        """Give back what loading ``kernel`` took, where that matters (a process, a module)."""

    def code_digest(self, kernel: Kernel) -> str | None:
        """A digest of the code bytes ``kernel`` runs as loaded now, or None where the backend
        cannot read them (a GPU's loaded code is not readable through the driver)."""
        return None

    def seal(self) -> dict | None:
        """Confine this process before candidate code is loaded into it, where the backend's
        candidates run as native code in it (host); returns what was installed (for
        result.json), or None for backends whose candidates cannot touch host state (GPU
        code objects run on the device)."""
        return None

    def refused_calls(self, kernel: Kernel) -> dict | None:
        """The system calls a sandbox refused ``kernel``'s code object so far (``count``,
        ``at_load``, ``calls``: name -> count), or None where the backend runs no sandbox that
        can tell (GPU kernels make no system calls)."""
        return None


class Memory(ABC):
    """Device memory: placement of the captured ranges (``map``), reads and writes, pristine
    copies (``stage``/``restore``), the cache flush, fills, and held copies compared where
    the memory is (``keep``/``compare``/``check_fills``/``digest``, with read-back defaults
    that every backend has)."""

    @abstractmethod
    def map(self, ranges: Sequence[tuple[int, int]], *, relocate: bool = False) -> Mapping:
        """Make every captured [start, end) range accessible; ``relocate`` forces a delta."""

    def mapped_ranges(self) -> list[tuple[int, int]] | None:
        """The [start, end) replay-address ranges ``map`` made accessible, or None if unknown.

        Guard bands are written in the bytes of these ranges that no region covers. Unknown:
        only gaps shorter than 4 KiB between two regions are used (they lie in pages the two
        regions already map)."""
        return None

    def renew_memory(self) -> bool:
        """Back what ``map`` mapped with other physical memory at the same addresses, its
        bytes zeroed (a replay restores the regions before each launch), so that a
        measurement replicate meets another placement of the data as a fresh process does.
        False where the backend does not (the memory stays where it is)."""
        return False

    @abstractmethod
    def write(self, address: int, data: bytes) -> None: ...

    @abstractmethod
    def read(self, address: int, size: int) -> bytes: ...

    @abstractmethod
    def stage(self, address: int, data: bytes) -> None:
        """Keep ``data`` as the pristine content of ``address``; ``restore`` writes it back."""

    @abstractmethod
    def restore(self) -> None:
        """Write every staged pristine content back to its address, and wait for it."""

    @abstractmethod
    def flush_cache(self) -> None:
        """Evict the last-level cache (write a buffer of its size), and wait for it."""

    def fill(self, address: int, size: int, word: int) -> None:
        """Fill ``size`` bytes at ``address`` with the little-endian 32-bit ``word`` repeated
        (from ``address`` on). Poison and guard canaries are written with it, before every
        launch; the default goes through ``write``."""
        self.write(address, fill_bytes(word, size))

    def fill_many(self, spans: Sequence[tuple[int, int]], word: int) -> None:
        """``fill`` of every (address, size) with the same ``word`` (a device may do them in
        one launch)."""
        for address, size in spans:
            self.fill(address, size, word)

    def patch(self, writes: Sequence[tuple[int, bytes]]) -> None:
        """A few small (address, bytes) writes, in place before the next launch."""
        for address, data in writes:
            self.write(address, data)

    def scatter(self, patches: Sequence[tuple[int, Patch]]) -> None:
        """(region address, ``Patch``) pairs, in place before the next launch."""
        for address, p in patches:
            self.patch(p.writes(address))

    #: When False they are the defaults below, which read: callers may then just read.
    compares_in_place: bool = False

    def keep(self, address: int, size: int) -> Held | None:
        """A copy of the ``size`` bytes at ``address`` as they are now, or None where the
        device has no room for one (the caller then reads instead)."""
        return Held(size, self.read(address, size))

    def hold(self, data: bytes) -> Held | None:
        """A copy of host bytes, kept the way ``keep`` keeps device bytes (or None)."""
        return Held(len(data), bytes(data))

    def fetch(self, held: Held) -> bytes:
        """The bytes of a held copy (read from the copy, never from the memory it came from)."""
        if held.data is None:
            raise NotImplementedError("a backend that overrides keep() overrides fetch()")
        return held.data

    def put(self, address: int, held: Held) -> None:
        """Write a held copy to ``address`` (device-to-device where the copy is on the device)."""
        self.write(address, self.fetch(held))

    def drop(self, held: Held) -> None:  # noqa: B027 - host copies are garbage-collected
        """Release a held copy."""

    def intact(self, held: Held) -> bool:
        """Whether a held copy still holds what was kept (a kernel cannot reach host copies)."""
        return True

    def compare(self, address: int, size: int, held: Held) -> tuple[int, int | None] | None:
        """(bytes that differ, first differing offset or None) between the memory at
        ``address`` and ``held``; None if the held copy itself no longer holds what was kept
        (something overwrote it): the caller must then read the memory to know."""
        return byte_diff(self.read(address, size), self.fetch(held))

    def check_fills(self, spans: Sequence[tuple[int, int]], word: int
                    ) -> list[tuple[int, int | None]]:
        """For each (address, size): (bytes that differ from ``word`` repeated from
        ``address`` on, first such offset or None). Guard canaries are checked with it after
        every launch."""
        return [byte_diff(self.read(a, n), fill_bytes(word, n)) for a, n in spans]

    def check_many(self, spans: Sequence[tuple[int, int]], word: int,
                   compares: Sequence[tuple[int, int, Held]] = ()
                   ) -> tuple[list[tuple[int, int | None]], list[tuple[int, int | None] | None]]:
        """``check_fills(spans, word)`` and ``compare`` of each (address, size, held), as
        after one launch: (the fill results, the compare results). A device that checks where
        the memory is does them in one pass (the trust checks' canaries and compares after a
        timed launch)."""
        return (self.check_fills(spans, word) if spans else [],
                [self.compare(a, n, h) for a, n, h in compares])

    def digest(self, address: int, size: int, key: int = 0) -> int:
        """``digest64`` of the ``size`` bytes at ``address``."""
        return digest64(self.read(address, size), key)


class Launcher(ABC):
    """Launches and their timing: run a kernel, time it, wait for the whole device, and the
    measurement policy the backend declares (``timing_model``)."""

    @abstractmethod
    def launch(self, kernel: Kernel, launch: Launch, kernarg: bytes,
               params: Sequence[Param]) -> None:
        """Run the kernel once and wait for it; faults raise DriverError (or kill the process)."""

    @abstractmethod
    def timed_launch(self, kernel: Kernel, launch: Launch, kernarg: bytes,
                     params: Sequence[Param]) -> float:
        """Run the kernel once and return the seconds the kernel alone took."""

    def synchronize(self) -> None:  # noqa: B027 - launch() already waited for its own work
        """Wait for *all* work on the device, on every stream, not only the replay stream's.

        The timing-integrity check brackets a timed launch with a wall clock that stops only
        after this returns, so work a kernel started where the timer cannot see it shows up.
        """

    def window_clock(self) -> float:
        """Seconds on the clock the timing-integrity window is read from (differences only).

        Wall time by default. A backend whose ``timed_launch`` does not count time the
        process spends preempted reads a clock that does not either (host: CPU time of the
        process), so that other work on the machine widens neither the timer nor the window.
        """
        return time.perf_counter()

    def timing_model(self) -> TimingModel:
        """How this backend's timings become a speedup (``kpair.measure.TimingModel``:
        extra replicates, the run's own offset, the location read). Each backend names
        its own: ``GPU_TIMING`` (cuda, hip), ``HOST_TIMING`` (host)."""
        return TimingModel()

    def run_rel(self, wait: float | None) -> float:
        """A run-level term in log speedup (``kpair.measure.combine_replicates``) for a
        measurement whose kernels waited for a CPU ``wait`` of the time (``sched_times``);
        0 where the backend has none."""
        return 0.0

    def sched_times(self) -> dict[int, tuple[int, int]] | None:
        """Per process that runs kernels: (ns on a CPU, ns waiting for one) so far, or None
        where the backend runs none of its own (GPUs) or they cannot be read."""
        return None

    def measure_bandwidth(self, nbytes: int) -> float | None:
        """The fastest rate, in bytes/s, at which this device writes ``nbytes`` bytes, timed
        the way ``timed_launch`` times a kernel (caches as warm as they get), or None if the
        backend cannot tell. The impossible-speed check compares opt against it."""
        return None


class Device(DeviceFacts, Code, Memory, Launcher):
    """A backend's device: the four roles above (a caller that needs one role only may take
    that role's type), and its lifetime."""

    def close(self) -> None:  # noqa: B027 - optional for backends with nothing to release
        """Release every mapping, module and buffer."""

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
