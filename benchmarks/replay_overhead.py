"""Replay overhead of the cuda backend, printed as JSON.

For a few recorded dispatches (nvcc-built test kernels on numpy inputs) it measures what one
timed sample of the ABBA meter costs (restore + L2 flush + gated, event-timed launch) against
the kernel's own time, and how fast restore runs against a plain device-to-device copy of the
same bytes. Also: a large D2D copy (the device's copy ceiling) and the kernel time measured
without the timing gate, which shows how much Python's launch latency would add.

    python benchmarks/replay_overhead.py [--samples 200] [--out results.json]

Needs a CUDA device, cuda-bindings and nvcc. Builds its snapshots in a temporary directory.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _bench import emit

from kpair.backends import open_device
from kpair.record import record_call
from kpair.replay import Replay
from kpair.snapshot import Launch, Snapshot
from kpair.toolchain import compile_cubin

CUDA_SRC = Path(__file__).resolve().parents[1] / "tests" / "cuda"


def _med_us(values: list[float]) -> float:
    return round(statistics.median(values) * 1e6, 3)


def _wall(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def record_cases(tmp: Path, arch: str) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    axpy = compile_cubin(CUDA_SRC / "elementwise.cu", tmp / "elementwise.cubin", arch=arch)
    gemm = compile_cubin(CUDA_SRC / "gemm.cu", tmp / "gemm.cubin", arch=arch)
    cases = {}
    for n in (1 << 20, 8 << 20, 32 << 20):
        x, y = rng.standard_normal(n, np.float32), rng.standard_normal(n, np.float32)
        cases[f"axpy_n{n}"] = record_call(
            axpy, "axpy", [x, y, np.float32(1.5), np.int32(n)], tmp / f"axpy{n}",
            backend="cuda", launch=Launch((n // 256, 1, 1), (256, 1, 1))).root
    m = 1024
    a, b = rng.standard_normal((m, m), np.float32), rng.standard_normal((m, m), np.float32)
    cases[f"gemm_tiled_{m}"] = record_call(
        gemm, "gemm_tiled", [a, b, np.zeros((m, m), np.float32)] + [np.int32(m)] * 3,
        tmp / "gemm", backend="cuda", launch=Launch((m // 16, m // 16, 1), (16, 16, 1))).root
    return cases


def measure_case(path: Path, samples: int) -> dict:
    snap = Snapshot.open(path)
    code = snap.manifest.code
    restore_bytes = sum(r.size for r in snap.manifest.regions)
    with open_device("cuda") as dev:
        replay = Replay(dev, snap)
        kernel = dev.load(snap.code_object(), code.kernel_name, fmt=code.format)
        launch, kernarg, params = snap.manifest.launch, replay.kernarg, replay.params
        for _ in range(10):
            replay.time_one(kernel)
        kernel_s, sample_s = [], []
        for _ in range(samples):
            t0 = time.perf_counter()
            kernel_s.append(replay.time_one(kernel))
            sample_s.append(time.perf_counter() - t0)
        restore_s = [_wall(dev.restore) for _ in range(samples)]
        flush_s = [_wall(dev.flush_cache) for _ in range(samples)]
        launch_s = [_wall(lambda: dev.timed_launch(kernel, launch, kernarg, params))
                    for _ in range(samples)]
        # The same bytes in one plain D2D copy, enqueued and waited for the same way.
        src = dev._alloc(restore_bytes)
        dst = dev._alloc(restore_bytes)

        def copy() -> None:
            dev.drv("cuMemcpyDtoDAsync", dst, src, restore_bytes, dev.stream)
            dev.drv("cuStreamSynchronize", dev.stream)
        copy_s = [_wall(copy) for _ in range(samples)]
    with open_device("cuda", gate=False) as dev:
        replay = Replay(dev, snap)
        kernel = dev.load(snap.code_object(), code.kernel_name, fmt=code.format)
        ungated = [replay.time_one(kernel) for _ in range(samples)]
    k, s = statistics.median(kernel_s), statistics.median(sample_s)
    restore_bw = 2 * restore_bytes / statistics.median(restore_s)
    copy_bw = 2 * restore_bytes / statistics.median(copy_s)
    return {
        "kernel": code.kernel_name, "regions": len(snap.manifest.regions),
        "restore_bytes": restore_bytes, "kernel_median_us": _med_us(kernel_s),
        "kernel_ungated_median_us": _med_us(ungated),
        "sample_wall_median_us": _med_us(sample_s),
        "overhead_per_sample_ratio": round((s - k) / k, 4),
        "breakdown_median_us": {"restore": _med_us(restore_s), "flush": _med_us(flush_s),
                                "timed_launch_wall": _med_us(launch_s)},
        "restore_tbps": round(restore_bw / 1e12, 4),
        "same_bytes_d2d_tbps": round(copy_bw / 1e12, 4),
        "restore_vs_d2d_ratio": round(restore_bw / copy_bw, 4),
    }


def big_copy_tbps(size: int = 1 << 30, reps: int = 20) -> float:
    """A large D2D copy timed with events: the restore floor (read + write counted)."""
    with open_device("cuda") as dev:
        src, dst = dev._alloc(size), dev._alloc(size)
        drv = dev.drv
        start, end = drv("cuEventCreate", 0), drv("cuEventCreate", 0)
        best = []
        for _ in range(reps):
            drv("cuEventRecord", start, dev.stream)
            drv("cuMemcpyDtoDAsync", dst, src, size, dev.stream)
            drv("cuEventRecord", end, dev.stream)
            drv("cuEventSynchronize", end)
            best.append(float(drv("cuEventElapsedTime", start, end)) * 1e-3)
        drv("cuEventDestroy", start)
        drv("cuEventDestroy", end)
    return round(2 * size / statistics.median(best) / 1e12, 4)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--out", type=Path, help="also write the JSON here")
    args = p.parse_args(argv)
    with open_device("cuda") as dev:
        env = dev.environment()
    with tempfile.TemporaryDirectory(prefix="kpair-bench-") as tmp:
        cases = record_cases(Path(tmp), env["arch"])
        results = {name: measure_case(path, args.samples) for name, path in cases.items()}
    out = {"benchmark": "replay_overhead", "samples": args.samples,
           "device": env.get("device"), "arch": env.get("arch"),
           "driver": env.get("driver"), "clocks_mhz": env.get("clocks_mhz"),
           "timing": env.get("timing"), "flush_bytes": env.get("flush_bytes"),
           "d2d_1gib_tbps": big_copy_tbps(), "cases": results,
           "notes": "overhead_per_sample_ratio = (wall time of one timed sample - kernel "
                    "time) / kernel time; a sample is restore + L2 flush + gated launch. "
                    "Bandwidths count bytes read + written."}
    emit(out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
