"""Speed of light: the bytes a correct kernel must move, read off pre/post state; the floor
against measured, cached peaks; and the figure in a real host run's result.json."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import record_matmul
from kpair.harness import create_harness
from kpair.pipeline import RunOptions
from kpair.result import Result
from kpair.snapshot import Snapshot
from kpair.sol import (
    Peaks,
    cached_peaks,
    device_key,
    host_copy_bandwidth,
    measure_peaks,
    peaks_cache,
    peaks_for,
    snapshot_traffic,
    speed_of_light,
    store_peaks,
    traffic,
)

ROOT = Path(__file__).resolve().parent.parent
QUICK = RunOptions(time_cap_s=0.5, min_blocks=4, max_blocks=16, timeout_s=120, seed=5,
                   device_options={"flush_bytes": 1 << 20})


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KPAIR_CACHE_DIR", str(tmp_path / "cache"))


def test_traffic_counts_inputs_whole_and_only_changed_output_bytes():
    x = bytes(range(256)) * 4                      # an input: unchanged
    out_pre = bytes(1024)
    out_post = bytes(512) + b"\x01" * 500 + bytes(12)  # 125 words changed
    t = traffic([("x", x, x), ("out", out_pre, out_post)])
    assert (t.read_bytes, t.written_bytes, t.total) == (1024, 500, 1524)
    assert [(r.name, r.role, r.bytes) for r in t.regions] == [("x", "read", 1024),
                                                              ("out", "written", 500)]
    # A word that changed in one byte only moves whole; odd sizes count bytes.
    t = traffic([("w", bytes(8), b"\x00\x00\x00\x07" + bytes(4)), ("o", b"abc", b"abd")])
    assert [r.bytes for r in t.regions] == [4, 1]
    with pytest.raises(ValueError, match="differ in size"):
        traffic([("bad", b"ab", b"abc")])


def test_floor_and_fractions_by_hand():
    # A copy of 1 MiB: 1 MiB read + 1 MiB written at 2 TB/s (read + written) = 1.048576 us.
    n = 1 << 20
    t = traffic([("src", b"\x02" * n, b"\x02" * n), ("dst", bytes(n), b"\x02" * n)])
    peaks = Peaks(device="d", backend="cuda", copy_bytes_per_s=2e12, copy_method="m",
                  measured="now")
    sol = speed_of_light(t, peaks, ref_s=2 * n / 2e12 / 0.48, opt_s=2 * n / 2e12 / 0.8)
    assert sol.floor_s == pytest.approx(2 * n / 2e12)
    assert sol.bound == "memory"
    assert sol.ref_fraction == pytest.approx(0.48) and sol.opt_fraction == pytest.approx(0.8)
    assert sol.headroom == pytest.approx(1 / 0.48)
    assert "ref at SOL 48% of memory bandwidth" in sol.summary()
    assert "opt at SOL 80%" in sol.summary()
    # With FLOPs that take longer than the bytes, the compute floor rules.
    peaks = peaks.replace(flops_per_s=1e12)
    sol = speed_of_light(t, peaks, flops=1e9, ref_s=2e-3)
    assert sol.bound == "compute" and sol.floor_s == pytest.approx(1e-3)
    assert sol.ref_fraction == pytest.approx(0.5) and "peak FLOP rate" in sol.summary()
    # Unmeasured: no fraction, and the summary says so.
    assert "not measured" in speed_of_light(t, peaks).summary()


def test_peaks_are_measured_once_and_cached(tmp_path):
    calls = []

    class Fake:
        backend = "hip"

        def environment(self):
            return {"backend": "hip", "device": "MI308X", "pci_bus_id": "0000:01:00.0"}

        def measure_bandwidth(self, nbytes):
            calls.append(nbytes)
            return 3e12

    first = peaks_for(Fake())
    assert first.copy_bytes_per_s == 3e12 and "memset" in first.copy_method
    again = peaks_for(Fake())
    assert again == first and len(calls) == 1
    assert peaks_cache().is_file()
    key = device_key(Fake().environment())
    assert key == "hip|MI308X|0000:01:00.0" and cached_peaks(key) == first
    store_peaks("other", first.replace(device="x"))
    assert cached_peaks(key) == first and cached_peaks("other").device == "x"
    peaks_cache().write_text("{not json")   # a broken cache is measured again, not an error
    assert cached_peaks(key) is None
    assert peaks_for(Fake()).copy_bytes_per_s == 3e12 and len(calls) == 2


def test_host_copy_bandwidth_is_plausible():
    bw = host_copy_bandwidth(8 << 20, repeats=3)
    assert 1e8 < bw < 1e13   # between 100 MB/s and 10 TB/s on any machine

    class Host:
        def environment(self):
            return {"backend": "host", "device": "cpu", "cpus": 2}

    peaks = measure_peaks(Host())
    assert peaks.backend == "host" and "memcpy" in peaks.copy_method


def test_snapshot_traffic_of_a_matmul(tmp_path, matmul_libs):
    snap = Snapshot.open(record_matmul(matmul_libs["naive"], tmp_path / "s", n=32))
    t = snapshot_traffic(snap)
    roles = {r.name: (r.role, r.bytes) for r in t.regions}
    # a and b are read whole; c (NaN before) is written entirely.
    assert roles["a"] == ("read", 32 * 32 * 4) and roles["b"] == ("read", 32 * 32 * 4)
    assert roles["c"] == ("written", 32 * 32 * 4)


def test_a_passing_run_carries_sol_into_result_json(tmp_path, matmul_libs):
    from kpair.isolation import run_isolated

    snap = record_matmul(matmul_libs["naive"], tmp_path / "s", n=48)
    h = create_harness(snap, tmp_path / "h", opt=matmul_libs["fast"])
    result = run_isolated(h.root, QUICK)
    assert result.status == "pass", result.summary()
    sol = result.sol
    assert sol is not None and sol.must_move_bytes == 3 * 48 * 48 * 4
    assert sol.ref_s and sol.opt_s and sol.ref_fraction > 0 and sol.opt_fraction > 0
    assert sol.floor_s == pytest.approx(sol.must_move_bytes / sol.peak_bytes_per_s)
    # Written, read back through the strict reader, and the schema knows the field.
    result.write(tmp_path / "result.json")
    again = Result.read(tmp_path / "result.json")
    assert again.sol == sol
    schema = json.loads((ROOT / "docs/schemas/result.schema.json").read_text())
    assert "sol" in schema["$defs"]["Result"]["properties"]
    assert np.isfinite(sol.peak_bytes_per_s)
