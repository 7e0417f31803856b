"""Regenerable regions: make a region's pre-state on the device from its stored chain.

A snapshot (schema v2) may store a region's pre-state as a chain of operations instead of
its bytes (``Region.regen``, ``kpair.snapshot.Regen``): each operation a launch record as a
single dispatch has (code object, kernel, launch, kernarg), recorded when the program made the
region (a seeded generator, a fill, an elementwise kernel over other regenerable regions).
``regenerate(device, snapshot, addresses)`` runs every chain on the placed regions, in an
order where each chain's ``reads`` come first: the region is zero-filled, each operation is
loaded from the snapshot's own blobs and launched with its kernarg relocated the way a replay
relocates region pointers (every 8-byte word pointing into the captured span shifted by the
placement's delta), and the region is checked: by ``digest64`` computed on the device
(``Device.digest``: on a GPU one pass of the check kernel where the memory is, nothing
copied to the host for it) where capture recorded one (``Regen.digest64``), else read back
and checked against its sha256 (older snapshots; capture's own confirmation,
``verify_chains``, always checks the sha256).

Everything is checked before the first chain runs: every chain's code objects and kernargs
are present and match their digests (a missing one is refused by field name), every pointer
parameter points into the region itself or a region its chain reads. A region that does not
regenerate to its digest is refused (``SnapshotFormatError``, exit 3) with its name and the
operation that diverged (from the per-operation digests capture recorded, ``digests64`` on
the device where present, else ``digests``; the chain is run again from zero to find it),
and is never used: ``Replay`` calls this before it stages any pre-state, so neither ref nor
opt has launched. Nothing else is needed: no program, framework
or model, only the snapshot and a device of its backend.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
from collections.abc import Callable, Sequence
from pathlib import Path

from .backends import Device, Kernel
from .elfabi import check_params
from .errors import AbiMismatch, BackendUnavailable, KpairError, SnapshotFormatError
from .placement import patch_pointers, span_of
from .snapshot import SCALAR_FORMATS, BlobRef, Op, Param, Snapshot, write_json_atomic
from .snapshot.digest import hex64
from .snapshot.store import BLOBS, MANIFEST

__all__ = ["regenerate", "verify_capture", "verify_chains"]


def _fail(snapshot: Snapshot, message: str, field: str) -> SnapshotFormatError:
    return SnapshotFormatError(message, path=snapshot.root / MANIFEST, field=field)


def regenerate(device: Device, snapshot: Snapshot, addresses: Sequence[int], *,
               by_digest: bool = True, read: bool = True) -> dict[str, bytes | None]:
    """Make every regenerable region of ``snapshot`` at its placed address (``addresses[i]``
    for ``regions[i]``, already mapped on ``device``), check it, and return region name ->
    its bytes (also kept in ``snapshot.regenerated``; a Snapshot whose chains were all made
    already returns those bytes without running them again). Empty without chains.
    ``by_digest``: check a region whose chain records ``digest64`` by ``Device.digest`` (on
    the device); False (capture's confirmation): by the sha256 of the bytes read back.
    ``read`` False: a region checked on the device is not read back at all (None here, not
    in ``snapshot.regenerated``): its bytes stay where they were made."""
    m = snapshot.manifest
    order = m.regen_order()
    if all(m.regions[i].name in snapshot.regenerated for i in order):
        # Made and checked on this Snapshot already (a second placement): the same bytes.
        return {m.regions[i].name: snapshot.regenerated[m.regions[i].name] for i in order}
    if len(addresses) != len(m.regions):
        raise ValueError(f"{len(addresses)} addresses for {len(m.regions)} regions")
    ranges = [(r.address, r.end) for r in m.regions]
    ranges += [(s.address, s.end) for s in m.scratch_regions]
    lo, hi = span_of(ranges)
    delta = addresses[0] - m.regions[0].address
    by_name = {r.name: i for i, r in enumerate(m.regions)}

    # Every blob and every pointer first: nothing runs until the whole plan is known good.
    images: dict[tuple[str, str], tuple[bytes, str, str, tuple[Param, ...]]] = {}
    steps: dict[int, list[tuple[Op, bytes, str]]] = {}
    for i in order:
        r = m.regions[i]
        allowed = [m.regions[i]] + [m.regions[by_name[n]] for n in r.regen.reads]
        ops = []
        for j, op in enumerate(r.regen.ops):
            at = f"regions[{i}].regen.ops[{j}]"
            if op.kind != "kernel":   # a memset or a copy
                _check_data(snapshot, r.name, allowed, op, at)
                ops.append((op, None, at))
                continue
            key = (op.code.blob.sha256, op.code.kernel_name)
            if key not in images:
                images[key] = (snapshot.read_blob(op.code.blob, f"{at}.code_object.blob"),
                               op.code.format, at, op.kernarg.params)
            kernarg = snapshot.read_blob(op.kernarg.blob, f"{at}.kernarg.blob")
            _check_pointers(snapshot, r.name, allowed, op, kernarg, at)
            ops.append((op, patch_pointers(kernarg, 0, lo, hi, delta)[0], at))
        steps[i] = ops

    kernels: dict[tuple[str, str], Kernel] = {}
    for key, (image, fmt, at, params) in images.items():
        kernels[key] = _load(device, image, key[1], fmt, at, params)

    made: dict[str, bytes | None] = {}
    for i in order:
        r, address = m.regions[i], addresses[i]
        on_device = by_digest and r.regen.digest64 is not None
        _run(device, kernels, steps[i], address, r.size, delta)
        if on_device:
            good = hex64(device.digest(address, r.size, 0)) == r.regen.digest64
            what = f"digest64 {r.regen.digest64}"
        else:
            data = device.read(address, r.size)
            good = hashlib.sha256(data).hexdigest() == r.regen.sha256
            what = f"sha256 {r.regen.sha256[:16]}..."
        if not good:
            j, why = _diverged(device, kernels, steps[i], address, r, delta, on_device)
            op = r.regen.ops[j]
            raise _fail(snapshot, f"region {r.name!r} does not regenerate to its {what}: "
                        f"its chain diverged at operation {j} ({op.label}) {why}; refused "
                        "before any launch of ref or opt", f"regions[{i}].regen.ops[{j}]")
        if on_device:   # checked where it is; a replay that stages bytes reads them now
            if not read:
                made[r.name] = None
                continue
            data = device.read(address, r.size)
        made[r.name] = data
        snapshot.regenerated[r.name] = data
    return made


def _check_pointers(snapshot: Snapshot, name: str, allowed, op: Op, kernarg: bytes,
                    at: str) -> None:
    """Every pointer parameter of ``op`` points into its own region or one its chain reads."""
    for k, p in enumerate(op.kernarg.params):
        if p.kind != "pointer" or p.offset + p.size > len(kernarg):
            continue
        (value,) = struct.unpack_from(SCALAR_FORMATS["pointer"], kernarg, p.offset)
        if not any(r.address <= value < r.end for r in allowed):
            raise _fail(snapshot, f"chain of region {name!r}: argument {k} "
                        f"({p.name or 'unnamed'}) points at {value:#x}, which is in no region "
                        "the chain may touch (its own and those it reads: "
                        + ", ".join(r.name for r in allowed) + ")",
                        f"{at}.kernarg.params[{k}]")


def _load(device: Device, image: bytes, kernel_name: str, fmt: str, at: str,
          params: tuple[Param, ...]) -> Kernel:
    """The chain's kernel, loaded once, its declared parameters checked as a replay checks
    a range's operations."""
    if fmt == "elf-so":
        check_params(image, kernel_name, params, f"chain {at}")
    kernel = device.load(image, kernel_name, fmt=fmt)
    layout = kernel.param_layout()
    if layout is not None and layout != [(p.offset, p.size) for p in params]:
        raise AbiMismatch(f"chain {at} kernel {kernel_name!r} takes parameters {layout}, "
                          f"its recorded kernarg has {[(p.offset, p.size) for p in params]}")
    return kernel


def _check_data(snapshot: Snapshot, name: str, allowed, op: Op, at: str) -> None:
    """A memset writes inside the region; a copy writes inside it from a region it reads."""
    spans = [("dst", op.dst)] + ([("src", op.src)] if op.kind == "copy" else [])
    for what, address in spans:
        places = allowed[:1] if what == "dst" else allowed
        if not any(r.address <= address and address + op.size <= r.end for r in places):
            raise _fail(snapshot, f"chain of region {name!r}: the {op.kind}'s {what} "
                        f"[{address:#x}, +{op.size}) is not inside "
                        + ("the region" if what == "dst" else "a region the chain may read")
                        , f"{at}.{what}")


def _launch(device: Device, kernels, op: Op, kernarg: bytes | None, delta: int) -> None:
    if kernarg is None:   # a memset or a device-to-device copy, its addresses moved
        if op.kind == "memset":
            v, width = op.value, op.element_size
            word = v * 0x01010101 if width == 1 else v | v << 16 if width == 2 else v
            device.fill(op.dst + delta, op.size, word)
        else:
            copy = getattr(device, "copy", None)
            if copy is not None:
                copy(op.dst + delta, op.src + delta, op.size)
            else:
                device.write(op.dst + delta, device.read(op.src + delta, op.size))
    else:
        device.launch(kernels[op.code.blob.sha256, op.code.kernel_name], op.launch, kernarg,
                      op.kernarg.params)
    device.synchronize()


def _run(device: Device, kernels, steps, address: int, size: int, delta: int) -> None:
    device.fill(address, size, 0)
    for op, kernarg, _ in steps:
        _launch(device, kernels, op, kernarg, delta)


def _diverged(device: Device, kernels, steps, address: int, r, delta: int,
              on_device: bool = False) -> tuple[int, str]:
    """The first operation after which the region's digest differs from the recorded one
    (the chain run again from zero), and what was seen: by ``digests64`` on the device where
    ``on_device`` and they are recorded, else by the sha256 ``digests``."""
    if on_device and r.regen.digests64:
        digests, kind = r.regen.digests64, "digest64"

        def digest() -> str:
            return hex64(device.digest(address, r.size, 0))
    else:
        digests, kind = r.regen.digests, "sha256"

        def digest() -> str:
            return hashlib.sha256(device.read(address, r.size)).hexdigest()
    if not digests:
        return len(steps) - 1, ("(no per-operation digests recorded: the last operation "
                                "named)")
    device.fill(address, r.size, 0)
    for j, (op, kernarg, _) in enumerate(steps):
        _launch(device, kernels, op, kernarg, delta)
        got = digest()
        if got != digests[j]:
            return j, (f"(the region's {kind} after it is {got[:16]}..., recorded "
                       f"{digests[j][:16]}...)")
    return len(steps) - 1, "(every operation matched when run again: the chain is not " \
        "deterministic)"


# ---------------------------------------------------------------- capture's confirmation


_REGION_FIELD = re.compile(r"^regions\[(\d+)\]")


def _confirm(out: Path, rec: dict, doc: dict, pending: dict[str, str], shared: _Shared,
             tally: dict) -> list[str]:
    """``verify_chains`` on one record of capture.json, the record and totals updated;
    returns the digests of the captured bytes it no longer needs."""
    rewritten, added = verify_chains(out / rec["snapshot"], out / "blobs", pending, shared)
    tally["stored_as_bytes"] += len(rewritten)
    tally["verified"] += len(pending) - len(rewritten)
    rec["regenerated"] = len(pending) - len(rewritten)
    rec["stored_bytes"] = rec.get("stored_bytes", 0) + added
    totals = doc.get("totals") or {}
    if "stored_bytes" in totals:
        totals["stored_bytes"] += added
    del rec["chain_pre"]
    return list(pending.values())


def _closure(m, index: set[int]) -> set[str]:
    """The regions ``index`` and every chain reading one of them, transitively: what goes
    back to bytes when those chains fail (a chain reads only regenerable regions)."""
    names = {m.regions[i].name for i in index}
    while True:
        more = {r.name for r in m.regions if r.regen is not None and r.name not in names
                and any(n in names for n in r.regen.reads)}
        if not more:
            return names
        names |= more


def verify_chains(root: str | os.PathLike, pool: str | os.PathLike, pending: dict[str, str],
                  device_factory: Callable[[], Device]) -> tuple[list[str], int]:
    """Confirm the chains of the snapshot at ``root``, written by ``kpair capture``, by
    regenerating them on a device (``device_factory()``, a fresh one per attempt) as a
    replay does. A region whose chain does not make its captured sha256 (or cannot run) is
    stored as bytes instead, with every chain that reads it: its captured bytes wait in the
    capture's ``pool`` under their sha256 (``pending``: region name -> sha256), are linked
    into the snapshot and the manifest is rewritten. An error that is not kpair's (the
    device's) is tried once more on a fresh device; again, every chain goes to bytes.
    Returns the regions rewritten and the bytes their blobs add to the snapshot."""
    root, pool = Path(root), Path(pool)
    rewritten: list[str] = []
    added, retried = 0, False
    while True:
        snap = Snapshot.open(root)
        m = snap.manifest
        if not any(r.regen is not None for r in m.regions):
            return rewritten, added
        try:
            with device_factory() as dev:
                ranges = [(r.address, r.end) for r in m.regions]
                ranges += [(s.address, s.end) for s in m.scratch_regions]
                delta = dev.map(ranges, relocate=True).delta
                regenerate(dev, snap, [r.address + delta for r in m.regions],
                           by_digest=False)
            return rewritten, added
        except NoDevice:
            raise   # nothing was tried: the chains stay as they are
        except Exception as e:  # any failure: the chains are not confirmed
            if not isinstance(e, KpairError) and not retried:
                retried = True   # the device itself (a shared one is closed): once more
                continue
            at = _REGION_FIELD.match(getattr(e, "field", None) or "")
            failed = {int(at.group(1))} if at and m.regions[int(at.group(1))].regen \
                else {i for i, r in enumerate(m.regions) if r.regen is not None}
        names = _closure(m, failed)
        regions = []
        for r in m.regions:
            if r.name in names and r.regen is not None:
                ref, size = _link_pending(root, pool, r.name, pending.get(r.name), r.size)
                added += size
                post = r.post_blob if r.post_blob or r.post_digest else ref   # unchanged
                r = r.replace(pre_blob=ref, post_blob=post, regen=None)
            regions.append(r)
        rewritten += sorted(names)
        write_json_atomic(root / MANIFEST, m.replace(regions=tuple(regions)).to_json())


def _link_pending(root: Path, pool: Path, name: str, digest: str | None, size: int
                  ) -> tuple[BlobRef, int]:
    """The pooled blob of a region's captured bytes, linked into ``root``'s blobs, and its
    size on disk."""
    found = sorted(pool.glob(f"{digest}.*")) if digest else []
    if not found:
        raise SnapshotFormatError(f"the captured bytes of region {name!r} are not in the "
                                  f"capture's pool ({pool}): its chain cannot be replaced",
                                  path=root / MANIFEST)
    pooled = found[0]
    target = root / BLOBS / pooled.name
    if not target.exists():
        try:
            os.link(pooled, target)
        except OSError:
            shutil.copyfile(pooled, target)
    return (BlobRef(f"{BLOBS}/{pooled.name}", size, digest,
                    "none" if pooled.suffix == ".raw" else "zstd"), pooled.stat().st_size)


class NoDevice(BackendUnavailable):
    """No device to confirm chains on (opening one failed): they stay, unconfirmed."""



class _Shared:
    """One device for the confirmation of many snapshots (a device is slow to open): each
    use maps its snapshot anew on it; a fresh device once ``budget`` bytes were mapped on
    this one, and after any error (its state is then unknown)."""

    def __init__(self, factory: Callable[[], Device], budget: int):
        self.factory, self.budget = factory, budget
        self.device: Device | None = None
        self.mapped = 0
        self.opened = 0

    def __call__(self) -> _Shared:
        return self

    def __enter__(self) -> Device:
        if self.device is not None and self.mapped > self.budget:
            self.close()
        if self.device is None:
            try:
                self.device = self.factory()
                self.device.__enter__()
            except Exception as e:
                self.device = None
                raise NoDevice(f"no device to regenerate the chains on: {e}") from None
            self.mapped, self.opened = 0, self.opened + 1
        return _Charged(self.device, self)

    def __exit__(self, kind, *_) -> None:
        if kind is not None:
            self.close()

    def close(self) -> None:
        device, self.device = self.device, None
        if device is not None:
            device.__exit__(None, None, None)


class _Charged:
    """The shared device, counting the bytes each ``map`` places on it."""

    def __init__(self, device: Device, owner: _Shared):
        self._device, self._owner = device, owner

    def __getattr__(self, name: str):
        return getattr(self._device, name)

    def map(self, ranges, *, relocate: bool = False):
        self._owner.mapped += sum(hi - lo for lo, hi in ranges)
        return self._device.map(ranges, relocate=relocate)


def verify_capture(out: str | os.PathLike, device_factory: Callable[[], Device], *,
                   budget: int = 8 << 30) -> dict:
    """Confirm every chain a ``kpair capture`` into ``out`` stored (``capture.json``'s
    ``chain_pre``, per dispatch or range): ``verify_chains`` on each such snapshot; then
    ``capture.json`` says how many regions are regenerated, and the captured bytes of the
    chains that held are dropped from the pool (nothing links them). One device serves the
    snapshots in turn until ``budget`` bytes were placed on it (then a fresh one). Returns
    {"verified": chains that held, "stored_as_bytes": regions rewritten, "devices":
    devices opened}."""
    out = Path(out)
    path = out / "capture.json"
    doc = json.loads(path.read_text())
    tally = {"verified": 0, "stored_as_bytes": 0}
    dropped: set[str] = set()
    shared = _Shared(device_factory, budget)
    try:
        for rec in [*doc.get("dispatches", []), *doc.get("ranges", [])]:
            pending = rec.get("chain_pre")
            if pending and rec.get("snapshot"):
                dropped.update(_confirm(out, rec, doc, pending, shared, tally))
    finally:   # what was confirmed stays confirmed, whatever stopped the rest
        shared.close()
        waiting = {d for rec in [*doc.get("dispatches", []), *doc.get("ranges", [])]
                   for d in (rec.get("chain_pre") or {}).values()}
        for digest in dropped - waiting:
            for pooled in (out / "blobs").glob(f"{digest}.*"):
                if pooled.stat().st_nlink == 1:   # no snapshot links it: a verified chain's
                    pooled.unlink()
        write_json_atomic(path, doc)
    tally["devices"] = shared.opened
    return tally
