"""Whether a snapshot holds every byte its dispatch can reach, and the refusal when not.

Capture leaves a region out when it is larger than the per-region cap (``kpair capture
--max-region-bytes``) or cannot be read; the snapshot then says ``complete: false`` and lists
what it lacks in ``omitted_regions`` (snapshots written before that field existed list it in
``provenance.omitted_regions``, read here as well). Replaying such a snapshot cannot work: the
kernel would read and write memory that is not placed (a driver fault, or nothing to place at
all), so ``replay``, ``pair`` and ``run`` refuse it up front with ``IncompleteSnapshot`` (a
bad input file, exit 3), naming each region left out, the bytes, and the capture flag that
keeps them. ``kpair inspect`` shows the same lines without refusing.
"""

from __future__ import annotations

import msgspec

from .._util import human_bytes
from ..errors import IncompleteSnapshot
from .model import Manifest, OmittedRegion

_GIB, _MIB = 1 << 30, 1 << 20


def left_out(manifest: Manifest) -> tuple[OmittedRegion, ...]:
    """The regions capture left out of this snapshot (empty for a complete one)."""
    if manifest.omitted_regions is not msgspec.UNSET:
        return manifest.omitted_regions
    found = []
    for entry in (manifest.provenance or {}).get("omitted_regions") or ():
        try:  # descriptive only in older snapshots: an entry that does not read is skipped
            found.append(msgspec.convert(entry, OmittedRegion, strict=False,
                                         dec_hook=_address))
        except (msgspec.ValidationError, TypeError, ValueError):
            continue
    return tuple(found)


def _address(kind: type, obj: object) -> object:
    if isinstance(obj, str):
        return kind(int(obj, 16))
    raise ValueError(obj)


def cap_flag(size: int) -> str:
    """``--max-region-bytes`` with the smallest round size (MiB or GiB) that keeps ``size``."""
    if size >= _GIB:
        return f"--max-region-bytes {-(-size // _GIB)}GiB"
    return f"--max-region-bytes {max(1, -(-size // _MIB))}MiB"


def describe_left_out(manifest: Manifest) -> list[str]:
    """Lines naming what an incomplete snapshot lacks and how to keep it; [] if complete."""
    if manifest.complete:
        return []
    missing = left_out(manifest)
    if not missing:
        return ["capture marked it incomplete without recording which regions it left out; "
                "capture the dispatch again"]
    total = sum(o.size for o in missing)
    lines = [f"capture left out {len(missing)} region{'s' if len(missing) != 1 else ''} the "
             f"kernel's arguments point to, {human_bytes(total)} ({total} bytes) in all:"]
    for o in missing:
        lines.append(f"{o.name} at {o.address:#x}, {human_bytes(o.size)} ({o.size} bytes): "
                     f"{o.reason}")
    capped = [o for o in missing if o.over_cap]
    if capped:
        lines.append(f"to keep {'them' if len(capped) > 1 else 'it'}, capture again with "
                     f"`kpair capture {cap_flag(max(o.size for o in capped))} ...`")
    if len(capped) < len(missing):
        lines.append("a region left out for another reason than the size cap is kept by no "
                     "capture setting")
    return lines


def require_complete(manifest: Manifest, path: object = None) -> None:
    """Refuse (``IncompleteSnapshot``, exit 3) a snapshot that lacks memory its kernel uses."""
    lines = describe_left_out(manifest)
    if lines:
        raise IncompleteSnapshot(
            "incomplete snapshot, refused before anything is placed or launched: "
            + " ".join(lines[:1]) + " " + "; ".join(lines[1:]), path=path)
