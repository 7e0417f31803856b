"""Placement on a real GPU: captured addresses in fresh processes, and forced relocation."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from kpair.backends import open_device
from kpair.backends._cuda_driver import GIB
from kpair.record import record_call
from kpair.snapshot import Launch

pytestmark = pytest.mark.gpu

REPLAY_ONCE = """
import json, sys
from kpair.backends import open_device
from kpair.replay import Replay
from kpair.snapshot import Snapshot
snap = Snapshot.open(sys.argv[1])
with open_device("cuda") as dev:
    replay = Replay(dev, snap)
    kernel = dev.load(snap.code_object(), snap.manifest.code.kernel_name,
                      fmt=snap.manifest.code.format)
    got = replay.run(kernel)
    exact = all(got[name] == want for name, want in replay.expected.items())
    lowest = min(r.address for r in snap.manifest.regions)
    print(json.dumps({"mode": replay.info.mapping.mode, "delta": replay.info.mapping.delta,
                      "exact": exact, "lowest": hex(lowest)}))
"""


def test_snapshots_from_one_process_replay_at_captured_addresses_in_others(kit, evidence):
    trials = 20
    cubin = kit.build("elementwise")
    snaps = []
    # Recorded in this process; a ballast reservation grows between recordings so the
    # snapshots sit at different addresses (not all at the first address the driver hands out).
    with open_device("cuda") as ballast:
        for i in range(trials):
            n = 1 << (14 + i % 6)
            rng = np.random.default_rng(i)
            x, y = rng.standard_normal(n, np.float32), rng.standard_normal(n, np.float32)
            out = kit.path(f"placement{i}")
            record_call(cubin, "axpy", [x, y, np.float32(0.5), np.int32(n)], out,
                        backend="cuda", launch=Launch((n // 256, 1, 1), (256, 1, 1)))
            snaps.append(out)
            ballast.map([(0, 4096)], relocate=True)

    def replay(path):
        proc = subprocess.run([sys.executable, "-c", REPLAY_ONCE, str(path)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1])

    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(replay, snaps))
    captured = sum(o["mode"] == "captured" for o in outcomes)
    evidence("placement", {"trials": trials, "captured": captured,
                           "exact": sum(o["exact"] for o in outcomes),
                           "addresses": sorted({o["lowest"] for o in outcomes}),
                           "deltas": [o["delta"] for o in outcomes]})
    assert all(o["exact"] for o in outcomes), outcomes
    assert captured >= 19, outcomes


def test_forced_relocation_of_a_pointer_array_kernel_is_byte_exact(kit, evidence):
    snap = kit.pointer_table(nsrc=4)
    captured = kit.run(kit.pair(snap), **kit.quick)
    assert captured["status"] == "pass", captured.get("error")
    moved = kit.run(kit.pair(snap), relocate=True, **kit.quick)
    assert moved["status"] == "pass", moved.get("error")
    r = moved["replay"]
    assert r["mode"] == "relocated" and r["delta"] != 0 and r["delta"] % GIB == 0
    assert r["patched_kernarg_words"] == 2 and r["patched_region_words"] == 4
    evidence("relocation[pointer-array]", {k: r[k] for k in (
        "mode", "delta_hex", "patched_kernarg_words", "patched_region_words")})


@pytest.mark.parametrize("case", ["elementwise", "gemm_tiled"])
def test_forced_relocation_is_byte_exact(kit, evidence, case):
    result = kit.run(kit.pair(kit.case(case)), relocate=True, **kit.quick)
    assert result["status"] == "pass", result.get("error")
    r = result["replay"]
    assert r["mode"] == "relocated" and r["delta"] % GIB == 0 and r["delta"]
    evidence(f"relocation[{case}]", {k: r[k] for k in (
        "mode", "delta_hex", "patched_kernarg_words", "patched_region_words")})
