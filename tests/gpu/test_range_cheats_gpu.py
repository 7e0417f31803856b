"""The CUDA cheat tests re-run against range candidates (issue 47). ref is a CUDA range of
three kernels recorded from numpy arrays (tests/cuda/range_mlp.cu: matmul, bias, ReLU, out
declared); the candidate is the same range captured again as one fused kernel with its own
signature, writing another array, bound to ref's range (``kpair.bind.bind_capture``) into a
launch plan. The honest plan passes byte-exact; each cheat of the single-dispatch battery
(tests/gpu/test_cuda_trust.py) that applies to a plan is that plan with its launch's kernel
replaced by the cheat (same cubin, same parameter layout: ``strategies.captured.substitute``,
checked by ``load_plan``), paired and run as ``kpair pair`` / ``kpair run`` do, and must FAIL
with the named check: skipping the work, a stale answer, a memo across launches, a write
past its output, a write into a live-in region, a launch counter that tells checked launches
from the rest, and one wrong only in the timing windows.

Not run where it was written (no GPU): run on an H100 or H200 with
``python -m pytest -q tests/gpu/test_range_cheats_gpu.py`` (nvcc on PATH, cuda-bindings).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kpair.bind import bind_capture
from kpair.harness import create_harness, load_plan
from kpair.optimize.strategies.captured import write_variant
from kpair.plan import Plan
from kpair.record import Recorder
from kpair.result import Result
from kpair.snapshot import Launch, Snapshot
from kpair.toolchain import compile_cuda

pytestmark = pytest.mark.gpu

CUDA_SRC = Path(__file__).parents[1] / "cuda"
N = 64


@pytest.fixture(scope="module")
def range_lab(kit):
    """ref's range and the fused capture, bound: (ref snapshot, plan path, cubin)."""
    cubin = kit.build("range_mlp")
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((N, N), np.float32) for _ in range(2))
    bias = rng.standard_normal(N, np.float32)
    out, out2 = np.zeros((N, N), np.float32), np.zeros((N, N), np.float32)
    tiles = Launch((N // 16, N // 16, 1), (16, 16, 1))
    flat = Launch((N * N // 256, 1, 1), (256, 1, 1))
    ref_dir, cand_dir = kit.path("range-ref"), kit.path("range-fused")
    with Recorder(ref_dir, backend="cuda", names={"a": a, "b": b, "bias": bias, "out": out},
                  outputs=[out]) as r:
        r.call(cubin, "kp_matmul", [a, b, out, np.int32(N)], tiles)
        r.call(cubin, "kp_bias", [out, bias, np.int32(N)], tiles)
        r.call(cubin, "kp_relu", [out, np.int32(N)], flat)
    with Recorder(cand_dir, backend="cuda", names={"a": a, "b": b, "bias": bias,
                                                   "out2": out2}, outputs=[out2]) as r:
        r.call(cubin, "kp_fused", [np.int32(N), bias, a, b, out2], tiles)
    want = np.maximum(a.astype(np.float64) @ b + bias, 0)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)   # the range really ran
    np.testing.assert_array_equal(out, out2)                         # bit-identical
    ref = Snapshot.open(ref_dir)
    assert len(ref.manifest.operations) == 3
    plan = bind_capture(ref, Snapshot.open(cand_dir)).write(kit.path("range-plan"))
    return {"ref": ref_dir, "plan": plan, "cubin": cubin}


def _run(kit, lab, kernel: str, cubin: Path | None = None) -> dict:
    """The bound plan with its one launch's kernel replaced by ``kernel`` (of ``cubin``,
    default range_mlp's), paired with ref's range and run."""
    plan = Plan.read(lab["plan"])
    image = (cubin or lab["cubin"]).read_bytes()
    variant = write_variant(lab["plan"], plan, image, ".cubin", f"cheat-{kernel}", 0, kernel,
                            "cubin", None, f"{plan.note}; launch 0 is {kernel}")
    load_plan(variant, Snapshot.open(lab["ref"]).manifest)   # the cheat fits the plan
    harness = kit.path(f"range-h-{kernel}")
    create_harness(lab["ref"], harness, plan=variant)
    return kit.run(harness, timeout_s=300, **kit.quick)


def test_the_honest_fused_plan_passes(kit, range_lab, evidence):
    r = _run(kit, range_lab, "kp_fused")
    line = Result.from_json(r).summary()
    evidence("range-cheats[honest]", {"status": r["status"], "summary": line})
    assert r["status"] == "pass", r.get("correctness") or r.get("error")
    assert r["replay"]["range_ops"] == 3 and r["replay"]["plan_launches"] == 1
    assert all(t["passed"] is not False for t in r["trust"].values())


REJECTED = [
    ("cheat_skip", ("poisoned_outputs",), "still hold the poison"),
    ("cheat_stale", ("differential", "timed_outputs"), ""),
    ("cheat_memo", ("differential", "timed_outputs"), ""),
    ("cheat_oob", ("guard_bands",), "opt wrote out of bounds"),
    ("cheat_input", ("input_integrity",), "modified input region a"),
    ("cheat_count", ("timed_outputs", "differential"), ""),
]


@pytest.mark.parametrize(("kernel", "checks", "phrase"), REJECTED,
                         ids=[k for k, _, _ in REJECTED])
def test_a_cheating_plan_fails_with_the_named_check(kit, range_lab, evidence, kernel, checks,
                                                    phrase):
    r = _run(kit, range_lab, kernel)
    line = Result.from_json(r).summary()
    failed = (r.get("correctness") or {}).get("failed_check")
    evidence(f"range-cheats[{kernel}]", {"status": r["status"], "summary": line,
                                         "failed_check": failed})
    assert r["status"] == "fail" and r["correct"] is False, r.get("error") or line
    assert failed in checks, line
    assert phrase in line, line


def test_a_plan_wrong_only_in_the_timing_windows_fails(kit, range_lab, evidence):
    """A per-block launch counter tells opt's timing windows (its launches 4 + D to 8 + D, D
    the differential runs, as for one dispatch) from the rest; wrong only there, the plan
    fails: every window of the range is judged."""
    honest = _run(kit, range_lab, "kp_fused")
    d = len(honest["trust"]["differential"]["finding"]["runs"])
    assert honest["trust"]["timed_outputs"]["finding"]["windows_checked"] >= 1
    binary = compile_cuda(CUDA_SRC / "range_mlp.cu", kit.root / "bin" / "range-windows.cubin",
                          arch=kit.arch, defines={"KP_FROM": 4 + d})
    r = _run(kit, range_lab, "cheat_windows", cubin=binary)
    line = Result.from_json(r).summary()
    evidence("range-cheats[cheat_windows]", {"status": r["status"], "summary": line,
                                             "from": 4 + d})
    assert r["status"] == "fail", line
    assert r["correctness"]["failed_check"] == "timed_outputs", line
