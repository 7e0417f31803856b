"""benchmarks/kernelbench_release.py on a real GPU (the CPU half:
tests/test_kernelbench_release_cpu.py): two KernelBench-style problem files
(tests/kb_problems.py, no KernelBench copy needed), captured by the driver's own ``child``
under ``kpair capture``: the eager range and Inductor's three ranges per problem, each judged
by the tournament; every problem is decided (published, or excluded for a reason other than a
failed capture), the producers stand side by side in report.json, and a second call skips both;
the same through the scheduler (``scheduled``: captures pooled, timed runs alone). Skips
cleanly without PyTorch with CUDA, cuda-bindings or CUPTI. NOT run yet (no GPU where it was
written).
"""

from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path

import pytest

from kb_problems import write_level2
from kpair.options import RunOptions
from kpair.release import load_index
from test_opt_capture_gpu import torch_gpu  # noqa: F401 (a fixture)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import kernelbench as kb  # noqa: E402
import kernelbench_release as krel  # noqa: E402

pytestmark = pytest.mark.gpu

def test_the_driver_decides_every_problem_and_resumes(torch_gpu, tmp_path):  # noqa: F811
    write_level2(tmp_path / "kb")
    problems = kb.discover(tmp_path / "kb", [2])
    args = types.SimpleNamespace(sizes=str(tmp_path / "none.json"), capture_timeout=400,
                                 producers=list(krel.COMPILE), scale=False, budget_mib=64,
                                 max_gib=60, inductor_cache=str(tmp_path / "inductor"))
    rel, lines = tmp_path / "rel", []
    got = krel.orchestrate(problems, rel, tmp_path / "work", krel.capture_batch(args),
                           options=RunOptions(time_cap_s=2.0, timeout_s=300),
                           deadline=time.monotonic() + 540, batch=2, margin=20,
                           log=lines.append)
    print("\n".join(lines))   # the evidence: every entrant's verdict, the headline
    assert got["left"] == 0 and len(got["decided"]) == 2, lines
    index = load_index(rel)
    rows = [*index.operators, *index.refused]
    assert len(rows) == 2
    for row in rows:
        assert row.exclusion not in ("capture-failed", "nondeterministic-ref"), row.reason
        producers = [e.producer for e in row.entrants]
        assert producers == ["inductor-default", "max-autotune", "coordinate-descent"], \
            [(e.producer, e.status, e.reason) for e in row.entrants]
        assert any(e.status == "pass" for e in row.entrants), row.entrants
        assert row.range is not None or row.exclusion is not None
    doc = json.loads((rel / "report.json").read_text())
    assert {o["operator"] for o in doc["producers"]["operators"]} == {
        "level2/1_Gemm_ReLU_Add", "level2/2_Scale_Tanh_Mul"}
    again = krel.orchestrate(problems, rel, tmp_path / "work", krel.capture_batch(args),
                             options=RunOptions(time_cap_s=2.0), deadline=time.monotonic() + 60,
                             margin=5, log=lines.append)
    assert again == {"decided": [], "skipped": 2, "left": 0}


def test_the_scheduled_driver_decides_every_problem_with_runs_alone(torch_gpu,  # noqa: F811
                                                                     tmp_path):
    write_level2(tmp_path / "kb")
    problems = kb.discover(tmp_path / "kb", [2])
    work = tmp_path / "work"
    args = types.SimpleNamespace(sizes=str(tmp_path / "none.json"), capture_timeout=400,
                                 producers=list(krel.COMPILE), scale=False, budget_mib=64,
                                 max_gib=60, inductor_cache=str(tmp_path / "inductor"),
                                 gate=work / "gate")
    rel, lines = tmp_path / "rel", []
    got = krel.scheduled(problems, rel, work, krel.capture_batch(args),
                         options=RunOptions(time_cap_s=2.0, timeout_s=300),
                         deadline=time.monotonic() + 540, jobs=2, log=lines.append)
    print("\n".join(lines))   # the evidence: every entrant's verdict, the headline
    assert got["aborted"] is None and got["left"] == 0 and len(got["decided"]) == 2, lines
    # the captures hold the gate inside their program; replay and pair never beside a run
    assert krel.kb_pipeline.overlaps([e for e in got["log"] if e["stage"] != "capture"]) == []
    index = load_index(rel)
    for row in [*index.operators, *index.refused]:
        assert row.exclusion not in ("capture-failed", "nondeterministic-ref"), row.reason
        assert [e.producer for e in row.entrants] == [
            "inductor-default", "max-autotune", "coordinate-descent"]
    rows = [json.loads(x) for x in (rel / krel.BREAKDOWN).read_text().splitlines()]
    for r in rows:
        print(r["key"], r["breakdown"])
        assert sorted(r["breakdown"]["compile_s"]) == sorted(krel.COMPILE)
        assert len(r["breakdown"]["run_s"]) == 3
    again = krel.scheduled(problems, rel, work, krel.capture_batch(args),
                           options=RunOptions(time_cap_s=2.0), deadline=time.monotonic() + 60,
                           jobs=2, log=lines.append)
    assert again["decided"] == [] and again["skipped"] == 2
