"""On CUDA, scratch a session placed for one candidate plan is guard territory for another
that does not declare it (``Replay.foreign_scratch``, canaried by the armour with the guard
bands): the harness is a one-launch plan of kp_add (no scratch); ``small`` declares scratch
``t`` (kp_add into ``t``, then a copy to ``c``), so the session places ``t``; the harness's
own plan (no scratch) then passes; ``stray`` declares none and launches kp_add a second time
with its output pointer passed as a u64 scalar holding the address where kpair placed ``t``
(a cubin's layout gives sizes only, so a scalar of pointer size binds there: the candidate
is hostile and read kpair's placement rule) and fails ``guard_bands`` naming ``t``. Needs an
sm_90 GPU (tests/data's kp_add). Mirrors tests/test_pipeline_plan_scratch_gpu.py; the CPU
twin is tests/test_pipeline_plan_scratch.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_pipeline_plan_scratch_gpu import N, _plan
from torch_capture import DATA, record_kp_add

pytestmark = pytest.mark.gpu

#: kpair.replay: plan scratch goes after the captured span, this many bytes apart, aligned
#: to the buffer's alignment (a plan's default 256).
GAP, ALIGN = 4096, 256


def _stray(d: Path, at: int) -> Path:
    """kp_add into c, then kp_add again into the absolute address ``at`` (a u64 scalar)."""
    d.mkdir(parents=True)
    (d / "k.cubin").write_bytes((DATA / "kp_add_sm90.cubin").read_bytes())

    def add(out: dict) -> dict:
        return {"code": "k.cubin", "kernel": "kp_add", "grid": [N // 256, 1, 1],
                "block": [256, 1, 1], "args": [
                    {"bind": "region", "name": "a"}, {"bind": "region", "name": "b"}, out,
                    {"bind": "scalar", "kind": "i32", "value": N}]}

    doc = {"schema": "kpair.plan", "schema_version": 1, "launches": [
        add({"bind": "region", "name": "c", "access": "write"}),
        add({"bind": "scalar", "kind": "u64", "value": at})]}
    (d / "opt.plan.json").write_text(json.dumps(doc))
    return d / "opt.plan.json"


def test_a_plan_writing_into_scratch_placed_for_another_fails_guard_bands(cuda, tmp_path):
    from kpair.harness import create_harness
    from kpair.optimize.strategies.captured import plan_candidate
    from kpair.pipeline import RunOptions
    from kpair.session import Session
    from kpair.snapshot import Snapshot

    record_kp_add(tmp_path / "s", N)
    m = Snapshot.open(tmp_path / "s").manifest
    hi = max([r.end for r in m.regions] + [s.end for s in m.scratch_regions])
    at = -(-(hi + GAP) // ALIGN) * ALIGN   # where ``t`` lies, the captured span not moved
    h = create_harness(tmp_path / "s", tmp_path / "H", plan=_plan(tmp_path / "own", None))
    small = _plan(tmp_path / "small", N * 4)
    stray = _stray(tmp_path / "stray", at)
    options = RunOptions(time_cap_s=1.0, timeout_s=300, control=False)
    with Session(h.root, options) as s:
        placed = s.judge(plan_candidate(small, label="small", strategy="test")).result
        own = s.judge(plan_candidate(tmp_path / "own" / "opt.plan.json", label="own",
                                     strategy="test")).result
        assert placed.status == "pass", (placed.reason, placed.correctness)
        assert own.status == "pass", (own.reason, own.correctness)
        if placed.replay.get("delta"):
            pytest.skip(f"the regions were relocated ({placed.replay.get('reason')}): the "
                        "captured address of t is not where it lies")
        got = s.judge(plan_candidate(stray, label="stray", strategy="test")).result
    assert got.status == "fail", (got.status, got.reason)
    assert got.correctness.failed_check == "guard_bands", got.reason
    assert "scratch buffer t" in got.reason, got.reason
