"""The adversarial suite on a real GPU (CUDA twin of tests/test_trust.py): cheating opt kernels
of tests/cuda/adversarial.cu, paired with a recorded GEMM dispatch whose output buffer already
holds the answer, each rejected with the right reason; honest opts accepted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kpair.policy import Mutation, Policy, Tolerance
from kpair.result import Result
from kpair.snapshot import Launch, Snapshot
from kpair.toolchain import compile_cuda
from kpair.trust import CHECKS

pytestmark = pytest.mark.gpu

CUDA_SRC = Path(__file__).parents[1] / "cuda"
N = 64
MUTATIONS = (Mutation("A", "float32", "permute", 2), Mutation("B", "float32", "resample", 2))
COSINE = (Tolerance("C", 0, N * N * 4, "float32", "cosine", min_cosine=0.9999),)
POLICIES = {"exact": Policy(mutations=MUTATIONS), "default": Policy(),
            "cosine": Policy(COSINE, mutations=MUTATIONS),
            # mutations naming A only: B, read-only too, gets kpair's derived mutation as well
            "cosine_a": Policy(COSINE, mutations=MUTATIONS[:1])}


@pytest.fixture(scope="module")
def cuda_suite(kit):
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((N, N), np.float32) for _ in range(2))
    c = np.zeros((N, N), np.float32)
    args = [a, b, c, np.int32(N), np.int32(N), np.int32(N)]
    launch, names = Launch((N // 16, N // 16, 1), (16, 16, 1)), ["A", "B", "C", "M", "N", "K"]
    kit.record("gemm", "gemm_tiled", args, launch, names)      # c now holds A @ B
    snap = kit.record("gemm", "gemm_tiled", args, launch, names)
    s = Snapshot.open(snap)
    assert s.pre(2) == s.post(2)
    header = kit.root / "kp_answer.h"
    header.write_text("__device__ const unsigned kp_answer[] = {" + ",".join(
        map(str, np.frombuffer(s.post(2), "<u4"))) + "};\n")
    hardcode = compile_cuda(CUDA_SRC / "adversarial.cu", kit.root / "bin" / "adv-hard.cubin",
                            arch=kit.arch, defines={"KP_ANSWER": f'"{header}"'})

    def run(kernel: str, policy: str = "exact", source: str = "adversarial",
            binary: Path | None = None) -> dict:
        binary = binary or (hardcode if kernel == "cheat_hardcode" else kit.build(source))
        harness = kit.pair(snap, opt=binary, opt_kernel=kernel, policy=POLICIES[policy])
        return kit.run(harness, timeout_s=300, **kit.quick)
    return run


REJECTED = [
    ("cheat_nowrite", "exact", "poisoned_outputs", "still hold the poison"),
    ("cheat_const", "exact", None, "region C: "),
    ("cheat_stale", "exact", "differential", "wrong on a mutated input"),
    ("cheat_oob", "exact", "guard_bands", "past the end of region C (offsets +16384..+16387"),
    ("cheat_input", "exact", "input_integrity", "modified input region A"),
    ("cheat_hardcode", "exact", "differential", "wrong on a mutated input"),
    ("cheat_stale", "default", "differential", "wrong on a mutated input"),
    ("cheat_hardcode", "default", "differential", "wrong on a mutated input"),
    ("cheat_nondet", "exact", "opt_determinism", "nondeterministic"),
    ("cheat_lowprec", "exact", None, "region C: "),
    ("cheat_lowprec", "cosine", "bias", "one-sided systematic error"),
    ("cheat_scale", "cosine", "bias", "one-sided systematic error"),
    ("cheat_count", "exact", "timed_outputs", "wrong after timed launch"),
    ("cheat_memo", "exact", ("differential", "timed_outputs"), ""),
]


def test_cuda_ref_slowing_attempt_gains_nothing(cuda_suite, evidence):
    """An opt that rewrites ref's input after its own launches: the restore before every
    launch undoes it and ref is judged on every timed launch, so it gains nothing: caught, or
    no faster."""
    r = cuda_suite("cheat_slowref")
    evidence("cheat_slowref", {"status": r["status"],
                               "failed_check": (r.get("correctness") or {}).get("failed_check"),
                               "ref_integrity": (r.get("trust") or {}).get("ref_integrity")})
    if r["status"] == "fail":
        assert r["correctness"]["failed_check"] in ("input_integrity", "ref_integrity",
                                                    "timed_outputs")
    else:
        assert r["status"] == "pass" and r["speed"]["difference"] != "faster"
        assert r["trust"]["ref_integrity"]["passed"] is True


@pytest.mark.parametrize(("kernel", "policy", "check_name", "phrase"), REJECTED,
                         ids=[f"{k}-{p}" for k, p, _, _ in REJECTED])
def test_cuda_cheat_is_rejected_with_the_right_reason(cuda_suite, evidence, kernel, policy,
                                                      check_name, phrase):
    r = cuda_suite(kernel, policy)
    line = Result.from_json(r).summary()
    evidence(f"trust[{kernel}-{policy}]", {"status": r["status"], "summary": line,
                                           "failed_check": (r.get("correctness") or {}).get(
                                               "failed_check")})
    assert r["status"] == "fail" and r["correct"] is False, r.get("error") or line
    assert phrase in line, line
    assert r["correctness"].get("failed_check") in (
        check_name if isinstance(check_name, tuple) else (check_name,)), line


def test_cuda_kernel_wrong_only_in_the_timing_windows_fails(kit, cuda_suite, evidence):
    """A per-block launch counter tells opt's timing windows (launches 4 + D to 8 + D, D the
    differential runs) from the rest; wrong only there, it fails: every window is judged."""
    honest = cuda_suite("gemm_tiled", source="gemm")
    d = len(honest["trust"]["differential"]["finding"]["runs"])
    assert honest["trust"]["timed_outputs"]["finding"]["windows_checked"] == 5
    binary = compile_cuda(CUDA_SRC / "adversarial.cu", kit.root / "bin" / "adv-windows.cubin",
                          arch=kit.arch, defines={"KP_FROM": 4 + d})
    r = cuda_suite("cheat_windows", binary=binary)
    line = Result.from_json(r).summary()
    evidence("trust[cheat_windows]", {"status": r["status"], "summary": line, "from": 4 + d})
    assert r["status"] == "fail", line
    assert r["correctness"]["failed_check"] == "timed_outputs", line
    assert "wrong after timing window 1 " in line, line


def test_cuda_kernel_scaled_only_on_its_timed_inputs_fails_bias(kit, cuda_suite, evidence):
    """A per-block launch counter: exact on opt's check runs (its own, the differential
    ones), (1 + 2^-10) x the answer from its first timing window on, every launch of which is
    timed on a fresh input. Cosine passes each; the sign test on every timed launch fails it."""
    honest = cuda_suite("gemm_tiled", "cosine", source="gemm")
    d = len(honest["trust"]["differential"]["finding"]["runs"])
    binary = compile_cuda(CUDA_SRC / "adversarial.cu", kit.root / "bin" / "adv-tscale.cubin",
                          arch=kit.arch, defines={"KP_FROM": 4 + d})
    r = cuda_suite("cheat_timedscale", "cosine", binary=binary)
    line = Result.from_json(r).summary()
    bias = (r.get("trust") or {}).get("bias", {}).get("finding") or {}
    evidence("trust[cheat_timedscale-cosine]", {
        "status": r["status"], "summary": line, "from": 4 + d,
        "timed_launches_judged": bias.get("timed_launches_judged")})
    assert r["status"] == "fail", line
    assert r["correctness"]["failed_check"] == "bias", line
    assert "one-sided systematic error" in line and "timing window 1" in line, line
    assert r["trust"]["differential"]["passed"] is True


def test_cuda_memo_of_a_region_the_declared_mutations_leave_out_fails(cuda_suite, evidence):
    """B kept in bf16 from opt's first launch on, under a cosine policy whose mutations name
    only A: B gets the derived mutation too, and the stale copy fails on it."""
    r = cuda_suite("cheat_memob", "cosine_a")
    line = Result.from_json(r).summary()
    diff = ((r.get("trust") or {}).get("differential") or {}).get("finding") or {}
    evidence("trust[cheat_memob-cosine_a]", {
        "status": r["status"], "summary": line,
        "failed_check": (r.get("correctness") or {}).get("failed_check"),
        "mutations": diff.get("mutations"), "derived_for": diff.get("derived_for")})
    assert r["status"] == "fail", line
    assert r["correctness"]["failed_check"] in ("differential", "timed_outputs"), line
    assert diff["derived_for"] == ["B"], diff


@pytest.mark.parametrize(("source", "kernel", "policy"),
                         [("gemm", "gemm_naive", "exact"), ("gemm", "gemm_tiled", "exact"),
                          ("gemm", "gemm_naive", "default"),
                          ("adversarial", "honest_splitk", "cosine"),
                          ("adversarial", "honest_splitk", "cosine_a")])
def test_cuda_honest_opt_passes_every_check(cuda_suite, evidence, source, kernel, policy):
    r = cuda_suite(kernel, policy, source)
    line = Result.from_json(r).summary()
    trust = r.get("trust") or {}
    evidence(f"trust[{kernel}-{policy}]", {
        "status": r["status"], "summary": line, "stage_s": r.get("stage_s"),
        "checks": {k: v["passed"] for k, v in trust.items()},
        "impossible_speed": trust.get("impossible_speed", {}).get("finding"),
        "timing_integrity": trust.get("timing_integrity", {}).get("finding")})
    assert r["status"] == "pass", r.get("error") or line
    assert set(trust) == set(CHECKS)
    assert not [k for k, v in trust.items() if v["passed"] is False]
    assert trust["poisoned_outputs"]["finding"]["regions"] == {"C": {"bytes": N * N * 4,
                                                                     "runs": 1}}
    assert trust["guard_bands"]["ran"] and trust["timing_integrity"]["ran"]
    assert trust["impossible_speed"]["ran"]  # the CUDA backend measures its bandwidth


def _masked_update(kit, kernel: str, seed: int, n: int = 1 << 22):
    """A recorded dispatch of tests/cuda/elementwise.cu's KERNEL(mask, g, out, n) (out
    updated in place under a random mask: a million write-only runs) and its mask."""
    rng = np.random.default_rng(seed)
    mask = (rng.random(n) < 0.5).astype(np.uint8)
    g, out = rng.standard_normal(n, np.float32), rng.standard_normal(n, np.float32)
    snap = kit.record("elementwise", kernel, [mask, g, out, np.int32(n)],
                      Launch((n // 256, 1, 1), (256, 1, 1)), ["mask", "g", "out", "n"])
    return snap, mask


def test_cuda_fragmented_write_only_bytes_take_held_poison(kit, evidence):
    """out's write-only bytes depend on the data (a million runs): launches on the pre-state
    take their poison from copies held on the device, each checked intact after the launch.
    An honest opt passes every check; one that skips the masked writes leaves poison."""
    snap, mask = _masked_update(kit, "relu_backward", seed=3)
    rows = {}
    for kernel in ("relu_backward", "relu_backward_skip"):
        harness = kit.pair(snap, opt=kit.build("elementwise"), opt_kernel=kernel)
        r = rows[kernel] = kit.run(harness, timeout_s=300, **kit.quick)
        evidence(f"held-poison[{kernel}]", {"status": r["status"], "stage_s": r.get("stage_s"),
                                            "summary": Result.from_json(r).summary()})
    honest, skip = rows["relu_backward"], rows["relu_backward_skip"]
    assert honest["status"] == "pass", Result.from_json(honest).summary()
    trust = honest["trust"]
    assert not [k for k, v in trust.items() if v["passed"] is False]
    poisoned = trust["poisoned_outputs"]["finding"]["regions"]["out"]
    assert poisoned["bytes"] == int(mask.sum()) * 4 and poisoned["runs"] > 1000
    assert trust["guard_bands"]["finding"]["violations"] == []
    timed = trust["timed_outputs"]["finding"]
    assert timed["checked"] == timed["launches"] > 0   # every timed launch judged
    assert skip["status"] == "fail"
    assert skip["correctness"]["failed_check"] == "poisoned_outputs", skip["correctness"]


def test_cuda_opt_is_never_judged_under_a_poison_that_changes_refs_own_answer(kit, evidence):
    """Masked elements of out become 0 unless they held a huge number: write-only to both
    discovery fills, not to about four arbitrary poison words in ten. Each candidate's poisons
    (held on the device: a million runs) are proven by ref's control before opt runs, and a
    mutated input's poison is checked on ref with the words opt had: ref against itself passes
    under every seed, poisoned."""
    snap, mask = _masked_update(kit, "huge_keep", seed=4)
    harness = kit.pair(snap, opt=kit.build("elementwise"), opt_kernel="huge_keep")
    for seed in range(1, 7):
        r = kit.run(harness, timeout_s=300, **dict(kit.quick, seed=seed))
        poison = ((r.get("trust") or {}).get("poisoned_outputs") or {}).get("finding") or {}
        evidence(f"huge-keep[seed {seed}]", {"status": r["status"],
                                             "summary": Result.from_json(r).summary(),
                                             "control": poison.get("control")})
        assert r["status"] == "pass", (seed, Result.from_json(r).summary())
        assert poison["regions"]["out"]["bytes"] == int(mask.sum()) * 4, (seed, poison)


def test_cuda_in_place_memo_is_rejected_and_honest_in_place_passes(kit, evidence):
    """x is the only buffer and is updated in place (no region is read-only): its pre-state
    is the input, mutated whole and at secret positions, and freshly changed in every timed
    block. A memo keyed on sampled elements is stale there; ref against itself passes."""
    n = 1 << 20
    x = np.random.default_rng(5).standard_normal(n, np.float32)
    snap = kit.record("elementwise", "relu_inplace", [x, np.int32(n)],
                      Launch((n // 256, 1, 1), (256, 1, 1)), ["x", "n"])
    rows = {}
    for kernel in ("relu_inplace", "relu_inplace_memo"):
        harness = kit.pair(snap, opt=kit.build("elementwise"), opt_kernel=kernel)
        r = rows[kernel] = kit.run(harness, timeout_s=300, **kit.quick)
        evidence(f"in-place[{kernel}]", {
            "status": r["status"], "summary": Result.from_json(r).summary(),
            "failed_check": (r.get("correctness") or {}).get("failed_check"),
            "mutations": ((r.get("trust") or {}).get("differential", {}).get("finding")
                          or {}).get("mutations")})
    honest, memo = rows["relu_inplace"], rows["relu_inplace_memo"]
    assert honest["status"] == "pass", Result.from_json(honest).summary()
    assert honest["trust"]["differential"]["finding"]["source"] == "derived"
    assert memo["status"] == "fail", Result.from_json(memo).summary()
    assert memo["correctness"]["failed_check"] in ("differential", "timed_outputs"), \
        Result.from_json(memo).summary()
