"""Regenerable regions on a real GPU (issue 48): inputs a seeded generator, a fill and an
axpby made on the device are stored as those launches (tests/cuda/regen_ops.cu), regenerated
by kpair.regen on replay (captured and relocated placement) byte-exact, and a changed seed is
refused by name before the range launches. Run: python -m pytest -q tests/gpu/test_regen_gpu.py
"""

from __future__ import annotations

import json
import shutil
import time

import numpy as np
import pytest

from kpair.backends import open_device
from kpair.errors import SnapshotFormatError
from kpair.record import Recorder
from kpair.replay import Replay, reproduce
from kpair.snapshot import BlobRef, Snapshot, sha256
from kpair.snapshot.store import Compressors, store_blob

pytestmark = pytest.mark.gpu

ROWS, COLS = 2048, 4096          # 32 MiB per float32 input
N = ROWS * COLS
SEED = 1234


def _splitmix(seed: int, n: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + np.arange(n, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(40)).astype(np.float32) * np.float32(2.0 / 16777216.0) \
        - np.float32(1.0)


def test_regenerable_inputs_replay_byte_exact_on_a_gpu(kit, evidence):
    from kpair.snapshot import Launch

    cubin = kit.build("regen_ops")
    flat = Launch((N // 256, 1, 1), (256, 1, 1))
    rows = Launch((ROWS // 128, 1, 1), (128, 1, 1))
    a, b, c = (np.zeros((ROWS, COLS), np.float32) for _ in range(3))
    o1, o2 = np.zeros(ROWS, np.float32), np.zeros(ROWS, np.float32)
    out = kit.path("regen")
    t0 = time.perf_counter()
    with Recorder(out, backend="cuda", names={"a": a, "b": b, "c": c, "out1": o1, "out2": o2},
                  outputs=[o1, o2]) as r:
        r.call(cubin, "kp_fill_seeded", [a, np.int64(N), np.uint64(SEED), np.int64(0)], flat)
        r.call(cubin, "kp_fill", [b, np.int64(N), np.float32(0.5)], flat)
        r.call(cubin, "kp_axpby", [c, a, b, np.int64(N), np.float32(2.0)], flat)
        with r.range("forward"):
            r.call(cubin, "kp_rowdot", [a, b, o1, np.int32(ROWS), np.int32(COLS)], rows)
            r.call(cubin, "kp_rowdot", [c, a, o2, np.int32(ROWS), np.int32(COLS)], rows)
    record_s = time.perf_counter() - t0
    snap = Snapshot.open(out)
    regions = {x.name: x for x in snap.manifest.regions}
    assert [n for n, x in regions.items() if x.regenerable] == ["a", "b", "c"]
    assert snap.stored_bytes() <= snap.region_bytes() // 100
    assert np.array_equal(a.ravel(), _splitmix(SEED, N))          # the GPU made numpy's floats
    assert regions["a"].regen.sha256 == sha256(_splitmix(SEED, N).tobytes())

    t0 = time.perf_counter()
    with open_device("cuda") as dev:
        rep = reproduce(dev, Snapshot.open(out), 3)
    replay_s = time.perf_counter() - t0
    assert rep.status == "byte-exact", rep
    with open_device("cuda") as dev:
        replay = Replay(dev, Snapshot.open(out), relocate=True)
        assert replay.info.mapping.delta != 0
        assert replay.run(replay.load_range()) == replay.expected

    # A changed seed in the stored kernarg: refused by name before the range launches.
    bad = kit.path("regen-tampered")
    shutil.copytree(out, bad)
    obj = json.loads((bad / "snapshot.json").read_text())
    ref = obj["regions"][0]["regen"]["ops"][0]["kernarg"]["blob"]
    data = bytearray(Snapshot.open(bad).read_blob(BlobRef(**ref)))
    data[16:24] = (SEED + 1).to_bytes(8, "little")
    new = store_blob(bad / "blobs", bytes(data), Compressors(3))
    obj["regions"][0]["regen"]["ops"][0]["kernarg"]["blob"] = BlobRef(
        f"blobs/{new.path.name}", len(data), new.digest, new.compression).to_json()
    (bad / "snapshot.json").write_text(json.dumps(obj))
    with open_device("cuda") as dev, pytest.raises(SnapshotFormatError,
                                                   match=r"region 'a'.*operation 0 "
                                                         r"\(kp_fill_seeded\)"):
        Replay(dev, Snapshot.open(bad))
    evidence("regen_gpu", {"region_bytes": snap.region_bytes(),
                           "stored_bytes": snap.stored_bytes(),
                           "regenerable_bytes": snap.regenerable_bytes(),
                           "record_s": round(record_s, 3),
                           "reproduce_3_runs_s": round(replay_s, 3)})
