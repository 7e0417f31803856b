"""A judging session places a candidate plan's own scratch like its harness plan's: the
harness here is the A/A plan of the host range matmul + bias + ReLU
(``conftest.record_mlp_range``), which declares no scratch; the candidates are fused captures
of the same range (tests/csrc/plan_scratch.c) bound into plans that each declare a scratch
row ``acc``. The honest one passes (never ``InternalError: KeyError``); one that leans on
its scratch holding zeros fails, because the scratch is poisoned before each launch; one that
writes just before its scratch fails the guard bands; a later candidate asking for a larger
``acc`` gets it; the harness's own judgement is unchanged after a re-placement."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import CSRC, record_mlp_range
from kpair.harness import bind_snapshot
from kpair.optimize.strategies.captured import plan_candidate, substitute, write_plan
from kpair.optimize.workbench import Operator, base_harness
from kpair.options import RunOptions
from kpair.pipeline import merged_scratch, unplaced_scratch
from kpair.plan import Plan, Scratch
from kpair.record import Recorder
from kpair.session import Session
from kpair.snapshot import Snapshot
from kpair.toolchain import compile_shared

N = 48
QUICK = RunOptions(time_cap_s=0.3, min_blocks=4, max_blocks=8, control=False,
                   timeout_s=300, seed=5)


def _arrays(n: int) -> dict:
    rng = np.random.default_rng(1)
    return {"a": rng.standard_normal((n, n), dtype=np.float32),
            "b": rng.standard_normal((n, n), dtype=np.float32),
            "bias": rng.standard_normal(n, dtype=np.float32),
            "out": np.zeros((n, n), np.float32), "out2": np.zeros((n, n), np.float32)}


def _capture(lib: Path, x: dict, out: Path, fn: str, acc: np.ndarray) -> Path:
    """One call of ``fn`` over ``x``'s arrays into ``out2`` (declared), ``acc`` its scratch."""
    x["out2"][...] = 0
    with Recorder(out, names={"a": x["a"], "b": x["b"], "bias": x["bias"],
                              "out2": x["out2"], "acc": acc},
                  outputs=[x["out2"]], scratch=[acc]) as r:
        r.call(lib, fn, [np.int32(N), x["bias"], x["a"], x["b"], x["out2"], acc])
    return r.snapshot.root


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("planscratch")
    ops = compile_shared(CSRC / "range_ops.c", d / "ops.so", flags=("-O2", "-g"))
    lib = compile_shared(CSRC / "plan_scratch.c", d / "acc.so", flags=("-O2", "-g"))
    x = _arrays(N)
    ref = Snapshot.open(record_mlp_range(ops, d / "ref", x, N).root)
    plans = {}
    for label, size in (("kp_acc", N), ("kp_acc-wide", 4 * N)):
        cap = _capture(lib, x, d / f"cap-{label}", "kp_acc", np.zeros(size, np.float32))
        plans[label] = bind_snapshot(ref, cap, d / f"plan-{label}")
    honest = Plan.read(plans["kp_acc"])
    (launch,) = honest.launches
    for fn in ("kp_acc_dirty", "kp_acc_under"):   # the same plan, the cheat's kernel
        plans[fn] = write_plan(plans["kp_acc"], substitute(
            honest, 0, code=launch.code, kernel=fn, fmt="elf-so"), fn)
    base = base_harness(Operator(2, "mlp", snapshot=ref.root), d / "work")
    return {"base": base, "plans": plans, "ref": ref}


def test_the_candidates_declare_scratch_the_harness_lacks(lab):
    assert lab["base"].plan is not None and lab["base"].plan.scratch == ()
    for path in lab["plans"].values():
        assert [b.name for b in Plan.read(path).scratch] == ["acc"]
    wide = Plan.read(lab["plans"]["kp_acc-wide"]).scratch[0]
    assert wide.size == 4 * Plan.read(lab["plans"]["kp_acc"]).scratch[0].size


def test_a_plan_with_its_own_scratch_is_judged_placed_poisoned_and_guarded(lab):
    judged = {}
    with Session(lab["base"].root, QUICK) as s:
        for label in ("kp_acc", "kp_acc_dirty", "kp_acc_under", "kp_acc-wide", "kp_acc"):
            c = s.judge(plan_candidate(lab["plans"][label], label=label, strategy="test"))
            judged.setdefault(label, []).append(c.result)
    for label, results in judged.items():
        for r in results:
            assert "KeyError" not in (r.reason or ""), (label, r.reason)
            assert r.status != "error", (label, r.reason)
    assert [r.status for r in judged["kp_acc"]] == ["pass", "pass"], \
        [r.reason for r in judged["kp_acc"]]
    assert judged["kp_acc-wide"][0].status == "pass", judged["kp_acc-wide"][0].reason
    dirty = judged["kp_acc_dirty"][0]   # right on zeros: the poisoned scratch shows it
    assert dirty.status == "fail" and "region out" in dirty.reason, dirty.reason
    under = judged["kp_acc_under"][0]
    assert under.status == "fail" and under.correctness.failed_check == "guard_bands", \
        (under.reason, under.correctness.failed_check)


def test_the_harness_own_judgement_after_a_candidate_with_scratch(lab):
    """The harness's own opt (the A/A plan, no scratch), judged after a candidate made the
    session place more: it still passes, as on a fresh session."""
    base = lab["base"]
    with Session(base.root, QUICK) as s:
        first = s.judge(plan_candidate(lab["plans"]["kp_acc-wide"], label="wide",
                                       strategy="test"))
        own = s.judge(plan_candidate(base.root / base.spec.plan, label="own",
                                     strategy="test"))
    assert first.result.status == "pass", first.result.reason
    assert own.result.status == "pass", own.result.reason


def test_unplaced_and_merged_scratch():
    placed = (("acc", 256, 256), ("tile", 64, 1024))
    assert unplaced_scratch(placed, [Scratch("acc", 256), Scratch("tile", 64, 512)]) == []
    assert [b.name for b in unplaced_scratch(placed, [
        Scratch("acc", 257), Scratch("tile", 64, 2048), Scratch("other", 1)])] == \
        ["acc", "tile", "other"]
    assert merged_scratch([("a", 4, 256), ("b", 8, 256), ("a", 16, 64)]) == \
        (("a", 16, 256), ("b", 8, 256))
