"""Store and load one large region through the snapshot store; print host memory and speed.

    python benchmarks/big_region.py --size 1GiB [--content floats|zeros|random] [--level 1]
                                    [--dir DIR] [-o OUT.json]

Makes a region of ``--size`` bytes in host memory, then, each phase measured on its own:
``write`` (``SnapshotWriter.put`` + manifest), ``load`` (``Snapshot.pre``: the bytes
returned), ``load_into`` (``Snapshot.read_into`` a buffer allocated beforehand, where the
store has it), ``load_staged`` (``Snapshot.stream_blob`` through two 8 MiB staging buffers,
each piece copied into that buffer as a device copy would, where the store has it) and
``verify`` (every blob checked). For each: seconds, MB/s of raw bytes, the
peak resident set (Linux ``VmHWM``, reset before each phase through ``/proc/self/clear_refs``)
and, sampled every few milliseconds, the peak of its anonymous part (``RssAnon``: memory the
process allocated) and of its file-backed part (``RssFile``: a memory-mapped blob file, page
cache the kernel can drop). ``copies`` = (anonymous peak - anonymous before the phase) /
region size: how many extra region-sized buffers the phase held at once. A store that never
holds a region twice shows ~0 for write, load_into and verify and ~1 for load (the bytes it
returns). Prints one JSON document (also to ``-o``). Runs against whichever kpair is on the
path, so the same command measures an older tree (``PYTHONPATH=old/src``) for comparison.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from _bench import emit


def _status(key: str) -> int:
    """A ``/proc/self/status`` field in bytes (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        return True
    except OSError:
        return False


class Sampler:
    """The highest RssAnon and RssFile seen while it runs (sampled every ``every`` s)."""

    def __init__(self, every: float = 0.005):
        self.every, self.anon, self.file = every, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        self.anon = max(self.anon, _status("RssAnon"))
        self.file = max(self.file, _status("RssFile"))

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()

    def __enter__(self) -> Sampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def phase(name: str, size: int, region: int, fn, report: dict) -> object:
    """Run ``fn`` (moving ``size`` raw bytes) and record its time and memory; ``copies`` is
    counted in units of ``region`` bytes."""
    reset = _reset_peak()
    before, anon0, file0 = _status("VmRSS"), _status("RssAnon"), _status("RssFile")
    with Sampler() as seen:
        t0 = time.perf_counter()
        out = fn()
        seconds = time.perf_counter() - t0
    peak = _status("VmHWM")
    copies = (seen.anon - anon0) / region
    report[name] = {"s": round(seconds, 3), "MB_s": round(size / seconds / 1e6, 1),
                    "rss_before_bytes": before, "peak_rss_bytes": peak, "peak_reset": reset,
                    "anon_before_bytes": anon0, "peak_anon_bytes": seen.anon,
                    "peak_file_mapped_bytes": seen.file - file0, "copies": round(copies, 3)}
    print(f"{name}: {seconds:.2f} s, {size / seconds / 1e6:.0f} MB/s, {copies:.2f} region "
          f"copies at peak (+{(seen.file - file0) / region:.2f} of file mapped)",
          file=sys.stderr)
    return out


def make_region(size: int, content: str) -> bytes:
    if content == "zeros":
        return bytes(size)
    if content == "random":
        return np.random.default_rng(0).integers(0, 256, size, np.uint8).tobytes()
    # "floats": what a tensor holds, compressible a little (fp32 normal values)
    return np.random.default_rng(0).standard_normal(size // 4, np.float32).tobytes() + \
        bytes(size % 4)


def parse_size(text: str) -> int:
    units = {"": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
             "g": 1 << 30, "gib": 1 << 30}
    t = text.strip().lower()
    digits = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    return int(float(digits) * units[t[len(digits):]])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=parse_size, default=1 << 30, help="region bytes (1GiB)")
    p.add_argument("--content", choices=("floats", "zeros", "random"), default="floats")
    p.add_argument("--level", type=int, default=1, help="zstd level (capture's default 1)")
    p.add_argument("--dir", type=Path, help="where to write the snapshot (default: a "
                   "temporary directory, removed afterwards)")
    p.add_argument("-o", "--out", type=Path, help="also write the JSON here")
    args = p.parse_args(argv)

    import kpair
    from kpair.snapshot import (
        CodeObject,
        Kernarg,
        Launch,
        Manifest,
        Param,
        Region,
        Snapshot,
        SnapshotWriter,
    )

    report: dict = {"size_bytes": args.size, "content": args.content, "level": args.level,
                    "cpus": os.cpu_count(), "kpair": str(Path(kpair.__file__).parent)}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp) / "snap"
        data = make_region(args.size, args.content)
        after = bytearray(data)  # a written region: a second, distinct blob
        after[-1] ^= 1
        report["rss_with_regions_bytes"] = _status("VmRSS")

        def write():
            w = SnapshotWriter(root, level=args.level)
            pre = w.put(data)
            post = w.put(after)
            return w.finish(Manifest(
                backend="host", arch="x86_64",
                code=CodeObject(w.put(b"\x7fELF"), "elf-so", "k"), launch=Launch(),
                kernarg=Kernarg(w.put(bytes(8)), (Param(0, 8, "pointer", "x"),)),
                regions=(Region("x", 0x10000, args.size, pre, post),)))

        snap = phase("write", 2 * args.size, args.size, write, report)
        data = after = None  # the regions go: what follows holds only what it reads
        report["stored_bytes"] = snap.stored_bytes()
        report["compression"] = snap.manifest.regions[0].pre.compression  # "none": raw
        report["stored_over_raw"] = round(snap.stored_bytes() / (2 * args.size), 4)
        snap = Snapshot.open(root)
        got = phase("load", args.size, args.size, lambda: snap.pre(0), report)
        del got
        if hasattr(snap, "read_into"):
            buffer = bytearray(args.size)
            buffer[::4096] = bytes(len(buffer[::4096]))  # touched: resident before the phase
            phase("load_into", args.size, args.size,
                  lambda: snap.read_into(snap.manifest.regions[0].pre, buffer), report)
            if hasattr(snap, "stream_blob"):  # through two 8 MiB staging buffers
                staging = [bytearray(8 << 20), bytearray(8 << 20)]

                def to_device(at, piece):  # stands for an asynchronous copy to a device
                    buffer[at:at + len(piece)] = piece

                phase("load_staged", args.size, args.size,
                      lambda: snap.stream_blob(snap.manifest.regions[0].pre, to_device,
                                               buffers=staging), report)
            del buffer
        phase("verify", 2 * args.size, args.size, snap.verify, report)
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
