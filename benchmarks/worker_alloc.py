"""What the worker's allocator setting (``kpair.isolation.WORKER_MALLOC``) saves, printed as
JSON.

The judge worker allocates region-sized buffers all the time: every mutated input
(``Mutation.apply``), every read-back (``Device.read``), every expected output. A fresh
buffer is page-faulted in on first touch; with 4 KiB pages that is 8,192 faults per 32 MiB.
This script times, in fresh processes with the worker's environment (``_worker_env``) and
with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=0`` (glibc's default), the medians of:
``bytearray(n)`` (what the CUDA and HIP read-backs allocate), ``bytearray(data)`` (a copy),
and ``Mutation.apply`` of a whole-region resample and a sparse change, at ``--mib`` MiB.

    python benchmarks/worker_alloc.py [--mib 32] [--repeat 9] [--out FILE.json]

``ratio`` is default-glibc time / worker time (> 1: the worker's setting is faster). Where the
kernel's transparent huge pages are ``never`` (/sys/kernel/mm/transparent_hugepage/enabled), or
glibc is older than 2.35, both columns are the same.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from _bench import emit

from kpair.isolation import _worker_env

PROBE = r"""
import json, statistics, sys, time
import numpy as np
from kpair.policy import Mutation
n, repeat = int(sys.argv[1]), int(sys.argv[2])
data = np.random.default_rng(0).standard_normal(n // 4).astype(np.float32).tobytes()
def median_ms(fn):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter(); out = fn(); times.append(time.perf_counter() - t0); del out
    return statistics.median(times) * 1e3
resample, sparse = (Mutation("x", "float32", m, 1) for m in ("resample", "sparse"))
print(json.dumps({
    "bytearray_n_ms": median_ms(lambda: bytearray(n)),
    "bytearray_copy_ms": median_ms(lambda: bytearray(data)),
    "apply_resample_ms": median_ms(lambda: resample.apply(data, np.random.default_rng(1))),
    "apply_sparse_ms": median_ms(lambda: sparse.apply(data, np.random.default_rng(1))),
}))
"""


def probe(env: dict[str, str], n: int, repeat: int) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, str(n), str(repeat)], env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    n = args.mib << 20
    worker = _worker_env()
    worker["PYTHONPATH"] = os.pathsep.join(sys.path)
    plain = {**worker, "GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    doc = {"benchmark": "worker_alloc", "mib": args.mib, "repeat": args.repeat,
           "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
           "glibc": " ".join(platform.libc_ver()),
           "transparent_hugepage": thp.read_text().strip() if thp.exists() else None,
           "worker_tunables": worker["GLIBC_TUNABLES"]}
    a, b = probe(worker, n, args.repeat), probe(plain, n, args.repeat)
    doc["cases"] = {k: {"worker_ms": round(a[k], 2), "default_ms": round(b[k], 2),
                        "ratio": round(b[k] / a[k], 2)} for k in a}
    emit(doc, args.out)


if __name__ == "__main__":
    main()
