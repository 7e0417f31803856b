"""Speed of light: the least time any correct kernel can take for one captured dispatch.

``traffic(regions)`` reads the bytes a correct kernel must move off the snapshot's pre- and
post-state: every 4-byte word the launch changed must be written, and every region it left unchanged
(an input) is counted as read in full. ``Peaks`` are a device's own rates as kpair measured
them (copy bandwidth counting bytes read plus written; optionally a GEMM rate), measured once
per device and kept in a cache file (``peaks_cache()``). ``speed_of_light(traffic, peaks,
ref_s=..., opt_s=...)`` gives a ``SpeedOfLight``: the floor (bytes / bandwidth, or FLOPs /
FLOP rate when larger) and how close ref and opt come to it ("SOL 48% of memory bandwidth").

It is a lower bound under two assumptions, stated in every record's ``basis``: an input
region is read whole (a kernel that reads a part of it could go lower), and an in-place
region (read and written) counts once, as written. Words rewritten with their old value
do not count as written.

Pure: numpy and the records; a device is passed in (duck-typed: ``environment()``,
``measure_copy_bandwidth`` or ``measure_bandwidth``), never opened here.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ._util import utc_now, write_text_atomic
from .formats import Record, convert, encode

#: Bytes the host memcpy measurement copies (well above a last-level cache).
HOST_COPY_BYTES = 64 << 20
#: What the floor is made of, said in every record.
BASIS = ("bytes: every 4-byte word the captured launch changed is written; every region it "
         "left unchanged is read whole; an in-place region counts once, as written")


class RegionTraffic(Record):
    """One region's share: ``role`` read (unchanged), written (some bytes changed)."""

    name: str
    size: int
    role: Literal["read", "written"]
    bytes: int


class Traffic(Record):
    """The bytes a correct kernel must move for one dispatch."""

    read_bytes: int
    written_bytes: int
    regions: list[RegionTraffic]

    @property
    def total(self) -> int:
        return self.read_bytes + self.written_bytes


def traffic(regions: Iterable[tuple[str, bytes, bytes]]) -> Traffic:
    """``regions``: (name, pre-state, post-state) of every captured region."""
    rows, read, written = [], 0, 0
    for name, pre, post in regions:
        if len(pre) != len(post):
            raise ValueError(f"region {name}: pre and post differ in size")
        if pre == post:
            rows.append(RegionTraffic(name, len(pre), "read", len(pre)))
            read += len(pre)
            continue
        # In 4-byte words where the region allows: a kernel that writes a float writes all
        # of it, even the bytes that happen to keep their old value.
        word = np.uint32 if len(pre) % 4 == 0 else np.uint8
        a, b = np.frombuffer(pre, word), np.frombuffer(post, word)
        changed = int(np.count_nonzero(a != b)) * a.itemsize
        rows.append(RegionTraffic(name, len(pre), "written", changed))
        written += changed
    return Traffic(read, written, rows)


def snapshot_traffic(snapshot) -> Traffic:
    """``traffic`` of a ``kpair.snapshot.Snapshot`` (its blobs are read and verified). A
    region stored as a chain and not regenerated yet has no bytes here: by its digests it is
    read whole (unchanged) or counted as written whole."""
    m = snapshot.manifest
    bare = {r.name for r in m.regions if r.regen is not None
            and r.name not in snapshot.regenerated or r.post_digest is not None}
    t = traffic((r.name, snapshot.pre(i), snapshot.post(i)) for i, r in enumerate(m.regions)
                if r.name not in bare)
    if not bare:
        return t
    got = {row.name: row for row in t.regions}
    for r in m.regions:
        if r.name in bare:
            got[r.name] = RegionTraffic(r.name, r.size, "read" if r.pre.sha256 ==
                                        r.post.sha256 else "written", r.size)
    rows = [got[r.name] for r in m.regions]
    return Traffic(sum(x.bytes for x in rows if x.role == "read"),
                   sum(x.bytes for x in rows if x.role == "written"), rows)


class Peaks(Record, omit_defaults=True):
    """A device's rates as kpair measured them. ``copy_bytes_per_s`` counts bytes read plus
    bytes written (a copy of N bytes moves 2N)."""

    device: str
    backend: str
    copy_bytes_per_s: float
    copy_method: str
    measured: str
    flops_per_s: float | None = None
    flops_method: str | None = None


class SpeedOfLight(Record, omit_defaults=True):
    """The floor of one dispatch on one device, and how near ref and opt come to it
    (``*_fraction`` = floor / measured time: 1.0 would be at the speed of light)."""

    read_bytes: int
    written_bytes: int
    must_move_bytes: int
    peak_bytes_per_s: float
    floor_s: float
    bound: Literal["memory", "compute"]
    device: str
    peaks_measured: str
    basis: str = BASIS
    flops: float | None = None
    peak_flops_per_s: float | None = None
    ref_s: float | None = None
    opt_s: float | None = None
    ref_fraction: float | None = None
    opt_fraction: float | None = None

    @property
    def headroom(self) -> float | None:
        """How many times faster than ref the floor is (None: ref not measured)."""
        return 1.0 / self.ref_fraction if self.ref_fraction else None

    def summary(self) -> str:
        what = "memory bandwidth" if self.bound == "memory" else "peak FLOP rate"
        floor = f"floor {self.floor_s * 1e6:.3g} us for {self.must_move_bytes} bytes"
        parts = []
        for side, frac in (("ref", self.ref_fraction), ("opt", self.opt_fraction)):
            if frac is not None:
                parts.append(f"{side} at SOL {frac:.0%} of {what}")
        if not parts:
            return f"SOL {floor} (ref not measured yet)"
        return f"{', '.join(parts)} ({floor} at {self.peak_bytes_per_s / 1e9:.4g} GB/s)"


def speed_of_light(t: Traffic, peaks: Peaks, *, ref_s: float | None = None,
                   opt_s: float | None = None, flops: float | None = None) -> SpeedOfLight:
    memory_s = t.total / peaks.copy_bytes_per_s
    compute_s = flops / peaks.flops_per_s if flops and peaks.flops_per_s else 0.0
    floor = max(memory_s, compute_s)

    def frac(s: float | None) -> float | None:
        return round(floor / s, 6) if s and s > 0 else None

    return SpeedOfLight(
        read_bytes=t.read_bytes, written_bytes=t.written_bytes, must_move_bytes=t.total,
        peak_bytes_per_s=peaks.copy_bytes_per_s, floor_s=floor,
        bound="compute" if compute_s > memory_s else "memory", device=peaks.device,
        peaks_measured=peaks.measured, flops=flops,
        peak_flops_per_s=peaks.flops_per_s if flops else None, ref_s=ref_s, opt_s=opt_s,
        ref_fraction=frac(ref_s), opt_fraction=frac(opt_s))


# --------------------------------------------------------------------------- the peaks cache


def peaks_cache() -> Path:
    """``$KPAIR_CACHE_DIR/peaks.json`` (default ``~/.cache/kpair``)."""
    base = os.environ.get("KPAIR_CACHE_DIR") or Path.home() / ".cache" / "kpair"
    return Path(base) / "peaks.json"


def device_key(environment: dict[str, Any]) -> str:
    """Which device peaks belong to: backend, device name, and its UUID, PCI bus or CPU
    count."""
    backend = environment.get("backend", "?")
    name = environment.get("device") or environment.get("name") or "?"
    ident = (environment.get("uuid") or environment.get("pci_bus_id")
             or environment.get("cpus") or "")
    return f"{backend}|{name}|{ident}"


def cached_peaks(key: str) -> Peaks | None:
    try:
        entries = json.loads(peaks_cache().read_text())
        return convert(entries[key], Peaks)
    except (OSError, ValueError, KeyError, TypeError, Exception):  # noqa: BLE001
        return None  # no cache, or an unreadable one: measure again


def store_peaks(key: str, peaks: Peaks) -> None:
    path = peaks_cache()
    try:
        entries = json.loads(path.read_text())
        if not isinstance(entries, dict):
            entries = {}
    except (OSError, ValueError):
        entries = {}
    entries[key] = json.loads(encode(peaks))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(entries, indent=1, sort_keys=True) + "\n")
    except OSError:
        pass  # a read-only home: the peaks are measured again next time


# --------------------------------------------------------------------------- measuring


def host_copy_bandwidth(nbytes: int = HOST_COPY_BYTES, repeats: int = 8) -> float:
    """Best of ``repeats`` memcpy's of ``nbytes`` (numpy's copy), bytes read + written per s."""
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / max(best, 1e-9)


def measure_peaks(device, *, copy_bytes: int = 256 << 20, gemm=None) -> Peaks:
    """Measure ``device``'s copy bandwidth; ``gemm(backend)`` -> (FLOP/s, how) or None adds a
    GEMM rate (``kpair.mcp.peaks`` has one through torch: never a run's business)."""
    env = device.environment()
    backend = env.get("backend", getattr(device, "backend", "?"))
    if hasattr(device, "measure_copy_bandwidth"):
        bw, method = device.measure_copy_bandwidth(copy_bytes), \
            f"device-to-device copy of {copy_bytes} bytes, best of 8, read + written"
    elif backend == "host":
        bw, method = host_copy_bandwidth(), \
            f"memcpy of {HOST_COPY_BYTES} bytes, best of 8, read + written"
    else:
        bw, method = device.measure_bandwidth(copy_bytes), \
            f"memset of {copy_bytes} bytes, best of 8 (bytes written only)"
    peaks = Peaks(device=str(env.get("device") or env.get("name") or backend),
                  backend=str(backend), copy_bytes_per_s=float(bw), copy_method=method,
                  measured=utc_now())
    if gemm is not None:
        rate = gemm(backend)
        if rate is not None:
            peaks = peaks.replace(flops_per_s=rate[0], flops_method=rate[1])
    return peaks


def peaks_for(device, *, gemm=None) -> Peaks:
    """The device's peaks from the cache, measured and cached on first use (again when a
    GEMM rate is asked for and the cached entry has none)."""
    key = device_key(device.environment())
    found = cached_peaks(key)
    if found is not None and (found.flops_per_s is not None or gemm is None):
        return found
    peaks = measure_peaks(device, gemm=gemm)
    store_peaks(key, peaks)
    return peaks


__all__ = ["BASIS", "Peaks", "RegionTraffic", "SpeedOfLight", "Traffic", "cached_peaks",
           "device_key", "host_copy_bandwidth", "measure_peaks", "peaks_cache",
           "peaks_for", "snapshot_traffic", "speed_of_light", "store_peaks", "traffic"]
