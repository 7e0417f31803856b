"""A judging session on CUDA places a candidate plan's own scratch (kpair.pipeline
``_place_scratch``): the harness is a one-launch plan of kp_add (no scratch); the candidates
declare a scratch buffer ``t`` the harness lacks (kp_add into ``t``, then a copy to ``c``), one
of them larger, so the session sets the device up again in the same worker process twice.
Each passes; none is an ``InternalError``. Needs an sm_90 GPU (tests/data's kp_add). Mirrors
tests/test_plan_data_gpu.py; the CPU twin is tests/test_pipeline_plan_scratch.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torch_capture import DATA, record_kp_add

pytestmark = pytest.mark.gpu
N = 1 << 20


def _plan(d: Path, scratch_bytes: int | None) -> Path:
    """kp_add straight into c (``scratch_bytes`` None), or into scratch ``t`` of that size
    and then a copy of ``t`` to c."""
    d.mkdir(parents=True)
    (d / "k.cubin").write_bytes((DATA / "kp_add_sm90.cubin").read_bytes())
    add = {"code": "k.cubin", "kernel": "kp_add", "grid": [N // 256, 1, 1],
           "block": [256, 1, 1], "args": [
               {"bind": "region", "name": "a"}, {"bind": "region", "name": "b"},
               {"bind": "region", "name": "c", "access": "write"} if scratch_bytes is None
               else {"bind": "scratch", "name": "t"},
               {"bind": "scalar", "kind": "i32", "value": N}]}
    doc = {"schema": "kpair.plan", "schema_version": 1, "launches": [add]}
    if scratch_bytes is not None:
        doc["scratch"] = [{"name": "t", "size": scratch_bytes}]
        doc["launches"].append({"kind": "copy", "dst": {"bind": "region", "name": "c"},
                                "src": {"bind": "scratch", "name": "t"}, "size": N * 4})
    (d / "opt.plan.json").write_text(json.dumps(doc))
    return d / "opt.plan.json"


def test_candidate_plans_with_their_own_scratch_pass_on_cuda(cuda, tmp_path):
    from kpair.harness import create_harness
    from kpair.optimize.strategies.captured import plan_candidate
    from kpair.pipeline import RunOptions
    from kpair.session import Session

    record_kp_add(tmp_path / "s", N)
    h = create_harness(tmp_path / "s", tmp_path / "H", plan=_plan(tmp_path / "own", None))
    assert h.plan.scratch == ()
    small, large = _plan(tmp_path / "small", N * 4), _plan(tmp_path / "large", N * 8)
    with Session(h.root, RunOptions(time_cap_s=1.0, timeout_s=300, control=False)) as s:
        got = [s.judge(plan_candidate(p, label=label, strategy="test")).result
               for label, p in (("small", small), ("large", large), ("small", small),
                                ("own", tmp_path / "own" / "opt.plan.json"))]
    for r in got:
        assert r.status == "pass", (r.reason, r.correctness)
