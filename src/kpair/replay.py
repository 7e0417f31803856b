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
``before`` is given the placed scratch the launched code does not own (``foreign_scratch``):
a buffer placed for another plan, a range's own scratch for a plan, a plan's for ref, the
bytes of a buffer past the size this plan declares. The armour canaries those like guard bands.

What the trust checks read of a placed replay is public here: ``regions`` and ``addresses``
(in the same order), ``pre`` and ``expected`` (region name -> bytes, pointers patched),
``span`` (the captured [lo, hi) the pointers were patched against), ``info``, ``device``.
A post-state capture kept as digests only (``Region.post_digest``) gets its bytes in
``expected`` by running the captured operations once, checked against its sha256; only
``reproduce`` (``digest_posts=True``) compares it by ``expected_digests`` instead, and on a
device that compares in place also keeps each regenerated region on the device
(``held_pre``; absent from ``pre``).

Reading back: ``run`` returns every region's bytes, but most of a checked run's launches
leave a region as bytes kpair already holds (the pre-state, the captured post-state, ref's
last answer, a fill). ``Known`` keeps, per region, a few such host byte strings each with a
device-side copy (``Device.keep``); ``read_back`` compares the region with them where the
memory is (``Device.compare``, ``check_fills``) and returns the equal host bytes object, and
reads the region to the host only when none is equal (then keeps that too). The result is
the same bytes a full read gives, so every verdict is the same; on a GPU it costs a compare
kernel instead of a device-to-host copy.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Protocol

import msgspec
import numpy as np

from .backends import Device, Kernel, Mapping
from .backends.base import Held, fill_bytes
from .elfabi import check_params
from .errors import AbiMismatch, ArchitectureMismatch, SnapshotFormatError
from .formats import Record
from .placement import patch_pointers, span_of
from .plan import kernarg as plan_kernarg
from .policy.mutation import Patch
from .program import CopyStep, MemsetStep, Program, ProgramDevice, Step, data_step
from .regen import regenerate
from .snapshot import Launch, Param, Snapshot, StateDigest, require_complete
from .snapshot.digest import hex64
from .snapshot.store import MANIFEST


class LaunchHooks(Protocol):
    """What ``Replay`` calls around a launch (``kpair.trust.armor.Armor`` provides them);
    ``before`` gets ``foreign_scratch`` of the launched kernel."""

    def before(self, foreign: Sequence[tuple[str, int, int, int]] = ()) -> None: ...

    def after(self) -> None: ...


@dataclass(frozen=True)
class ReplayInfo:
    mapping: Mapping
    patched_kernarg_words: int
    patched_region_words: int

    def to_json(self) -> dict:
        return {**self.mapping.to_json(), "patched_kernarg_words": self.patched_kernarg_words,
                "patched_region_words": self.patched_region_words}


#: Bytes between the captured span and a plan's first scratch buffer (a guard band).
_SCRATCH_GAP = 4096
#: Held copies per region (the oldest is dropped): pre, post, and the last few answers.
KNOWN_PER_REGION = 4
#: Up to this many changed bytes, ``hold_sparse`` builds a copy from the pre-state's.
_SPARSE_PUT = 256


class Known:
    """Per region, host byte strings with a device-side copy of each, most recently matched
    first; the pinned ones (pre- and post-state) stay, the others are dropped oldest first.

    Invariant: a held copy equals its host bytes when kept (``Device.keep`` copies first and
    the host bytes are read from that copy, never from the region a kernel may still write)."""

    def __init__(self, device: Device):
        self.device = device
        self.entries: dict[str, list[tuple[bytes, Held, bool]]] = {}

    def add(self, name: str, data: bytes, held: Held | None, *, pin: bool = False) -> None:
        if held is None:
            return
        entries = self.entries.setdefault(name, [])
        entries.insert(0, (data, held, pin))
        loose = [i for i, e in enumerate(entries) if not e[2]]
        while len(loose) > KNOWN_PER_REGION:
            self.device.drop(entries.pop(loose.pop())[1])

    def find(self, name: str, data: bytes) -> Held | None:
        """The held copy of exactly this bytes object, if any."""
        return next((h for d, h, _ in self.entries.get(name, ()) if d is data), None)

    def pin(self, name: str, data: bytes) -> bool:
        """Keep the entry of exactly this bytes object for good; False if there is none."""
        entries = self.entries.get(name, [])
        for i, (d, held, _) in enumerate(entries):
            if d is data:
                entries[i] = (d, held, True)
                return True
        return False

    def match(self, name: str, address: int, size: int) -> bytes | None:
        """The host bytes of a held copy the region at ``address`` equals, or None."""
        entries = self.entries.get(name, [])
        for i, (data, held, _) in enumerate(entries):
            got = self.device.compare(address, size, held)
            if got is None:      # the copy was overwritten: forget it, trust only a read
                self.device.drop(held)
                del entries[i]
                return None
            if got[0] == 0:
                if i:
                    entries.insert(0, entries.pop(i))
                return data
        return None


class Replay:
    def __init__(self, device: Device, snapshot: Snapshot, *, relocate: bool = False,
                 cache: str = "cold", plan_scratch: Sequence[tuple[str, int, int]] = (),
                 digest_posts: bool = False):
        """``plan_scratch``: (name, size, align) of the scratch buffers a launch plan
        declares; they are placed after the captured span (a guard gap apart) and, with the
        range's own scratch, listed in ``scratch`` as (name, placed address, size).
        ``digest_posts``: the caller compares post-states kept as digests only
        (``Region.post_digest``) by digest (``expected_digests``; ``expected`` then lacks
        those regions). Without it their bytes are made here, as a chain makes a pre-state:
        the snapshot's own captured operations run once on the staged pre-state, and each
        such region's bytes become ``expected`` only if their sha256 is the one capture
        recorded; otherwise the snapshot is refused (``SnapshotFormatError``, naming the
        region), so nothing is ever judged against bytes that are not the captured ones."""
        m = snapshot.manifest
        require_complete(m, snapshot.root)  # before anything is placed: it cannot replay
        kept = [i for i, r in enumerate(m.regions) if r.post_digest is not None]
        #: Region name -> the digests of a post-state kept without its bytes.
        self.expected_digests = {m.regions[i].name: m.regions[i].post_digest for i in kept}
        if m.backend != device.backend:
            raise ArchitectureMismatch(f"snapshot was captured for backend {m.backend!r}, "
                                       f"this device is {device.backend!r}")
        if m.arch != device.arch():
            raise ArchitectureMismatch(f"snapshot was captured on {m.arch}, this device is "
                                       f"{device.arch()}")
        if cache not in ("cold", "warm"):
            raise ValueError(f"cache must be 'cold' or 'warm', not {cache!r}")
        if not isinstance(device, ProgramDevice):   # a range's ops launch as one kernel
            device = ProgramDevice(device)
        self.device, self.snapshot, self.cache = device, snapshot, cache
        self.regions = m.regions
        self.params = m.kernarg.params
        ranges = [(r.address, r.end) for r in m.regions]
        spare = [(s.name, s.address, s.size) for s in m.scratch_regions]
        ranges += [(a, a + n) for _, a, n in spare]
        self.span = lo, hi = span_of(ranges) if ranges else (0, 0)
        cursor = hi
        for name, size, align in plan_scratch:   # after the captured span, a gap apart
            at = -(-(cursor + _SCRATCH_GAP) // align) * align
            spare.append((name, at, size))
            cursor = at + size
        mapping = device.map(ranges + [(a, a + n) for _, a, n in spare[len(m.scratch_regions):]],
                             relocate=relocate)
        delta = mapping.delta
        self.scratch = [(name, a + delta, n) for name, a, n in spare]
        self.delta = delta

        self.kernarg, kernarg_words = patch_pointers(snapshot.kernarg(), 0, lo, hi, delta)
        # Every operation's kernarg (a range's; the first is ``kernarg``), pointers patched
        # (none for a memset or a copy: ``data_step`` moves its addresses).
        self.op_kernargs = [
            b"" if op.kind != "kernel" else self.kernarg if i == 0 else
            patch_pointers(snapshot.read_blob(op.kernarg.blob, f"ops[{i}].kernarg.blob"),
                           0, lo, hi, delta)[0]
            for i, op in enumerate(m.operations)]
        self.addresses = [r.address + delta for r in m.regions]
        # Chains' regions: made and checked first. A reproduction on a device that keeps
        # copies where its memory is (``digest_posts`` and ``compares_in_place``) leaves a
        # region checked by its digest64 there: its pristine copy is a device-side one
        # (``held_pre``, put back after every restore), its unchanged post-state compared by
        # that digest; no byte of it crosses to the host.
        lean = digest_posts and device.compares_in_place
        made = regenerate(device, snapshot, self.addresses, read=not lean)
        on_device = {name for name, data in made.items() if data is None}
        #: (placed address, held copy) of each region whose pre-state stays on the device.
        self.held_pre: list[tuple[int, Held]] = []
        self.pre: dict[str, bytes] = {}
        self.expected: dict[str, bytes] = {}
        region_words = 0
        for i, (r, (pre, post)) in enumerate(zip(m.regions, snapshot.regions_data(on_device),
                                                  strict=True)):
            if pre is None:
                pre = self._keep_made(i, post)
                if pre is None:   # kept on the device
                    continue
            pre, n = patch_pointers(pre, r.address, lo, hi, delta)
            region_words += n
            self.pre[r.name] = pre
            if post is not None:   # None: kept as digests (``expected_digests``)
                self.expected[r.name] = patch_pointers(post, r.address, lo, hi, delta)[0]
            device.stage(self.addresses[i], pre)
        self.info = ReplayInfo(mapping, kernarg_words, region_words)
        if kept and not digest_posts:
            self._make_posts(kept)
        self.known = Known(device)
        self._fills: dict[tuple[str, int], bytes] = {}
        if device.compares_in_place:
            self._restore()
            for r, a in zip(m.regions, self.addresses, strict=True):
                if r.name not in self.pre:   # held on the device, compared by digest
                    continue
                self.known.add(r.name, self.pre[r.name], device.keep(a, r.size), pin=True)
                if r.name in self.expected and self.expected[r.name] != self.pre[r.name]:
                    self.known.add(r.name, self.expected[r.name],
                                   device.hold(self.expected[r.name]), pin=True)

    def _keep_made(self, i: int, post: bytes | None) -> bytes | None:
        """Region ``i``, regenerated and checked on the device: a device-side copy of it
        becomes its pristine pre-state, and its post-state, where unchanged, is expected by
        the chain's digests; None. Where the device has no room for the copy, its bytes
        (read back once) to stage as any region's."""
        r, address = self.snapshot.manifest.regions[i], self.addresses[i]
        held = self.device.keep(address, r.size)
        if held is None:
            return self.device.read(address, r.size)
        self.held_pre.append((address, held))
        if post is not None:
            lo, hi = self.span
            self.expected[r.name] = patch_pointers(post, r.address, lo, hi, self.delta)[0]
        elif r.name not in self.expected_digests:
            self.expected_digests[r.name] = StateDigest(r.size, r.regen.sha256,
                                                        r.regen.digest64)
        return None

    def _restore(self) -> None:
        """Every region's pristine pre-state back: the staged ones, then those held on the
        device (``held_pre``)."""
        self.device.restore()
        for address, held in self.held_pre:
            self.device.put(address, held)

    def _make_posts(self, kept: list[int]) -> None:
        """``expected`` of the regions whose post-state capture kept as digests: the
        captured operations run once, each such region read back and checked against the
        recorded sha256 (pointers moved back to the captured span first, as capture saw
        them). Refused by name where a region does not match."""
        m, snap = self.snapshot.manifest, self.snapshot
        lo, hi = self.span
        self.run(self.load_range("captured"), read=False)
        self.device.synchronize()
        for i in kept:
            r = m.regions[i]
            data = self.device.read(self.addresses[i], r.size)
            captured = patch_pointers(data, self.addresses[i], lo + self.delta,
                                      hi + self.delta, -self.delta)[0] if self.delta else data
            if hashlib.sha256(captured).hexdigest() != r.post_digest.sha256:
                raise SnapshotFormatError(
                    f"region {r.name!r}'s post-state was kept as a digest (no bytes), and "
                    "the captured operations, run again on the captured pre-state, do not "
                    f"make its sha256 {r.post_digest.sha256[:16]}... (a nondeterministic "
                    "kernel, or a tampered snapshot): nothing can be judged against it. "
                    "`kpair replay` tells which; capture with --store-bytes to keep the "
                    "bytes", path=snap.root / MANIFEST, field=f"regions[{i}].post_digest")
            self.expected[r.name] = data

    def load_range(self, role: str = "ref") -> Program:
        """The snapshot's own operations, each loaded from its captured code object, as one
        Program on the placed regions (a single dispatch: a one-step Program)."""
        m, snap = self.snapshot.manifest, self.snapshot
        steps, loaded = [], {}
        for i, op in enumerate(m.operations):
            if op.kind != "kernel":   # a captured memset or device-to-device copy
                steps.append(data_step(op, self.delta))
                continue
            key = (op.code.blob.sha256, op.code.kernel_name)
            if key not in loaded:
                field = "code_object.blob" if i == 0 else f"ops[{i}].code_object.blob"
                image = snap.read_blob(op.code.blob, field)
                if op.code.format == "elf-so":
                    check_params(image, op.code.kernel_name, op.kernarg.params,
                                 f"{role} op {i}")
                loaded[key] = self.device.load(image, op.code.kernel_name, fmt=op.code.format)
            kernel = loaded[key]
            layout = kernel.param_layout()
            if layout is not None and layout != [(p.offset, p.size) for p in op.kernarg.params]:
                raise AbiMismatch(f"{role} op {i} kernel {kernel.name!r} takes parameters "
                                  f"{layout}, the captured kernarg has "
                                  f"{[(p.offset, p.size) for p in op.kernarg.params]}")
            steps.append(Step(kernel, op.launch, self.op_kernargs[i], op.kernarg.params))
        name = " ; ".join(dict.fromkeys(op.label for op in m.operations))
        return Program(name, steps, [(a, n) for nm, a, n in self.scratch
                                     if nm in {s.name for s in m.scratch_regions}],
                       self.dead_spans())

    def load_plan(self, plan, images: Sequence[tuple[bytes, str]],
                  layouts: Sequence[Sequence[Param]]) -> Program:
        """A launch plan's launches as one Program: ``images[i]`` (code bytes, format) and
        ``layouts[i]`` (its parameter layout) for launch i; every kernarg built from the
        placed regions and the plan's scratch (``kpair.plan.kernarg``). Check the plan
        (``check_plan``) first. The Program owns the bytes of each buffer the plan declares,
        as many as it declares (a session may have placed the buffer larger for another
        plan: the rest is ``foreign_scratch``)."""
        addresses = {r.name: a for r, a in zip(self.regions, self.addresses, strict=True)}
        declared = {s.name: s.size for s in plan.scratch}
        addresses.update({name: a for name, a, _ in self.scratch if name in declared})
        steps, loaded = [], {}
        for launch, (image, fmt), layout in zip(plan.launches, images, layouts, strict=True):
            if launch.data:   # a memset or a copy on the bound buffers
                dst = addresses[launch.dst.name] + launch.dst.offset
                steps.append(
                    MemsetStep(dst, launch.length, launch.value, launch.element_size)
                    if launch.kind == "memset" else
                    CopyStep(dst, addresses[launch.src.name] + launch.src.offset,
                             launch.length))
                continue
            key = (launch.code, launch.kernel)
            if key not in loaded:
                loaded[key] = self.device.load(image, launch.kernel, fmt=fmt)
            steps.append(Step(loaded[key], Launch(launch.grid, launch.block,
                                                  launch.dynamic_shared_bytes,
                                                  launch.attributes),
                              plan_kernarg(launch, layout, addresses), tuple(layout)))
        name = " ; ".join(dict.fromkeys(launch.label for launch in plan.launches))
        return Program(name, steps, [(a, min(n, declared[nm])) for nm, a, n in self.scratch
                                     if nm in declared], self.dead_spans())

    def dead_spans(self) -> list[tuple[int, int]]:
        """Where the range's dead bytes (``Manifest.dead``) are placed: (address, size) each,
        zeroed after every execution of ref's range and of a plan alike."""
        return [(self.address_of(d.region) + d.offset, d.size)
                for d in self.snapshot.manifest.dead_spans]

    def foreign_scratch(self, kernel: Kernel) -> list[tuple[str, int, int, int]]:
        """The placed scratch ``kernel`` does not own, as (buffer name, address, bytes,
        offset in the buffer): every buffer for a plain kernel; for a Program, every buffer
        or part past the span it owns (``Program.scratch``). Nothing may write there during
        its launch: the trust checks canary it as a guard band."""
        owned = dict(kernel.scratch) if isinstance(kernel, Program) else {}
        out = []
        for name, address, size in self.scratch:
            mine = min(owned.get(address, 0), size)
            if mine < size:
                out.append((name, address + mine, size - mine, mine))
        return out

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

    def check_declared(self, image: bytes, kernel: str, fmt: str, role: str) -> None:
        """Before ``image`` is loaded: refuse (``AbiMismatch``) a host shared object whose
        DWARF declares other parameters than the snapshot's kernarg passes
        (``kpair.elfabi``); nothing to read in a stripped one. Other formats: ``check_abi``."""
        if fmt == "elf-so":
            check_params(image, kernel, self.params, role)

    def read_all(self) -> dict[str, bytes]:
        return {r.name: self.device.read(a, r.size)
                for r, a in zip(self.regions, self.addresses, strict=True)}

    def read_back(self, names: list[str] | None = None, fills: dict[str, int] | None = None
                  ) -> dict[str, bytes]:
        """The bytes of the named regions (all by default), as ``read_all`` gives them, read
        to the host only where they equal no known bytes (see ``Known``). ``fills``: region ->
        a 32-bit word it was filled with before the launch, also tried."""
        d = self.device
        if not d.compares_in_place:
            return {r.name: d.read(a, r.size)
                    for r, a in zip(self.regions, self.addresses, strict=True)
                    if names is None or r.name in names}
        out: dict[str, bytes] = {}
        for r, a in zip(self.regions, self.addresses, strict=True):
            if names is not None and r.name not in names:
                continue
            data = self.known.match(r.name, a, r.size)
            if data is None and fills and r.name in fills:
                word = fills[r.name]
                if d.check_fills([(a, r.size)], word)[0][0] == 0:
                    data = self._fills.get((r.name, word)) or fill_bytes(word, r.size)
                    self._fills = {(r.name, word): data}   # the last one only: they are big
            if data is None:
                held = d.keep(a, r.size)
                data = d.read(a, r.size) if held is None else d.fetch(held)
                self.known.add(r.name, data, held)
            out[r.name] = data
        return out

    def pin(self, name: str, data: bytes) -> None:
        """Keep ``data``, bytes region ``name`` holds at times (a timed input variant, its
        expected output), with a device-side copy until the replay ends, so that writing it
        and matching it never cost a host transfer."""
        if self.device.compares_in_place and not self.known.pin(name, data):
            self.known.add(name, data, self.device.hold(data), pin=True)

    def keep(self, names: Sequence[str]) -> dict[str, Held]:
        """A copy of each named region as it is now: where the device keeps copies, else read
        to the host. ``drop`` gives them back."""
        out = {}
        for name in names:
            address, size = self.address_of(name), len(self.pre[name])
            held = self.device.keep(address, size)
            out[name] = held if held is not None else Held(size, self.device.read(address, size))
        return out

    def drop(self, kept: dict[str, Held]) -> None:
        for held in kept.values():
            self.device.drop(held)

    def equals(self, expected: dict[str, bytes]) -> bool | None:
        """Whether every named region holds exactly its ``expected`` bytes, decided where the
        memory is (one compare per region against the held copy of those bytes); None when a
        region's bytes are held nowhere (or a held copy was overwritten): read them back."""
        if not self.device.compares_in_place:
            return None
        for name, data in expected.items():
            held = self.known.find(name, data)
            got = None if held is None else self.device.compare(self.address_of(name),
                                                                  len(data), held)
            if got is None or got[0]:
                return None if got is None else False
        return True

    def sparse_words(self, name: str, data: bytes) -> np.ndarray | None:
        """Where ``data`` differs from region ``name``'s pre-state: the offsets of the changed
        words (8 bytes, or single bytes where the region is no whole number of words), or None
        where more than ``_SPARSE_PUT`` bytes change. Pure: a worker thread may find them while
        the device runs."""
        base = self.pre[name]
        if len(base) != len(data):
            return None
        # Compared a word at a time (8x fewer comparisons); changed words are written whole.
        w = 8 if len(data) % 8 == 0 else 1
        word = np.uint64 if w == 8 else np.uint8
        changed = np.flatnonzero(np.frombuffer(base, word) != np.frombuffer(data, word)) * w
        return None if changed.size * w > _SPARSE_PUT else changed

    def hold_sparse(self, name: str, data: bytes, changed: np.ndarray | None = None) -> None:
        """Give ``data``, region ``name``'s pre-state with a few bytes changed, a held copy
        made on the device from the held pre-state and those bytes, pinned: no upload of the
        whole region (on a GPU, a host-to-device copy of pageable memory is the slow part).
        ``changed``: ``sparse_words(name, data)``, where already found."""
        d, base = self.device, self.pre[name]
        held = self.known.find(name, base) if d.compares_in_place else None
        if held is None or len(base) != len(data):
            return
        if changed is None:
            changed = self.sparse_words(name, data)
            if changed is None:
                return
        w = 8 if len(data) % 8 == 0 else 1
        address = self.address_of(name)
        d.put(address, held)
        # One batch of small copies, ordered before the keep (no wait per word).
        d.patch([(address + at, data[at:at + w]) for at in changed.tolist()])
        self.known.add(name, data, d.keep(address, len(data)), pin=True)

    def _put(self, name: str, data: bytes) -> None:
        """Write ``data`` into region ``name``: from a held copy when there is one."""
        d, address = self.device, self.address_of(name)
        held = self.known.find(name, data) if d.compares_in_place else None
        if held is not None:
            d.put(address, held)
            return
        d.write(address, data)
        if d.compares_in_place:   # a mutated input: ref and opt both run on it
            self.known.add(name, data, d.keep(address, len(data)))

    def run(self, kernel: Kernel, launch: Launch | None = None, *,
            state: dict[str, bytes | int] | None = None,
            hooks: LaunchHooks | None = None, read: bool = True) -> dict[str, bytes]:
        """Restore pre-state, launch once, and return every region's bytes afterwards.

        ``state`` replaces the pre-state of the regions it names for this launch only: bytes
        (a mutated input) or an int (the region filled with that 32-bit word, on the device).
        ``read`` False: nothing is read back, {} is returned (the caller asks ``equals`` or
        ``read_back`` for what it needs).
        """
        self._restore()
        fills = {}
        for name, data in (state or {}).items():
            if isinstance(data, int):
                size = next(r.size for r in self.regions if r.name == name)
                self.device.fill(self.address_of(name), size, data)
                fills[name] = data
            else:
                self._put(name, data)
        if hooks is not None:
            hooks.before(self.foreign_scratch(kernel))
        self.device.launch(kernel, launch or self.snapshot.manifest.launch, self.kernarg,
                           self.params)
        if hooks is not None:
            self.device.synchronize()
            hooks.after()
        return self.read_back(fills=fills) if read else {}

    def _prepare_timed(self, state: dict[str, bytes] | None,
                       patches: Sequence[tuple[str, Patch]],
                       hooks: LaunchHooks | None, kernel: Kernel | None = None) -> None:
        """What comes before every timed launch of ``kernel``: restore, ``state`` (as in
        ``run``), the hooks (given ``kernel``'s ``foreign_scratch``), then ``patches``
        ((region, ``Patch``) pairs) over it, the cache flush. Patches
        come after the hooks: poison from a held copy replaces a whole region, and would undo
        the fresh input of a region updated in place."""
        self._restore()
        for name, data in (state or {}).items():
            self._put(name, data)
        if hooks is not None:
            hooks.before(() if kernel is None else self.foreign_scratch(kernel))
        if patches:
            self.device.scatter([(self.address_of(name), p) for name, p in patches])
        if self.cache == "cold":
            self.device.flush_cache()

    def time_one(self, kernel: Kernel, launch: Launch | None = None, *,
                 state: dict[str, bytes] | None = None,
                 patches: Sequence[tuple[str, Patch]] = (),
                 hooks: LaunchHooks | None = None) -> float:
        """Seconds of one launch on freshly restored state (cold cache unless warm), prepared
        by ``_prepare_timed``."""
        self._prepare_timed(state, patches, hooks, kernel)
        t = self.device.timed_launch(kernel, launch or self.snapshot.manifest.launch,
                                     self.kernarg, self.params)
        if hooks is not None:
            hooks.after()
        return t

    def time_window(self, kernel: Kernel, launch: Launch | None = None, *,
                    patches: Sequence[tuple[str, Patch]] = (),
                    hooks: LaunchHooks | None = None) -> tuple[float, float]:
        """(timer seconds, window seconds) of one launch prepared as ``time_one`` prepares
        one (nothing tells the two apart): the window opens just before the launch and closes
        after the whole device has synchronized, on the device's ``window_clock`` (wall time;
        CPU time on host)."""
        self._prepare_timed(None, patches, hooks, kernel)
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
    each other), "mismatch" (runs agree, but not with the capture) or "error".
    ``digest_regions``: regions compared by ``digest64`` computed on the device: those whose
    post-state capture kept as digests only, and, on a device that compares where its memory
    is, the regenerated regions left unchanged (their bytes never leave the device). A
    mismatch there says the digest differs; how many bytes differ is unknown.
    ``exit_code``: for an "error", the exit code of what went wrong where kpair knows it
    (3: the snapshot is bad, e.g. a chain that does not regenerate; 4: backend or ABI;
    5: a runtime failure); None: a runtime failure (5)."""

    snapshot: str
    kernel: str
    runs: int
    status: str
    differing_regions: list[str] = []
    unstable_regions: list[str] = []
    digest_regions: list[str] = []
    ops: int | None = None   # a range: how many operations were replayed as one
    replay: dict | None = None
    error: str | None = None
    exit_code: Annotated[int, msgspec.Meta(ge=2, le=5)] | None = None


def reproduce(device: Device, snapshot: Snapshot, runs: int) -> Reproduction:
    """Replay the snapshot's own code object ``runs`` times on its captured pre-state."""
    m = snapshot.manifest
    replay = Replay(device, snapshot, digest_posts=True)
    if m.is_range:   # every operation, in order, as one program
        kernel = replay.load_range("captured")
    else:
        image = snapshot.code_object()
        if m.code.format == "elf-so":  # what the object declares (DWARF), before any launch
            check_params(image, m.code.kernel_name, m.kernarg.params, "captured")
        kernel = replay.device.load(image, m.code.kernel_name, fmt=m.code.format)
        replay.check_abi(kernel, "captured")
    names = [r.name for r in m.regions]
    digested = [n for n in names if n in replay.expected_digests]
    by_bytes = [n for n in names if n not in replay.expected_digests]

    def one_run() -> dict[str, bytes | str]:
        """Every region after a run: bytes, or (kept as digests) its digest64 on the device."""
        replay.run(kernel, read=False)
        got: dict[str, bytes | str] = dict(replay.read_back(by_bytes)) if by_bytes else {}
        for n in digested:
            got[n] = hex64(replay.device.digest(replay.address_of(n),
                                                replay.expected_digests[n].size, 0))
        return got

    # Each run is compared with the first as it comes and then dropped: memory does not
    # grow with ``runs``.
    first = one_run()
    unstable_set: set[str] = set()
    for _ in range(runs - 1):
        post = one_run()
        unstable_set.update(n for n in names if post[n] != first[n])
        del post
    unstable = [n for n in names if n in unstable_set]
    differs = [n for n in names if first[n] != (replay.expected_digests[n].digest64
                                                if n in replay.expected_digests
                                                else replay.expected[n])]
    status = "nondeterministic" if unstable else "mismatch" if differs else "byte-exact"
    extra = {"ops": len(m.operations)} if m.is_range else {}
    return Reproduction(snapshot=str(snapshot.root), kernel=kernel.name, runs=runs, **extra,
                        status=status, differing_regions=differs, unstable_regions=unstable,
                        digest_regions=digested, replay=replay.info.to_json())
