"""The interface every backend implements: a ``Device`` that replays dispatches.

Lifetime: ``open_device(name)`` → ``Device``; ``device.map(ranges)`` places the captured
address ranges once (at their captured addresses when the platform allows, else uniformly
relocated); ``device.load(image, kernel_name)`` gives a ``Kernel``; then any number of
``stage``/``restore``/``launch``/``timed_launch``/``read`` calls; ``device.close()`` releases
everything. Addresses passed to ``write``/``read``/``stage`` are *replay* addresses (captured
address + ``Mapping.delta``). A device is used by one thread of one process.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..snapshot import Launch, Param


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


class Kernel(ABC):
    """A loaded kernel: its name and, when the driver can tell, its parameter layout."""

    name: str

    def param_layout(self) -> list[tuple[int, int]] | None:
        """(offset, size) per parameter as the driver sees it, or None if it cannot tell."""
        return None


class Device(ABC):
    backend: str = ""

    @abstractmethod
    def arch(self) -> str:
        """The architecture string snapshots are matched against (``x86_64``, ``sm_90``)."""

    @abstractmethod
    def environment(self) -> dict:
        """Device, driver and host facts recorded into snapshots and results."""

    @abstractmethod
    def load(self, image: bytes, kernel_name: str, *, fmt: str) -> Kernel:
        """Load a code object and find ``kernel_name`` in it (SymbolNotFound if absent)."""

    @abstractmethod
    def map(self, ranges: Sequence[tuple[int, int]], *, relocate: bool = False) -> Mapping:
        """Make every captured [start, end) range accessible; ``relocate`` forces a delta."""

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

    @abstractmethod
    def launch(self, kernel: Kernel, launch: Launch, kernarg: bytes,
               params: Sequence[Param]) -> None:
        """Run the kernel once and wait for it; faults raise DriverError (or kill the process)."""

    @abstractmethod
    def timed_launch(self, kernel: Kernel, launch: Launch, kernarg: bytes,
                     params: Sequence[Param]) -> float:
        """Run the kernel once and return the seconds the kernel alone took."""

    # Optional capabilities, used by the trust checks (kpair.audit). Each has a safe default;
    # a backend overrides them when it can do better.

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

    def fill(self, address: int, size: int, word: int) -> None:
        """Fill ``size`` bytes at ``address`` with the little-endian 32-bit ``word`` repeated
        (from ``address`` on). Poison and guard canaries are written with it, before every
        launch; the default goes through ``write``."""
        reps = -(-size // 4)
        self.write(address, (word.to_bytes(4, "little") * reps)[:size])

    def mapped_ranges(self) -> list[tuple[int, int]] | None:
        """The [start, end) replay-address ranges ``map`` made accessible, or None if unknown.

        Guard bands are written in the bytes of these ranges that no region covers. Unknown:
        only gaps shorter than 4 KiB between two regions are used (they lie in pages the two
        regions already map)."""
        return None

    def measure_bandwidth(self, nbytes: int) -> float | None:
        """The fastest rate, in bytes/s, at which this device writes ``nbytes`` bytes, timed
        the way ``timed_launch`` times a kernel (caches as warm as they get), or None if the
        backend cannot tell. The impossible-speed check compares opt against it."""
        return None

    def clocks(self) -> dict | None:
        """Current clocks (MHz) where the backend can read them, else None. Recorded before
        and after the measurement: a speedup taken while clocks moved deserves a second look."""
        return None

    def seal(self) -> dict | None:
        """Confine this process before candidate code is loaded into it, where the backend's
        candidates run as native code in it (host); returns what was installed (for
        result.json), or None for backends whose candidates cannot touch host state (GPU
        code objects run on the device)."""
        return None

    def close(self) -> None:  # noqa: B027 - optional for backends with nothing to release
        """Release every mapping, module and buffer."""

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
