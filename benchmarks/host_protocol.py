"""The fixed cost of a host launch: an empty kernel's timed cost against ref's.

A host launch is timed as its executor's CPU time from the judge's SIGCONT to the
executor's stop. Whatever the executor does besides the call (the launch protocol) is in
every sample, ref's and opt's alike; the smaller it is against ref's own work, the less a
candidate could gain by doing that path differently. This times, on one HostDevice, ``--n``
launches each (interleaved) of ref (the naive kp_matmul of tests/csrc/matmul.c, n=``--size``)
and of an empty kernel with the same signature, and prints one JSON document: the median
timed cost of each (µs), their ratio (empty / ref), and the executor source's sha256.

    python benchmarks/host_protocol.py [--size 24] [--n 2000] [--label after]
        [--write benchmarks/results/host_protocol.json]

``--write`` adds the run under ``--label`` to that JSON file (keeping other labels): the
committed file holds the figure of the executor before the protocol change ("before", the
executor that wrote a reply on a pipe and read the next command, then was SIGSTOPped by the
judge) and after it ("after": the executor only stops itself between calls), back to back
on the same machine. "before" runs this script against the package as it was:

    git archive a61bae5 src/kpair | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old/src python benchmarks/host_protocol.py --label before --write ...
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import statistics
import tempfile
from importlib import resources
from pathlib import Path

import numpy as np

from kpair.backends.host import HostDevice
from kpair.record import record_call
from kpair.replay import Replay
from kpair.snapshot import Snapshot
from kpair.toolchain import compile_shared

CSRC = Path(__file__).resolve().parents[1] / "tests" / "csrc"
NOTE = ("before: the executor read a command from a pipe, called, wrote a reply and was "
        "SIGSTOPped by the judge, all inside the timed interval (a kernel could do that path "
        "itself, cheaper); after: it only stops itself and acts on a read-only call page, so "
        "what is left of an empty kernel's cost is the OS's SIGCONT wake and group stop, the "
        "same for every kernel and nothing a kernel can replace. Measured back to back on "
        "one busy 2-CPU VM; the ratio, not the absolute microseconds, is the figure.")
EMPTY = "#include <stdint.h>\nvoid kp_matmul(const float *a, const float *b, float *c, " \
        "int32_t n) { (void)a; (void)b; (void)c; (void)n; }\n"


def measure(size: int, n: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        naive = compile_shared(CSRC / "matmul.c", d / "naive.so", defines={"KP_VARIANT": 0})
        (d / "empty.c").write_text(EMPTY)
        empty = compile_shared(d / "empty.c", d / "empty.so")
        rng = np.random.default_rng(0)
        a, b = (rng.standard_normal((size, size), dtype=np.float32) for _ in range(2))
        c = np.zeros((size, size), np.float32)
        snap = record_call(naive, "kp_matmul", [a, b, c, np.int32(size)], d / "s",
                           names=["a", "b", "c", "n"])
        dev = HostDevice()
        try:
            replay = Replay(dev, Snapshot.open(snap.root))
            ref = dev.load(naive.read_bytes(), "kp_matmul", fmt="elf-so")
            nothing = dev.load(empty.read_bytes(), "kp_matmul", fmt="elf-so")
            times: dict[str, list[float]] = {"ref": [], "empty": []}
            for _ in range(50):   # warm up both executors
                replay.time_one(ref)
                replay.time_one(nothing)
            for _ in range(n):
                times["ref"].append(replay.time_one(ref))
                times["empty"].append(replay.time_one(nothing))
        finally:
            dev.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    q1 = {k: float(np.percentile(v, 25)) for k, v in times.items()}
    source = resources.files("kpair.backends").joinpath("host_executor.c").read_bytes()
    return {"ref_us": round(med["ref"] * 1e6, 2), "empty_us": round(med["empty"] * 1e6, 2),
            "ref_q1_us": round(q1["ref"] * 1e6, 2), "empty_q1_us": round(q1["empty"] * 1e6, 2),
            "empty_over_ref": round(med["empty"] / med["ref"], 4),
            "empty_over_ref_q1": round(q1["empty"] / q1["ref"], 4),
            "size": size, "launches": n,
            "executor_sha256": hashlib.sha256(source).hexdigest()[:16],
            "machine": platform.machine(), "cpus": __import__("os").cpu_count()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=24)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--label", default="current")
    ap.add_argument("--write", type=Path)
    args = ap.parse_args()
    result = measure(args.size, args.n)
    if args.write:
        doc = json.loads(args.write.read_text()) if args.write.exists() else {}
        doc.setdefault("what", "median executor CPU time of one timed host launch (µs): "
                       "ref = naive kp_matmul, empty = a kernel that returns at once; "
                       "empty_over_ref = the share of a ref launch that is fixed cost")
        doc.setdefault("command", "python benchmarks/host_protocol.py --label LABEL "
                       "--write benchmarks/results/host_protocol.json")
        doc.setdefault("note", NOTE)
        doc[args.label] = result
        if "before" in doc and "after" in doc:
            doc["ratio_after_over_before"] = {
                "empty_us": round(doc["after"]["empty_us"] / doc["before"]["empty_us"], 4),
                "ref_us": round(doc["after"]["ref_us"] / doc["before"]["ref_us"], 4),
                "empty_over_ref": round(doc["after"]["empty_over_ref"]
                                        / doc["before"]["empty_over_ref"], 4)}
        args.write.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({args.label: result}))


if __name__ == "__main__":
    main()
