"""ABBA meter on synthetic timings: planted speedups, slot bias, drift, stopping, samples files."""

from __future__ import annotations

import json
import math
import zipfile

import numpy as np
import pytest

from kpair.errors import FormatError, KpairError, UsageError
from kpair.measure import (
    AbbaResult,
    MeasureState,
    Samples,
    StoppingRule,
    analyze,
    analyze_replicates,
    another_replicate,
    combine,
    combine_replicates,
    geomean,
    load_samples,
    measure,
    round_schedule,
    save_samples,
    t975,
)


class FakeGpu:
    """Synthetic ``time_one``: ref takes ``t_ref``, opt ``t_ref / speedup``.

    Calls alternate slot 1, slot 2 (warm-up comes in pairs too); a slot-1 launch is
    ``slot_bias`` times slower; ``drift`` is the relative slow-down reached after ``drift_calls``
    launches; noise is log-normal. ``clock`` is a fake clock advanced by ``tick_s`` per launch.
    """

    def __init__(self, speedup=1.0, slot_bias=1.0, sigma=0.01, drift=0.0, drift_calls=1,
                 t_ref=100e-6, tick_s=0.0, seed=1):
        self.speedup, self.slot_bias, self.sigma = speedup, slot_bias, sigma
        self.drift, self.drift_calls, self.t_ref, self.tick_s = drift, drift_calls, t_ref, tick_s
        self.rng = np.random.default_rng(seed)
        self.calls: list[str] = []
        self.now = 0.0

    def __call__(self, which: str) -> float:
        k = len(self.calls)
        self.calls.append(which)
        self.now += self.tick_s
        t = self.t_ref if which == "ref" else self.t_ref / self.speedup
        if k % 2 == 0:
            t *= self.slot_bias
        t *= 1 + self.drift * min(k / self.drift_calls, 1.0)
        return t * math.exp(self.rng.normal(0.0, self.sigma))

    def clock(self) -> float:
        return self.now


FIXED = StoppingRule(min_blocks=200, max_blocks=200, rel_ci_halfwidth=1e-9, time_cap_s=1e9)


def test_geomean():
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean(np.full(10_000, 1e300)) == pytest.approx(1e300)  # no overflowing product
    for bad in ([], [1.0, 0.0], [1.0, -2.0], [float("nan")], [float("inf")], ["x"]):
        with pytest.raises(KpairError):
            geomean(bad)


def test_planted_speedup_recovered():
    gpu = FakeGpu(speedup=1.37, sigma=0.01)
    res, samples = measure(gpu, rule=FIXED, seed=3)
    assert res.mode == "A/B"
    assert res.speedup == pytest.approx(1.37, rel=0.01)
    assert res.ci95[0] <= 1.37 <= res.ci95[1]
    assert res.slot_bias_ci95[0] <= 1.0 <= res.slot_bias_ci95[1]
    assert res.blocks == len(samples) == 200
    assert res.forward_blocks == res.reverse_blocks == 100
    assert res.ref_median_s == pytest.approx(100e-6, rel=0.01)
    assert res.opt_median_s == pytest.approx(100e-6 / 1.37, rel=0.01)
    assert res.stopped_by == "max_blocks" and res.seed == 3


def test_slot_bias_cancels_where_naive_ratio_does_not():
    gpu = FakeGpu(speedup=1.25, slot_bias=1.02, sigma=0.01)
    res, samples = measure(gpu, rule=FIXED, seed=4)
    assert res.speedup == pytest.approx(1.25, rel=0.01)
    assert res.slot_bias == pytest.approx(1.02, rel=0.01)
    assert res.slot_bias_ci95[0] > 1.0
    # The naive estimate, ref/opt over forward blocks only, carries the slot effect in full.
    fwd = samples.forward
    naive = geomean(samples.t_slot1_s[fwd] / samples.t_slot2_s[fwd])
    assert naive == pytest.approx(1.25 * 1.02, rel=0.005)
    assert abs(naive / 1.25 - 1) > 0.015


def test_linear_drift_cancels():
    # +5% over the whole run (200 blocks = 400 timed launches after 4 warm-up launches).
    gpu = FakeGpu(speedup=1.1, sigma=0.005, drift=0.05, drift_calls=404)
    res, samples = measure(gpu, rule=FIXED, seed=5)
    assert samples.t_ref_s[-20:].mean() / samples.t_ref_s[:20].mean() > 1.04  # drift is real
    assert res.speedup == pytest.approx(1.1, rel=0.01)
    assert res.ci95[0] <= 1.1 <= res.ci95[1]


def test_aa_control():
    gpu = FakeGpu(speedup=1.37, sigma=0.01)  # speedup must not matter: opt is never called
    res, samples = measure(gpu, rule=FIXED, seed=6, aa=True)
    assert set(gpu.calls) == {"ref"}
    assert res.mode == "A/A" and samples.mode == "A/A"
    assert res.ci95[0] <= 1.0 <= res.ci95[1]
    assert abs(res.speedup - 1) < 0.005
    assert res.to_json()["mode"] == "A/A"


def test_warmup_calls_are_untimed_pairs():
    gpu = FakeGpu()
    rule = StoppingRule(min_blocks=8, max_blocks=8)
    _, samples = measure(gpu, rule=rule, round_blocks=8, warmup=3, seed=1)
    assert gpu.calls[:6] == ["ref", "opt"] * 3
    assert len(gpu.calls) == 6 + 2 * 8
    for i, d in enumerate(samples.direction):  # slot order follows the direction
        assert gpu.calls[6 + 2 * i: 8 + 2 * i] == (["ref", "opt"] if d == "F" else ["opt", "ref"])


def test_stops_by_ci_soon_after_min_blocks():
    gpu = FakeGpu(speedup=1.3, sigma=1e-4)
    res, _ = measure(gpu, rule=StoppingRule(min_blocks=32), seed=7)
    assert res.stopped_by == "ci" and res.blocks == 32
    assert res.rel_ci_halfwidth <= 0.005
    assert res.rel_ci_halfwidth == pytest.approx((res.ci95[1] - res.ci95[0]) / 2 / res.speedup)


def test_stops_by_max_blocks():
    gpu = FakeGpu(speedup=1.3, sigma=0.3)
    res, _ = measure(gpu, rule=StoppingRule(min_blocks=16, max_blocks=48), seed=8)
    assert res.stopped_by == "max_blocks" and res.blocks == 48


def test_stops_by_time_cap_with_fake_clock():
    gpu = FakeGpu(sigma=0.3, tick_s=1.0)
    seen = []
    res, _ = measure(gpu, rule=StoppingRule(time_cap_s=5.0), clock=gpu.clock, seed=9,
                     progress=lambda n, r: seen.append((n, r)))
    # The cap is checked after the first whole round: 4 warm-up + 16 timed launches = 20 s.
    assert res.stopped_by == "time_cap" and res.blocks == 8
    assert [n for n, _ in seen] == [8] and seen[0][1].stopped_by == ""


def test_time_cap_waits_for_an_analysable_prefix():
    gpu = FakeGpu(sigma=0.3, tick_s=1.0)
    res, _ = measure(gpu, rule=StoppingRule(time_cap_s=1.0), round_blocks=2, warmup=0,
                     clock=gpu.clock, seed=9)
    assert res.stopped_by == "time_cap" and res.forward_blocks == res.reverse_blocks == 2


def test_rule_on_states():
    rule = StoppingRule(min_blocks=32, max_blocks=64, rel_ci_halfwidth=0.01, time_cap_s=10.0)
    res = analyze(Samples.from_blocks("FRFR", [1.0, 1.0, 1.0, 1.01], [1.0] * 4))
    wide = AbbaResult(**{**res.__dict__, "rel_ci_halfwidth": 0.5})
    tight = AbbaResult(**{**res.__dict__, "rel_ci_halfwidth": 0.001})
    assert rule.is_finished(MeasureState(100, 1e6, None)) is None
    assert rule.is_finished(MeasureState(16, 0.0, tight)) is None  # tight, but < min_blocks
    assert rule.is_finished(MeasureState(32, 0.0, tight)) == "ci"
    assert rule.is_finished(MeasureState(32, 0.0, wide)) is None
    assert rule.is_finished(MeasureState(64, 11.0, tight)) == "ci"
    assert rule.is_finished(MeasureState(64, 11.0, wide)) == "max_blocks"
    assert rule.is_finished(MeasureState(8, 10.0, wide)) == "time_cap"
    for bad in ({"min_blocks": 2}, {"min_blocks": 50, "max_blocks": 40},
                {"rel_ci_halfwidth": 0}, {"time_cap_s": -1}):
        with pytest.raises(UsageError):
            StoppingRule(**bad)


def test_progress_reports_every_round():
    seen = []
    measure(FakeGpu(sigma=0.3), rule=StoppingRule(min_blocks=8, max_blocks=24), round_blocks=4,
            seed=1,
            progress=lambda n, r: seen.append((n, r)))
    assert [n for n, _ in seen] == [4, 8, 12, 16, 20, 24]
    # The CI is re-examined at growing block counts (8, 12, 16, 20, 24 here: each +4 is more
    # than 15%); a round in between reports the latest analysis.
    assert seen[0][1] is None
    assert all(isinstance(r, AbbaResult) and r.blocks <= n for n, r in seen[1:])
    assert seen[-1][1].blocks == 24


def test_ci_is_examined_at_geometric_block_counts():
    looks = []
    measure(FakeGpu(sigma=0.3), rule=StoppingRule(min_blocks=32, max_blocks=400,
                                                  rel_ci_halfwidth=1e-9, time_cap_s=1e9),
            seed=1, progress=lambda n, r: looks.append(r.blocks) if r else None)
    checks = sorted(set(looks))
    assert checks[0] == 32 and checks[-1] >= 400
    # far fewer analyses than rounds, each at least 15% (or one round) past the previous;
    # the last one is the look that max_blocks forces.
    assert len(checks) < 400 // 8 // 2
    inner = checks[:-1]
    assert all(b >= max(a + 8, a * 1.15) for a, b in zip(inner, inner[1:], strict=False))


def test_schedule_balanced_random_reproducible():
    rng = np.random.default_rng(0)
    for _ in range(50):
        rnd = round_schedule(rng, 8)
        assert sorted(rnd) == ["F"] * 4 + ["R"] * 4
    _, a = measure(FakeGpu(), rule=StoppingRule(min_blocks=64, max_blocks=64), seed=11)
    _, b = measure(FakeGpu(), rule=StoppingRule(min_blocks=64, max_blocks=64), seed=11)
    _, c = measure(FakeGpu(), rule=StoppingRule(min_blocks=64, max_blocks=64), seed=12)
    assert np.array_equal(a.direction, b.direction)
    assert not np.array_equal(a.direction, c.direction)
    for k in range(0, 64, 8):  # every round is balanced
        assert (a.direction[k:k + 8] == "F").sum() == 4
    assert round_schedule(np.random.default_rng(1), 8) == round_schedule(
        np.random.default_rng(1), 8)


def test_seed_drawn_and_recorded_when_not_given():
    res, samples = measure(FakeGpu(), rule=StoppingRule(min_blocks=8, max_blocks=8))
    assert isinstance(res.seed, int) and res.seed == samples.seed
    assert analyze(samples) == res


def test_bad_arguments():
    with pytest.raises(UsageError):
        measure(FakeGpu(), round_blocks=7)
    with pytest.raises(UsageError):
        measure(FakeGpu(), seed=-1)
    s = Samples.from_blocks("FRFR", [1.0] * 4, [1.0] * 4)
    with pytest.raises(UsageError):
        analyze(s, n_boot=10)
    with pytest.raises(KpairError, match="2 forward"):
        analyze(Samples.from_blocks("FFFR", [1.0] * 4, [1.0] * 4))


@pytest.mark.parametrize("value", [0.0, -1e-6, float("nan"), float("inf"), None, "fast"])
def test_bad_timing_values(value):
    def time_one(which):
        time_one.n += 1
        return value if time_one.n == 5 else 1e-4

    time_one.n = 0
    with pytest.raises(KpairError, match=r"time_one returned .* block 1 \(slot 1\)"):
        measure(time_one, warmup=1, seed=0)


def test_json_shape():
    res, _ = measure(FakeGpu(speedup=1.2), rule=StoppingRule(min_blocks=16, max_blocks=16),
                     seed=2)
    j = res.to_json(samples_file="speed_samples.npz")
    assert json.loads(json.dumps(j, allow_nan=False)) == j
    assert j["ci95"] == list(res.ci95) and j["samples_file"] == "speed_samples.npz"
    assert j["debug_only"]["ref_median_us"] == pytest.approx(100.0, rel=0.05)
    assert "ref_median_s" not in j and "note" in j["debug_only"]
    assert {"speedup", "slot_bias", "slot_bias_ci95", "fwd", "rev", "blocks", "forward_blocks",
            "reverse_blocks", "stopped_by", "rel_ci_halfwidth", "seed", "n_boot"} <= set(j)


def test_samples_round_trip_reproduces_result(tmp_path):
    rule = StoppingRule(min_blocks=40, max_blocks=40, rel_ci_halfwidth=1e-9)
    res, samples = measure(FakeGpu(speedup=1.2, slot_bias=1.01), seed=13, rule=rule)
    p = save_samples(samples, tmp_path / "speed_samples.npz")
    assert p.exists() and not (tmp_path / "speed_samples.npz.npz").exists()
    back = load_samples(p)
    for name in ("block", "direction", "t_slot1_s", "t_slot2_s"):
        assert np.array_equal(getattr(back, name), getattr(samples, name))
    assert (back.mode, back.seed, back.stopped_by) == ("A/B", 13, "max_blocks")
    assert analyze(back) == res
    assert analyze(back, seed=99).speedup == res.speedup  # the point estimate needs no seed


class BusyCpu(FakeGpu):
    """FakeGpu whose launches are slowed by interference (preemption, a busy sibling thread)
    as on a loaded CPU: 20-80% added to a launch, ref's with probability ``share``, a shorter
    launch's in proportion to its time (a preemption falls in a longer one more often)."""

    def __init__(self, share, **kw):
        super().__init__(**kw)
        self.share, self.hits = share, np.random.default_rng(kw.get("seed", 1) + 100)

    def __call__(self, which: str) -> float:
        t = super().__call__(which)
        hit = self.hits.random() < self.share * (1 if which == "ref" else 1 / self.speedup)
        return t * (1 + self.hits.uniform(0.2, 0.8)) if hit else t


@pytest.mark.parametrize("location", ["mean", "low_quartile"])
def test_the_low_quartile_reads_through_interference_the_mean_follows(location):
    """Two runs of one pair, 5% and 35% of their launches slowed by interference: the lower
    quartiles agree within 2% and hold the undisturbed 1.5x (slot bias cancelling), the ABBA
    mean moves by more than the 2% (the host's case for ``TimingModel.location``)."""
    got = [measure(BusyCpu(share, speedup=1.5, slot_bias=1.03, seed=3), seed=5, rule=FIXED,
                   location=location)[0] for share in (0.05, 0.35)]
    moved = abs(math.log(got[0].speedup / got[1].speedup))
    if location == "mean":
        assert moved > 0.02
        return
    assert moved < 0.02
    for r in got:
        assert r.location == "low_quartile" and r.to_json()["location"] == "low_quartile"
        assert r.speedup == pytest.approx(1.5, rel=0.02)
        assert r.ci95[0] < r.speedup < r.ci95[1]
        assert r.slot_bias == pytest.approx(1.03, rel=0.05)   # still the ABBA mean's


def test_the_location_travels_with_the_samples_and_old_files_read_as_mean(tmp_path):
    res, samples = measure(BusyCpu(0.2, speedup=1.3), seed=2, rule=FIXED,
                           location="low_quartile")
    back = load_samples(save_samples(samples, tmp_path / "s.npz"))
    assert back.location == "low_quartile" and analyze(back) == res
    assert "location" not in analyze(replace_location(back, "mean")).to_json()
    old = _rewrite(tmp_path / "s.npz", tmp_path / "v2.npz", location=None,
                   kpair_samples_version=np.int64(2))
    assert load_samples(old).location == "mean"


def replace_location(samples, location):
    from dataclasses import replace
    return replace(samples, location=location)


def _rewrite(src, dst, **changes):
    with np.load(src) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays.update(changes)
    for k in [k for k, v in arrays.items() if v is None]:
        del arrays[k]
    with open(dst, "wb") as fh:
        np.savez(fh, **arrays)
    return dst


@pytest.fixture
def samples_file(tmp_path):
    _, samples = measure(FakeGpu(), seed=1, rule=StoppingRule(min_blocks=8, max_blocks=8))
    return save_samples(samples, tmp_path / "s.npz")


@pytest.mark.parametrize(("change", "field"), [
    ({"t_slot1_s": None}, "t_slot1_s"),
    ({"t_slot2_s": np.full(8, -1.0)}, "t_slot2_s[0]"),
    ({"t_slot1_s": np.full(7, 1e-4)}, "t_slot1_s"),
    ({"direction": np.array([b"F", b"X"] * 4)}, "direction[1]"),
    ({"block": np.arange(1, 9)}, "block[0]"),
    ({"block": np.arange(8.0)}, "block"),
    ({"mode": np.bytes_(b"B/A")}, "mode"),
    ({"stopped_by": np.bytes_(b"bored")}, "stopped_by"),
    ({"seed": np.float64(1.5)}, "seed"),
    ({"kpair_samples_version": np.int64(4)}, "kpair_samples_version"),
    ({"replicate": np.full(8, -1)}, "replicate"),
    ({"location": np.bytes_(b"mode")}, "location"),
    ({"location": None}, "location"),
])
def test_bad_samples_fields_are_named(samples_file, tmp_path, change, field):
    bad = _rewrite(samples_file, tmp_path / "bad.npz", **change)
    with pytest.raises(FormatError) as info:
        load_samples(bad)
    assert info.value.field == field and info.value.path == bad


def test_truncated_or_corrupted_samples_file(samples_file, tmp_path):
    data = samples_file.read_bytes()
    with zipfile.ZipFile(samples_file) as zf:  # a byte inside the compressed timings
        info = zf.getinfo("t_slot1_s.npy")
    at = info.header_offset + 30 + len(info.filename) + len(info.extra) + info.compress_size // 2
    cases = {"trunc.npz": data[: len(data) // 2], "empty.npz": b"",
             "garbage.npz": b"not a zip file at all" * 10,
             "flipped.npz": data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]}
    for name, blob in cases.items():
        (tmp_path / name).write_bytes(blob)
        with pytest.raises(FormatError, match="truncated or corrupted"):
            load_samples(tmp_path / name)
    with pytest.raises(FormatError, match="cannot read"):
        load_samples(tmp_path / "missing.npz")


# ---------------------------------------------------------------- replicates


def _replicates(speedups, sigma=0.01, blocks=32, seed=0):
    """One FakeGpu measurement per replicate, each at its own true speedup (a run-level
    offset: what a fresh placement of the code may shift)."""
    parts, samples = [], []
    for i, s in enumerate(speedups):
        res, smp = measure(FakeGpu(speedup=s, sigma=sigma, seed=seed + i),
                           rule=StoppingRule(min_blocks=blocks, max_blocks=blocks),
                           seed=seed + i)
        parts.append(res)
        samples.append(smp)
    return parts, samples


def test_between_run_variation_widens_the_rerun_interval():
    steady, _ = _replicates([1.20] * 4)
    shifty, _ = _replicates([1.17, 1.23, 1.19, 1.22])
    a, b = combine_replicates(steady), combine_replicates(shifty)
    def width(r):
        return math.log(r.ci95[1] / r.ci95[0])

    assert width(b) > 2 * width(a)
    for r in (a, b):   # the re-run interval holds the mean's CI, which holds the point
        assert r.ci95[0] < r.mean_ci95[0] < r.speedup < r.mean_ci95[1] < r.ci95[1]
    assert 1.17 < b.speedup < 1.23


def test_rerun_interval_covers_fresh_reruns():
    """Across many simulated publications, each followed by a re-run of the same design with
    fresh run-level offsets (sd 1%), the re-run's point lands inside the published re-run
    interval about 95% of the time (the t-based prediction interval is exact under this
    model; 200 trials keep the test fast and its bound loose)."""
    rng = np.random.default_rng(5)
    inside = 0
    trials = 200

    def draw(t):
        offsets = np.exp(rng.normal(0.0, 0.01, 4))
        return combine_replicates([
            AbbaResult("A/B", 1.1 * o, (1.1 * o / 1.002, 1.1 * o * 1.002), 1.0, (1.0, 1.0),
                       1.0, 1.0, 32, 16, 16, "ci", 0.002, t, 1e-4, 1e-4) for o in offsets])

    for t in range(trials):
        published, rerun = draw(t), draw(t)
        inside += published.ci95[0] <= rerun.speedup <= published.ci95[1]
    assert 0.88 <= inside / trials <= 1.0


def test_the_hosts_run_term_follows_its_wait_for_a_cpu_and_adds_in_quadrature():
    from kpair.measure import HOST_RUN_REL_IDLE, HOST_RUN_REL_LOADED, host_run_rel

    assert host_run_rel(0.0) == HOST_RUN_REL_IDLE == 0.01
    assert host_run_rel(0.15) == pytest.approx(0.02)
    assert host_run_rel(0.3) == host_run_rel(0.9) == HOST_RUN_REL_LOADED == 0.03
    assert host_run_rel(None) == HOST_RUN_REL_LOADED        # unknown: as loaded
    parts = _parts([1.10, 1.12, 1.09, 1.11, 1.105, 1.115])
    plain, rel = combine_replicates(parts), combine_replicates(parts, run_rel=0.03)
    assert rel.speedup == plain.speedup and rel.run_sd_log == 0.03
    s, r = plain.sd_log, len(parts)
    half = math.log(rel.ci95[1] / rel.speedup)
    assert half == pytest.approx(t975(r - 1) * math.sqrt(2 * (s * s / r + 0.03 ** 2)))
    both = combine_replicates(parts, run_offset_s=30e-9, run_rel=0.03)
    assert both.run_sd_log == pytest.approx(math.hypot(
        combine_replicates(parts, run_offset_s=30e-9).run_sd_log, 0.03))


def test_replicated_samples_round_trip_and_reanalyse(tmp_path):
    parts, samples = _replicates([1.1, 1.12, 1.09])
    joined = Samples.joined(samples)
    assert joined.replicates == 3 and len(joined) == sum(len(s) for s in samples)
    back = load_samples(save_samples(joined, tmp_path / "s.npz"))
    assert back.replicates == 3 and (back.replicate == joined.replicate).all()
    pooled, rep = analyze_replicates(back)
    assert pooled.blocks == len(joined)
    assert [p.speedup for p in rep.parts] == pytest.approx([p.speedup for p in parts])
    assert rep.speedup == pytest.approx(combine_replicates(parts).speedup)


def _parts(speedups, rel_se=0.002, t_ref_s=1e-4):
    return [AbbaResult("A/B", s, (s / (1 + 1.96 * rel_se), s * (1 + 1.96 * rel_se)), 1.0,
                       (1.0, 1.0), 1.0, 1.0, 32, 16, 16, "ci", rel_se, 0, t_ref_s, t_ref_s / s)
            for s in speedups]


def test_each_backend_declares_its_timing_model():
    """The measurement policy is the backend's TimingModel: GPUs read ABBA means with a 30 ns
    run offset and take extra replicates; the host reads lower quartiles and takes none."""
    from kpair.backends.base import Device
    from kpair.backends.cuda import CudaDevice
    from kpair.backends.hip import HipDevice
    from kpair.backends.host import HostDevice
    from kpair.measure import GPU_RUN_OFFSET_S, GPU_TIMING, HOST_TIMING, TimingModel

    gpu = TimingModel(extra_replicates=True, run_offset_s=GPU_RUN_OFFSET_S, location="mean")
    host = TimingModel(extra_replicates=False, run_offset_s=0.0, location="low_quartile")
    assert gpu == GPU_TIMING and host == HOST_TIMING
    # Unbound: the classes answer without a device (no driver needed here).
    assert CudaDevice.timing_model(None) == gpu and HipDevice.timing_model(None) == gpu
    assert HostDevice.timing_model(None) == host
    assert Device.timing_model(None) == TimingModel()
    with pytest.raises(ValueError, match="location"):
        TimingModel(location="median")


def test_extra_replicates_are_taken_while_they_are_cheap():
    kw = {"limit": 12, "per_replicate_s": 0.05, "extra_s": 0.0, "budget_s": 1.0}
    assert another_replicate(6, **kw)
    assert not another_replicate(12, **kw)                          # never past the limit
    assert not another_replicate(8, **{**kw, "extra_s": 0.96})      # nor past the budget
    assert not another_replicate(6, **{**kw, "per_replicate_s": 2.0})


@pytest.mark.parametrize("spread_decides", [False, True])
def test_extra_replicates_keep_the_rerun_interval_honest(spread_decides):
    """A kernel whose placement puts a replicate on one of two levels (-6% with probability
    0.4), published and re-run with 6 replicates, then up to 12. Taken for their low cost
    (kpair's rule), the re-run's point lands inside the published interval about 95% of the
    time and the interval narrows. Taken only while the interval looks wider than 1% (the
    rule kpair does not use), runs stop where their replicates happened to agree: narrow
    intervals that re-runs miss more often."""
    rng = np.random.default_rng(11)

    def run():
        parts = []
        while len(parts) < 6 or another_replicate(len(parts), limit=12, per_replicate_s=0.0,
                                                  extra_s=0.0):
            if spread_decides and len(parts) >= 6:
                r = combine_replicates(parts)
                if (r.ci95[1] - r.ci95[0]) / 2 / r.speedup <= 0.01:
                    break
            level = 0.94 if rng.random() < 0.4 else 1.0
            parts.append(_parts([1.15 * level * math.exp(rng.normal(0, 0.003))])[0])
        return combine_replicates(parts)

    def half(r):
        return (r.ci95[1] - r.ci95[0]) / 2 / r.speedup

    trials, inside, widths = 1000, 0, []
    for _ in range(trials):
        published, rerun = run(), run()
        inside += published.ci95[0] <= rerun.speedup <= published.ci95[1]
        widths.append(half(published))
    if spread_decides:
        assert inside / trials < 0.93
    else:
        assert inside / trials >= 0.93
        six = [half(combine_replicates(_parts([1.15 * (0.94 if rng.random() < 0.4 else 1.0)
                                               for _ in range(6)]))) for _ in range(300)]
        assert np.median(widths) < 0.7 * np.median(six)


def test_the_run_offset_widens_short_kernels_and_spares_long_ones():
    """u = delta * sqrt(1/t_ref^2 + 1/t_opt^2) joins s^2/R: 30 ns is most of a 4 us kernel's
    interval and nothing of a 300 us one's; no offset leaves the interval as it was."""
    speedups = [1.14, 1.15, 1.145, 1.143, 1.147, 1.141]

    def half(r):
        return math.log(r.ci95[1] / r.ci95[0]) / 2

    for t_ref, widens in ((4e-6, True), (300e-6, False)):
        plain = combine_replicates(_parts(speedups, t_ref_s=t_ref))
        offset = combine_replicates(_parts(speedups, t_ref_s=t_ref), run_offset_s=30e-9)
        assert plain.run_sd_log == 0.0 and plain.ci95 == combine_replicates(
            _parts(speedups, t_ref_s=t_ref), run_offset_s=0.0).ci95
        u = 30e-9 * math.sqrt(1 / t_ref ** 2 + (plain.speedup / t_ref) ** 2)
        assert offset.run_sd_log == pytest.approx(u, rel=1e-2)
        expected = 2.571 * math.sqrt(2 * (plain.sd_log ** 2 / 6 + u ** 2))   # t(5)
        assert half(offset) == pytest.approx(expected, rel=1e-3)
        assert offset.speedup == plain.speedup
        assert offset.mean_ci95[0] < offset.speedup < offset.mean_ci95[1]
        if widens:
            assert half(offset) > 3 * half(plain)
        else:
            assert half(offset) < 1.01 * half(plain)


def test_rerun_offsets_a_run_shares_are_covered_only_with_the_run_term():
    """A 4 us kernel whose every run draws one timing offset (sd 30 ns per kernel) that all
    its replicates share: re-runs land inside the published interval about 95% of the time
    with the run term, and far less often without it (its replicates cannot see the offset)."""
    rng = np.random.default_rng(17)
    t_ref, true = 4e-6, 1.15

    def run(offset_s):
        t_r = t_ref + rng.normal(0, 30e-9)
        t_o = t_ref / true + rng.normal(0, 30e-9)
        speeds = [t_r / t_o * math.exp(rng.normal(0, 0.004)) for _ in range(12)]
        return combine_replicates(_parts(speeds, t_ref_s=t_ref), run_offset_s=offset_s)

    rates = {}
    for offset_s in (0.0, 30e-9):
        trials, inside = 400, 0
        for _ in range(trials):
            published, rerun = run(offset_s), run(offset_s)
            inside += published.ci95[0] <= rerun.speedup <= published.ci95[1]
        rates[offset_s] = inside / trials
    assert rates[30e-9] >= 0.9
    assert rates[0.0] < 0.8


def test_the_control_bound_joins_in_quadrature():
    lo, hi, bound = combine((1.10, 1.12), (0.995, 1.004))
    w, b = math.log(1.12 / 1.10) / 2, math.log(1 / 0.995)
    c = math.log(1.10 * 1.12) / 2
    assert bound == pytest.approx(1 / 0.995)
    assert (lo, hi) == pytest.approx((math.exp(c - math.hypot(w, b)),
                                      math.exp(c + math.hypot(w, b))))
    assert combine((1.10, 1.12), (1.0, 1.0)) == pytest.approx((1.10, 1.12, 1.0))


def test_a_single_replicate_is_not_a_rerun_interval():
    parts, _ = _replicates([1.1])
    with pytest.raises(KpairError, match="at least 2 replicates"):
        combine_replicates(parts)


def test_rule_split_shares_blocks_and_time():
    rule = StoppingRule(min_blocks=32, max_blocks=2000, rel_ci_halfwidth=0.005, time_cap_s=30)
    part = rule.split(4)
    assert (part.min_blocks, part.max_blocks, part.time_cap_s) == (8, 500, 7.5)
    assert part.rel_ci_halfwidth == pytest.approx(0.01)
    assert rule.split(1) is rule
