"""Timing and isolation on a real GPU: A/A control, a known pair, faults and hangs."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

PRECISE = {"min_blocks": 64, "max_blocks": 3000, "rel_ci": 0.001, "time_cap_s": 12.0}


def _speed(s: dict) -> dict:
    return {k: s[k] for k in ("speedup", "ci95", "slot_bias", "slot_bias_ci95", "blocks",
                              "stopped_by", "rel_ci_halfwidth")} | {
        "ref_median_us": s["debug_only"]["ref_median_us"]}


@pytest.mark.parametrize("case,size", [("elementwise", {"n": 8 << 20}),
                                       ("gemm_tiled", {"n": 1024})])
def test_aa_control_is_flat(kit, evidence, case, size):
    result = kit.run(kit.pair(kit.case(case, **size)), aa=True, seed=7, **PRECISE)
    assert result["status"] == "pass", result.get("error")
    ab, aa = result["speed"], result["speed"]["aa_control"]
    evidence(f"aa[{case}]", {"ab_same_binary": _speed(ab), "aa_control": _speed(aa),
                             "clocks": result["environment"].get("clocks_mhz")})
    assert ab["debug_only"]["ref_median_us"] >= 20, "the A/A bar is for kernels >= 20 us"
    for s in (ab, aa):
        assert abs(s["speedup"] - 1) <= 0.005, s
        assert 0.99 <= s["slot_bias"] <= 1.01, s


def test_tiled_gemm_beats_naive_with_a_ci_above_one(kit, evidence):
    snap = kit.case("gemm_naive", n=1024)
    gemm = kit.build("gemm")
    result = kit.run(kit.pair(snap, opt=gemm, opt_kernel="gemm_tiled"), seed=3, **PRECISE)
    assert result["status"] == "pass", result.get("error")
    s = result["speed"]
    evidence("naive_vs_tiled", _speed(s) | {"opt_median_us": s["debug_only"]["opt_median_us"],
                                            "correctness": result["correctness"]["mode"]})
    assert s["speedup"] > 1 and s["ci95"][0] > 1, s


def test_a_faulting_opt_is_an_error_and_the_batch_goes_on(kit, evidence):
    snap = kit.case("gemm_tiled", n=256)
    gemm = kit.build("gemm")
    batch = [kit.pair(snap, opt=gemm, opt_kernel="gemm_fault"), kit.pair(snap, opt=gemm)]
    results = [kit.run(h, timeout_s=120, **kit.quick) for h in batch]
    bad, good = results
    assert bad["status"] == "error" and bad["error"]["stage"] == "opt", bad["error"]
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in bad["error"]["message"]
    assert good["status"] == "pass", good.get("error")
    evidence("fault", {"error": bad["error"], "next": good["status"]})


def test_a_hanging_opt_is_killed_and_the_batch_goes_on(kit, evidence):
    snap = kit.case("gemm_tiled", n=256)
    gemm = kit.build("gemm")
    hung = kit.run(kit.pair(snap, opt=gemm, opt_kernel="gemm_hang"), timeout_s=15, **kit.quick)
    assert hung["status"] == "error" and hung["error"]["type"] == "Timeout", hung["error"]
    good = kit.run(kit.pair(snap, opt=gemm), timeout_s=120, **kit.quick)
    assert good["status"] == "pass", good.get("error")
    evidence("hang", {"error": hung["error"], "wall_s": hung["wall_s"],
                      "next": good["status"]})
