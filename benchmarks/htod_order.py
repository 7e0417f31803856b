"""Whether device work queued right after a host-to-device copy sees every copied byte.

kpair's replay stream is non-blocking. A plain ``cuMemcpyHtoD`` from pageable host memory runs
on the legacy stream and returns once the bytes are staged, "but the DMA to final destination
may not have completed" (CUDA, API synchronization behavior). The cuda backend therefore copies
on the replay stream and waits for it (``CudaDevice._upload``). This script looks for the
difference on a real GPU: each round writes a new byte pattern over ``--mib`` MiB, then at once
copies the region device-to-device on the replay stream (``Device.keep``, as a launch would read
it) and reads that copy back.

    python benchmarks/htod_order.py [--mib 64] [--rounds 40] [--out FILE.json]

Printed as JSON: per way of copying (``legacy``: ``cuMemcpyHtoD``; ``replay_stream``: kpair's
``Device.write``), the rounds whose copy missed bytes of the new pattern, and the bytes missed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from _bench import emit

from kpair.backends import open_device


def rounds(dev, address: int, size: int, n: int, write) -> dict:
    missed_rounds, missed_bytes = 0, 0
    for i in range(n):
        data = np.full(size, (i * 37 + 1) % 251 + 1, np.uint8).tobytes()
        write(address, data)
        held = dev.keep(address, size)       # a stream-ordered read of the region, at once
        got = np.frombuffer(dev.fetch(held), np.uint8)
        dev.drop(held)
        bad = int(np.count_nonzero(got != data[0]))
        missed_rounds += bad > 0
        missed_bytes += bad
    return {"rounds": n, "rounds_with_missed_bytes": missed_rounds, "missed_bytes": missed_bytes}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    size = args.mib << 20
    with open_device("cuda") as dev:
        address = dev.map([(0, size)], relocate=True).delta

        def legacy(a: int, data: bytes) -> None:   # kpair's write() before this change
            dev.drv("cuStreamSynchronize", dev.stream)
            dev.drv("cuMemcpyHtoD", a, data, len(data))

        env = dev.environment()
        doc = {"benchmark": "htod_order",
               "device": {k: env.get(k) for k in ("device", "pci_bus_id", "driver")},
               "bytes": size,
               "legacy": rounds(dev, address, size, args.rounds, legacy),
               "replay_stream": rounds(dev, address, size, args.rounds, dev.write)}
    emit(doc, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
