"""The workbench ``kpair optimize`` and ``kpair mcp`` share (``kpair.optimize.workbench``) and
the one candidate type (``kpair.candidate.Candidate``): both find the same operators, judge
on the same base harness, prune with the same quick measurement, and a candidate keeps its
provenance from proposal to attempt."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import record_matmul
from kpair.candidate import Candidate
from kpair.errors import KpairError
from kpair.harness import create_harness
from kpair.mcp.workspace import Workspace
from kpair.optimize import measurement_options
from kpair.optimize.program import OptimizeOptions
from kpair.optimize.search import PRUNE
from kpair.optimize.workbench import (
    CAPTURED,
    base_harness,
    built,
    captured_dispatches,
    find_operators,
    finished_capture,
    operators_from_capture,
    pair_harness,
    quick_options,
)
from kpair.options import RunOptions
from kpair.protocol import Judge, decode_request, encode_request
from kpair.session import Session, read_attempts, result_line

QUICK = RunOptions(min_blocks=4, max_blocks=4, time_cap_s=0.3, control=False, seed=1,
                   timeout_s=60)


@pytest.fixture(scope="module")
def tree(matmul_libs, tmp_path_factory) -> Path:
    """A work directory: a capture (capture.json naming one fused-looking snapshot), a
    harness, and a release-like folder whose harness is no operator."""
    root = tmp_path_factory.mktemp("wb")
    capture = root / "cap"
    capture.mkdir()
    snap = record_matmul(matmul_libs["naive"], capture / "0001_matmul", n=32)
    (capture / "capture.json").write_text(json.dumps({"exit_status": 0, "dispatches": [
        {"status": "captured", "snapshot": "0001_matmul"},
        {"status": "failed", "snapshot": None}]}))
    create_harness(snap, root / "pairs" / "mm", opt=matmul_libs["fast"])
    (root / "rel").mkdir()
    (root / "rel" / "index.json").write_text('{"schema": "kpair.release_index"}')
    create_harness(snap, root / "rel" / "h", opt=matmul_libs["fast"])
    return root


def test_optimize_and_mcp_find_the_same_operators(tree):
    found = find_operators(tree)
    assert {n: (op.kind, op.path.relative_to(tree).as_posix()) for n, op in found.items()} \
        == {"cap_0001_matmul": ("snapshot", "cap/0001_matmul"),
            "pairs_mm": ("harness", "pairs/mm")}
    assert all(op.level == 1 for op in found.values())  # kp_matmul: not a fused kernel
    ws = Workspace(tree)
    assert ws.operators() == found
    assert finished_capture(tree / "cap") and not finished_capture(tree / "pairs")
    assert [d["snapshot"] for d in captured_dispatches(tree / "cap")] == ["0001_matmul"]
    with pytest.raises(KpairError, match="not a readable kpair capture"):
        captured_dispatches(tree / "pairs")
    # optimize, given the capture, finds its one captured dispatch, the same snapshot
    (from_capture,) = operators_from_capture(tree / "cap")
    assert from_capture.snapshot == found["cap_0001_matmul"].snapshot
    assert from_capture.key == "level1/0001_matmul"


def test_the_base_harness_is_made_once_and_a_broken_one_again(tree, tmp_path):
    op = find_operators(tree)["cap_0001_matmul"]
    h = base_harness(op, tmp_path)
    assert (tmp_path / CAPTURED).read_bytes() == h.binary(h.ref)
    assert h.binary(h.opt) == h.binary(h.ref)  # A/A: ref against itself
    again = base_harness(op, tmp_path)
    assert again.root == h.root and again.spec == h.spec
    (h.root / "harness.json").write_text("{")  # no longer opens: made again
    assert base_harness(op, tmp_path).spec == h.spec
    given = find_operators(tree)["pairs_mm"]
    assert base_harness(given, tmp_path / "other").root == given.harness  # its own


def test_the_quick_measurement_is_one_rule(tree):
    full = RunOptions(seed=7, timeout_s=30, skip_checks=("noop",), max_blocks=400)
    quick = quick_options(full, max_blocks=12, time_cap_s=0.2)
    assert (quick.replicates, quick.min_blocks, quick.max_blocks, quick.time_cap_s,
            quick.control, quick.rel_ci, quick.aa) == (1, 4, 12, 0.2, False, None, False)
    assert (quick.checks, quick.seed, quick.timeout_s, quick.skip_checks) == \
        (True, 7, 30, ("noop",))
    # optimize's prune step: the same rule, the options it always had
    assert RunOptions(min_blocks=4, max_blocks=16, time_cap_s=1.0, control=False,
                      replicates=1) == PRUNE
    options = measurement_options(OptimizeOptions(), prune_max_blocks=8, prune_time_cap_s=0.5,
                                  seed=3, timeout_s=9)
    assert options.prune == RunOptions(replicates=1, min_blocks=4, max_blocks=8,
                                       time_cap_s=0.5, control=False, seed=3, timeout_s=9)


def test_a_candidate_keeps_its_provenance_from_proposal_to_attempt(tree, matmul_libs,
                                                                  tmp_path):
    proposed = Candidate(label="fast", strategy="test", source="matmul.c",
                         build="cc -O3", params={"flags": ["-O3"]})
    assert not proposed.built
    cand = replace(built(matmul_libs["fast"], "kp_matmul"), label=proposed.label,
                   strategy=proposed.strategy, source=proposed.source,
                   build=proposed.build, params=proposed.params)
    assert cand.built and cand.format == "elf-so" and cand.binary == matmul_libs["fast"]
    # the wire message is made from it and back into it
    judge = decode_request(encode_request(Judge.of(5, cand)))
    back = judge.candidate()
    assert (judge.id, back.image, back.kernel, back.format, back.label) == \
        (5, cand.image, "kp_matmul", "elf-so", "fast")

    harness = find_operators(tree)["pairs_mm"].harness
    with Session(harness, QUICK, out=tmp_path / "ev") as s:
        s.continue_after(6)  # another session of the same directory took 1..6
        judged = s.judge(cand)
        buggy = s.judge(built(matmul_libs["offbyone"], "kp_matmul", label="buggy"))
    assert judged.attempt == 7 and judged.result.status == "pass" and judged.speedup > 0
    assert judged.label == "fast" and judged.params == {"flags": ["-O3"]}
    assert buggy.attempt == 8 and buggy.result.status == "fail" and buggy.speedup == 0.0
    lines = read_attempts(tmp_path / "ev" / "attempts.jsonl")
    assert [(a.n, a.label, a.strategy, a.build, a.status) for a in lines] == [
        (7, "fast", "test", "cc -O3", "pass"), (8, "buggy", None, None, "fail")]
    line = result_line(judged.attempt, judged.result, tmp_path / "ev" / lines[0].result)
    assert line["n"] == 7 and line["status"] == "pass" and line["label"] == "fast"
    assert json.loads(Path(line["result"]).read_text())["status"] == "pass"
    with pytest.raises(Exception, match="not built"):
        Session(harness, QUICK).judge(replace(proposed, build_error="cc failed"))


def test_a_winner_is_published_on_the_base_harness_settings(tree, matmul_libs, tmp_path):
    given = find_operators(tree)["pairs_mm"]
    base = base_harness(given, tmp_path)
    keep = tmp_path / "cand.so"
    shutil.copyfile(matmul_libs["fast"], keep)
    winner = built(keep, "kp_matmul", label="fast")
    pair = pair_harness(base, winner, tmp_path / "pair")
    assert pair.binary(pair.opt) == keep.read_bytes()
    assert pair.binary(pair.ref) == base.binary(base.ref)
    assert pair.spec.policy and pair.spec.measure == base.spec.measure
    again = pair_harness(base, winner, tmp_path / "pair")  # made again, not refused
    assert again.spec == pair.spec
