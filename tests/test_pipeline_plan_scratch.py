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
from kpair.policy import Policy
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


def _capture_plain(lib: Path, x: dict, out: Path) -> Path:
    """One call of ``kp_direct`` (no scratch) over ``x``'s arrays into ``out2``."""
    x["out2"][...] = 0
    with Recorder(out, names={"a": x["a"], "b": x["b"], "bias": x["bias"],
                              "out2": x["out2"]}, outputs=[x["out2"]]) as r:
        r.call(lib, "kp_direct", [np.int32(N), x["bias"], x["a"], x["b"], x["out2"]])
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
    # A fused candidate with no scratch of its own, and its cheat writing where ``acc`` lies.
    plans["kp_direct"] = bind_snapshot(ref, _capture_plain(lib, x, d / "cap-direct"),
                                       d / "plan-direct")
    direct = Plan.read(plans["kp_direct"])
    plans["kp_direct_stray"] = write_plan(plans["kp_direct"], substitute(
        direct, 0, code=direct.launches[0].code, kernel="kp_direct_stray", fmt="elf-so"),
        "kp_direct_stray")
    base = base_harness(Operator(2, "mlp", snapshot=ref.root), d / "work")
    return {"base": base, "plans": plans, "ref": ref}


def test_the_candidates_declare_scratch_the_harness_lacks(lab):
    assert lab["base"].plan is not None and lab["base"].plan.scratch == ()
    for label, path in lab["plans"].items():
        assert [b.name for b in Plan.read(path).scratch] == \
            ([] if label.startswith("kp_direct") else ["acc"])
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


def test_scratch_placed_for_another_candidate_is_guarded(lab):
    """``acc`` is placed when ``kp_acc`` is judged; a later candidate that declares no
    scratch and writes where ``acc`` lies (``kp_direct_stray``: the address made from its own
    pointers and kpair's placement rule) fails ``guard_bands``, naming ``acc``; its honest
    twin, and ``kp_acc`` again after it, pass."""
    m = lab["ref"].manifest
    # What kp_direct_stray assumes: the captured span is its four regions' (no range scratch).
    assert sorted((r.name, r.size) for r in m.regions) == sorted(
        [("a", 4 * N * N), ("b", 4 * N * N), ("bias", 4 * N), ("out", 4 * N * N)])
    assert not m.scratch_regions
    assert Plan.read(lab["plans"]["kp_direct"]).scratch == ()
    with Session(lab["base"].root, QUICK) as s:
        got = [s.judge(plan_candidate(lab["plans"][label], label=label, strategy="test")
                       ).result
               for label in ("kp_acc", "kp_direct", "kp_direct_stray", "kp_acc")]
    acc, direct, stray, again = got
    for r in (acc, direct, again):
        assert r.status == "pass", r.reason
    assert stray.status == "fail", stray.reason
    assert stray.correctness.failed_check == "guard_bands", stray.reason
    assert "scratch buffer acc" in stray.reason, stray.reason
    found = stray.trust["guard_bands"].finding["violations"]
    assert found and found[0]["region"] == "scratch:acc" and found[0]["first_offset"] == 4


def test_ref_launches_and_a_plans_tail_treat_other_scratch_as_guard_bands(lab):
    """On a replay that placed ``acc`` (4N floats) for some plan: ref's range owns none of
    it, a plan declaring N floats owns only those (the rest is guarded, and only its own N
    are poisoned before its launch), ``kp_direct`` owns none. A ref that writes where ``acc``
    lies (its range with ``kp_direct_stray`` appended, a hostile baseline) is refused by name;
    ref itself passes."""
    from kpair.backends.host import HostDevice
    from kpair.errors import KpairError
    from kpair.harness import load_plan
    from kpair.program import Program
    from kpair.replay import Replay
    from kpair.trust.audit import Audit

    snap, m = lab["ref"], lab["ref"].manifest
    dev = HostDevice()
    try:
        replay = Replay(dev, snap, plan_scratch=[("acc", 16 * N, 256)])
        ((_, at, size),) = replay.scratch
        assert size == 16 * N
        ref = replay.load_range("ref")
        honest = replay.load_plan(*load_plan(lab["plans"]["kp_acc"], m))
        stray = replay.load_plan(*load_plan(lab["plans"]["kp_direct_stray"], m))
        assert replay.foreign_scratch(ref) == [("acc", at, 16 * N, 0)]
        assert replay.foreign_scratch(stray) == [("acc", at, 16 * N, 0)]
        assert honest.scratch == ((at, 4 * N),)
        assert replay.foreign_scratch(honest) == [("acc", at + 4 * N, 12 * N, 4 * N)]
        # The plan's own N floats are poisoned before its launch whatever lies there; the
        # tail past them is left for the canaries.
        dev.write(at, bytes(16 * N))
        replay.device._poison(honest)
        got = dev.read(at, 16 * N)
        assert got[:4 * N] != bytes(4 * N) and got[4 * N:] == bytes(12 * N)

        audit = Audit(replay, Policy(), {}, seed=7)
        assert len(audit.baseline(ref, m.launch)) >= 1
        hostile = Program("hostile ref", (*ref.steps, *stray.steps), ref.scratch)
        with pytest.raises(KpairError, match="scratch buffer acc"):
            audit.baseline(hostile, m.launch)
        # The same launches with the guard bands skipped: nothing is canaried there.
        lax = Audit(replay, Policy(), {}, seed=7, skip=["guard_bands"])
        lax.baseline(hostile, m.launch)
        assert lax.armor.last == []
    finally:
        dev.close()


def test_unplaced_and_merged_scratch():
    placed = (("acc", 256, 256), ("tile", 64, 1024))
    assert unplaced_scratch(placed, [Scratch("acc", 256), Scratch("tile", 64, 512)]) == []
    assert [b.name for b in unplaced_scratch(placed, [
        Scratch("acc", 257), Scratch("tile", 64, 2048), Scratch("other", 1)])] == \
        ["acc", "tile", "other"]
    assert merged_scratch([("a", 4, 256), ("b", 8, 256), ("a", 16, 64)]) == \
        (("a", 16, 256), ("b", 8, 256))
