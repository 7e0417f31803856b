"""Replay: place a snapshot's regions on a device and launch kernels on them.

``Replay(device, snapshot)`` maps every region (at its captured address, or uniformly
relocated), stages each region's pre-state as the pristine copy, and patches pointers when
relocated. Then ``run(kernel)`` restores pre-state, launches once and reads every region back;
``time_one(kernel)`` restores and flushes *outside* the timed region and returns the kernel's
own duration. ref and opt always run on the same placed regions: addresses matter to timing.

Every launch may take ``hooks`` (``LaunchHooks``; the trust checks pass their armour's,
``kpair.trust.armor``): ``before`` runs after the restore and before the cache flush (fresh
guard canaries and poison), ``after`` once the launch is done (canaries checked); ``run`` with
hooks waits for the whole device (``Device.synchronize``) before it reads anything back.

What the trust checks read of a placed replay is public here: ``regions`` and ``addresses``
(in the same order), ``pre`` and ``expected`` (region name -> bytes, pointers patched),
``span`` (the captured [lo, hi) the pointers were patched against), ``info``, ``device``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .backends import Device, Kernel, Mapping
from .errors import AbiMismatch, ArchitectureMismatch
from .formats import Record
from .placement import patch_pointers, span_of
from .snapshot import Launch, Snapshot


class LaunchHooks(Protocol):
    """What ``Replay`` calls around a launch (``kpair.trust.armor.Armor`` provides two)."""

    def before(self) -> None: ...

    def after(self) -> None: ...


@dataclass(frozen=True)
class ReplayInfo:
    mapping: Mapping
    patched_kernarg_words: int
    patched_region_words: int

    def to_json(self) -> dict:
        return {**self.mapping.to_json(), "patched_kernarg_words": self.patched_kernarg_words,
                "patched_region_words": self.patched_region_words}


class Replay:
    def __init__(self, device: Device, snapshot: Snapshot, *, relocate: bool = False,
                 cache: str = "cold"):
        m = snapshot.manifest
        if m.backend != device.backend:
            raise ArchitectureMismatch(f"snapshot was captured for backend {m.backend!r}, "
                                       f"this device is {device.backend!r}")
        if m.arch != device.arch():
            raise ArchitectureMismatch(f"snapshot was captured on {m.arch}, this device is "
                                       f"{device.arch()}")
        if cache not in ("cold", "warm"):
            raise ValueError(f"cache must be 'cold' or 'warm', not {cache!r}")
        self.device, self.snapshot, self.cache = device, snapshot, cache
        self.regions = m.regions
        self.params = m.kernarg.params
        ranges = [(r.address, r.end) for r in m.regions]
        mapping = device.map(ranges, relocate=relocate)
        delta = mapping.delta
        self.span = lo, hi = span_of(ranges) if ranges else (0, 0)

        self.kernarg, kernarg_words = patch_pointers(snapshot.kernarg(), 0, lo, hi, delta)
        self.addresses = [r.address + delta for r in m.regions]
        self.pre: dict[str, bytes] = {}
        self.expected: dict[str, bytes] = {}
        region_words = 0
        for i, r in enumerate(m.regions):
            pre, n = patch_pointers(snapshot.pre(i), r.address, lo, hi, delta)
            post, _ = patch_pointers(snapshot.post(i), r.address, lo, hi, delta)
            region_words += n
            self.pre[r.name], self.expected[r.name] = pre, post
            device.stage(self.addresses[i], pre)
        self.info = ReplayInfo(mapping, kernarg_words, region_words)

    def address_of(self, name: str) -> int:
        for r, a in zip(self.regions, self.addresses, strict=True):
            if r.name == name:
                return a
        raise KeyError(name)

    def check_abi(self, kernel: Kernel, role: str) -> None:
        """Refuse a kernel whose driver-reported parameter layout differs from the snapshot's."""
        layout = kernel.param_layout()
        if layout is None:
            return
        want = [(p.offset, p.size) for p in self.params]
        if layout != want:
            raise AbiMismatch(f"{role} kernel {kernel.name!r} takes parameters {layout} "
                              f"(offset, size), the snapshot's kernarg has {want}")

    def read_all(self) -> dict[str, bytes]:
        return {r.name: self.device.read(a, r.size)
                for r, a in zip(self.regions, self.addresses, strict=True)}

    def run(self, kernel: Kernel, launch: Launch | None = None, *,
            state: dict[str, bytes | int] | None = None,
            hooks: LaunchHooks | None = None) -> dict[str, bytes]:
        """Restore pre-state, launch once, and return every region's bytes afterwards.

        ``state`` replaces the pre-state of the regions it names for this launch only: bytes
        (a mutated input) or an int (the region filled with that 32-bit word, on the device).
        """
        self.device.restore()
        for name, data in (state or {}).items():
            if isinstance(data, int):
                size = next(r.size for r in self.regions if r.name == name)
                self.device.fill(self.address_of(name), size, data)
            else:
                self.device.write(self.address_of(name), data)
        if hooks is not None:
            hooks.before()
        self.device.launch(kernel, launch or self.snapshot.manifest.launch, self.kernarg,
                           self.params)
        if hooks is not None:
            self.device.synchronize()
            hooks.after()
        return self.read_all()

    def time_one(self, kernel: Kernel, launch: Launch | None = None, *,
                 hooks: LaunchHooks | None = None) -> float:
        """Seconds of one launch on freshly restored state (cold cache unless warm)."""
        self.device.restore()
        if hooks is not None:
            hooks.before()
        if self.cache == "cold":
            self.device.flush_cache()
        t = self.device.timed_launch(kernel, launch or self.snapshot.manifest.launch,
                                     self.kernarg, self.params)
        if hooks is not None:
            hooks.after()
        return t

    def time_window(self, kernel: Kernel, launch: Launch | None = None, *,
                    hooks: LaunchHooks | None = None) -> tuple[float, float]:
        """(timer seconds, window seconds) of one launch: the window opens just before the
        launch and closes after the whole device has synchronized, on the device's
        ``window_clock`` (wall time; CPU time on host). No cache flush: what the timer misses
        does not depend on it, and a flush is the costly part of a launch."""
        self.device.restore()
        if hooks is not None:
            hooks.before()
        w0 = self.device.window_clock()
        t = self.device.timed_launch(kernel, launch or self.snapshot.manifest.launch,
                                     self.kernarg, self.params)
        self.device.synchronize()
        window = self.device.window_clock() - w0
        if hooks is not None:
            hooks.after()
        return t, window


class Reproduction(Record, omit_defaults=True, kw_only=True):
    """Whether a captured dispatch replays to its captured post-state (``kpair replay``):
    ``status`` is "byte-exact" (every run equals it), "nondeterministic" (runs differ from
    each other), "mismatch" (runs agree, but not with the capture) or "error"."""

    snapshot: str
    kernel: str
    runs: int
    status: str
    differing_regions: list[str] = []
    unstable_regions: list[str] = []
    replay: dict | None = None
    error: str | None = None


def reproduce(device: Device, snapshot: Snapshot, runs: int) -> Reproduction:
    """Replay the snapshot's own code object ``runs`` times on its captured pre-state."""
    m = snapshot.manifest
    replay = Replay(device, snapshot)
    kernel = device.load(snapshot.code_object(), m.code.kernel_name, fmt=m.code.format)
    replay.check_abi(kernel, "captured")
    posts = [replay.run(kernel) for _ in range(runs)]
    names = [r.name for r in m.regions]
    unstable = [n for n in names if any(p[n] != posts[0][n] for p in posts[1:])]
    differs = [n for n in names if posts[0][n] != replay.expected[n]]
    status = "nondeterministic" if unstable else "mismatch" if differs else "byte-exact"
    return Reproduction(snapshot=str(snapshot.root), kernel=m.code.kernel_name, runs=runs,
                        status=status, differing_regions=differs, unstable_regions=unstable,
                        replay=replay.info.to_json())
