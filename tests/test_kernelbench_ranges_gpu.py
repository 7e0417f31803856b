"""benchmarks/kernelbench_ranges.py on a real GPU (the CPU half:
tests/test_kernelbench_ranges_sched.py): two KernelBench-style Level 2 problems
(tests/kb_problems.py, no KernelBench copy needed), each captured in its own ``kpair capture``
process by the driver's ``child`` (which takes the GPU gate after its imports), replayed,
paired and run twice by the scheduler with two untimed jobs. Every problem is decided with its
breakdown (the program's import, compile and ranges seconds; each timed run's own stage
seconds), no timed run overlaps a replay or a pair, and a second call skips both. Skips cleanly
without PyTorch with CUDA, cuda-bindings or CUPTI. NOT run yet (no GPU where it was written):

    python3 -m pytest -q -m gpu tests/test_kernelbench_ranges_gpu.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kb_problems import write_level2
from test_opt_capture_gpu import torch_gpu  # noqa: F401 (a fixture)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import kb_pipeline  # noqa: E402
import kernelbench_ranges as kr  # noqa: E402

pytestmark = pytest.mark.gpu

def test_the_driver_decides_each_problem_with_its_breakdown_and_resumes(
        torch_gpu, tmp_path):  # noqa: F811
    write_level2(tmp_path / "kb")
    out = tmp_path / "out"
    argv = ["run", "--kernelbench", str(tmp_path / "kb"), "-o", str(out), "--work",
            str(tmp_path / "work"), "--sizes", str(tmp_path / "none.json"), "--count", "2",
            "--jobs", "2", "--time-cap", "1", "--deadline", "500"]
    assert kr.main(argv) == 0
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    print(json.dumps(rows, indent=1)[:20000])   # the evidence
    assert len(rows) == 2
    for row in rows:
        assert row["program"].get("ok"), row
        assert row["outcome"] in ("pass", "fail"), row   # judged, not a driver fault
        b = row["breakdown"]
        assert all(b[k] is not None for k in ("capture_s", "import_s", "compile_s",
                                              "replay_s", "pair_s", "run_s")), b
        for label in ("eager", "compiled"):
            assert row[f"{label}_replay"]["verdict"] in ("byte-exact", "nondeterministic")
        assert row["runs"][0]["stage_s"]   # where the run's seconds went
        if row["outcome"] == "pass":
            assert row["runs"][0]["stopped_by"] in ("ci", "max_blocks", "time_cap")
            assert len(row["runs"]) == 2 and b["rerun_s"] is not None
    schedule = json.loads((out / "schedule.json").read_text())
    untimed = [e for e in schedule["log"] if e["stage"] in ("replay", "pair")]
    assert kb_pipeline.overlaps([e for e in schedule["log"] if e["timed"]] + untimed) == []
    assert kr.main(argv) == 0   # a second call: both decided, nothing runs again
    assert len((out / "results.jsonl").read_text().splitlines()) == 2
