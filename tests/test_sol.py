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


# --------------------------------------------------------------------------- in the report


def _sol(ref_fraction, opt_fraction=None, bound="memory"):
    return speed_of_light(traffic([("x", bytes(4000), bytes(4000)),
                                   ("y", bytes(4000), b"\x01" * 4000)]),
                          Peaks(device="d", backend="host", copy_bytes_per_s=8e9,
                                copy_method="m", measured="now"),
                          ref_s=1e-6 / ref_fraction,
                          opt_s=1e-6 / opt_fraction if opt_fraction else None
                          ).replace(bound=bound)


def test_the_release_report_has_a_sol_column(tmp_path):
    from fake_release import fake_row
    from kpair import release
    from kpair.report import render_html, render_markdown

    rows = [fake_row(1, "copyish", 1.2).replace(sol=_sol(0.40, 0.48)),
            fake_row(1, "gemmish", 1.1).replace(sol=_sol(0.30, None, bound="compute")),
            fake_row(1, "unknown", 1.05)]
    release.build_index(rows, []).write(tmp_path / "index.json")
    index = release.load_index(tmp_path)
    md = render_markdown(index)
    assert "| slot_bias | SOL | Director" in md
    lines = {line.split(" | ")[1]: line for line in md.splitlines()
             if line.startswith("| 1 | ")}
    assert "| 48% of copy bandwidth (ref 40%) |" in lines["copyish"]
    assert "| ref 30% of GEMM rate |" in lines["gemmish"]
    assert "| 1.0000 | — |" in lines["unknown"]  # slot_bias, then no SOL
    page = render_html(index) if _has_matplotlib() else ""
    if page:
        assert "<th>SOL</th>" in page and "48% of copy bandwidth (ref 40%)" in page


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


# --------------------------------------------------------------------------- in kpair optimize


def test_headroom_words_and_ranking():
    from kpair.optimize.program import (
        NEAR_LIMIT,
        Operator,
        OperatorOutcome,
        headroom_ranking,
        headroom_text,
    )

    assert headroom_text(None) is None and headroom_text(_sol(0.5).replace(
        ref_fraction=None)) is None
    near = headroom_text(_sol(0.91, 0.95))
    assert near == "ref at SOL 91% of copy bandwidth, opt 95%: already near its limit, " \
        "little headroom"
    assert "headroom 4.0x" in headroom_text(_sol(0.25)) and NEAR_LIMIT == 0.85
    outcomes = [OperatorOutcome(Operator(1, "near"), "refused", "x", _sol(0.9)),
                OperatorOutcome(Operator(1, "unknown"), "refused", "x"),
                OperatorOutcome(Operator(1, "far"), "published", "x", _sol(0.1, 0.2)),
                OperatorOutcome(Operator(2, "mid"), "published", "x", _sol(0.5)),
                OperatorOutcome(Operator(1, "done"), "skipped", "x")]
    lines = headroom_ranking(outcomes)
    assert [line.split(":")[0].strip() for line in lines[1:4]] == \
        ["level1/far", "level2/mid", "level1/near"]
    assert lines[-1] == "  not known: level1/unknown"
    assert headroom_ranking(outcomes[1:2]) == []


def test_optimize_says_how_near_each_operator_is_to_its_limit(tmp_path, capsys):
    from conftest import CSRC
    from kpair.cli import main as kpair
    from kpair.optimize.strategy import KernelSource
    from kpair.record import record_call
    from kpair.release import load_index
    from kpair.toolchain import compile_shared

    source = CSRC / "matmul_variants.c"
    ref = compile_shared(source, tmp_path / "ref.so")
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 64), np.float32), rng.standard_normal((64, 64), np.float32)
    record_call(ref, "kp_matmul", [a, b, np.zeros((64, 64), np.float32), np.int32(64)],
                tmp_path / "1_matmul", names=["a", "b", "c", "n"],
                provenance=KernelSource.given(source, "kp_matmul").provenance())
    assert kpair(["optimize", "-o", str(tmp_path / "rel"), "--work", str(tmp_path / "w"),
                  "--snapshot", str(tmp_path / "1_matmul"), "--strategy", "host-c",
                  "--flags=-O2", "--keep", "1", "--variant", "KP_VARIANT=1",
                  "--timeout", "60", "--prune-max-blocks", "8", "--prune-time-cap", "0.5",
                  "--time-cap", "1", "--min-blocks", "4", "--max-blocks", "16",
                  "--seed", "3"]) == 0
    err = capsys.readouterr().err
    line = [x for x in err.splitlines() if x.startswith("[1/1] level1/1_matmul: ")][-1]
    (row,) = load_index(tmp_path / "rel").operators + load_index(tmp_path / "rel").refused
    assert row.sol is not None and row.sol.ref_fraction
    assert f"ref at SOL {row.sol.ref_fraction:.0%} of copy bandwidth" in line, line
    assert "headroom (speed of light known), most first:" in err
    assert "  level1/1_matmul: ref at SOL" in err
