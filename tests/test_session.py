"""Evaluation sessions (host backend): one placement, many candidates — honest, wrong,
crashing, hanging — each judged as ``kpair run`` judges it, every attempt recorded; and the
JSON-lines protocol for external agents."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from conftest import CSRC, record_matmul
from kpair.harness import create_harness
from kpair.pipeline import RunOptions
from kpair.session import Session, read_attempts
from kpair.toolchain import compile_shared

# A generous timeout: a busy CI machine must not turn a slow pass into a Timeout. The test
# of a hanging candidate sets its own.
QUICK = RunOptions(time_cap_s=0.5, min_blocks=4, max_blocks=16, timeout_s=120, seed=5,
                   device_options={"flush_bytes": 1 << 20})


@pytest.fixture(scope="module")
def kit(tmp_path_factory, matmul_libs):
    d = tmp_path_factory.mktemp("session")
    libs = dict(matmul_libs)
    libs["crash"] = compile_shared(CSRC / "faulty.c", d / "crash.so", flags=("-O0",),
                                   defines={"KP_FAULT": 1})
    libs["hang"] = compile_shared(CSRC / "faulty.c", d / "hang.so", flags=("-O0",),
                                  defines={"KP_FAULT": 2})
    libs["flood"] = compile_shared(CSRC / "hostile.c", d / "flood.so",
                                   defines={"KP_HOSTILE": 3})
    snap = record_matmul(matmul_libs["naive"], d / "snap", n=48)
    harness = create_harness(snap, d / "h", opt=matmul_libs["fast"]).root
    return libs, harness, d


def test_a_session_judges_candidates_in_turn_and_survives_crashes_and_hangs(kit, tmp_path):
    libs, harness, _ = kit
    order = ["fast", "offbyone", "crash", "fast", "hang", "naive"]
    with Session(harness, replace(QUICK, timeout_s=20), out=tmp_path / "ev") as s:
        results = [s.evaluate(libs[name], strategy="test", params={"name": name})
                   for name in order]
        started = s.workers_started
    status = [r.status for r in results]
    assert status == ["pass", "fail", "error", "pass", "error", "pass"], \
        [r.summary() for r in results]
    assert "SIGSEGV" in results[2].error.message and results[4].error.type == "Timeout"
    assert results[1].correctness.failed_check == "poisoned_outputs"
    assert started == 3  # the first, then one after the crash and one after the hang
    attempts = read_attempts(tmp_path / "ev" / "attempts.jsonl")
    assert [a.status for a in attempts] == status
    assert [a.params["name"] for a in attempts] == order
    assert attempts[0].speedup and attempts[0].ci95 and attempts[0].strategy == "test"
    assert attempts[1].failed_check == "poisoned_outputs" and attempts[1].reason
    assert len({a.candidate_sha256 for a in attempts}) == 5
    for a in attempts:  # each result written, and it is the session's own verdict
        saved = json.loads((tmp_path / "ev" / a.result).read_text())
        assert saved["status"] == a.status


def test_setup_runs_once_for_a_series_of_candidates(kit, tmp_path):
    libs, harness, _ = kit
    with Session(harness, QUICK, out=tmp_path / "ev") as s:
        for _ in range(3):
            assert s.evaluate(libs["fast"]).status == "pass"
        assert s.workers_started == 1
    stage_s = json.loads((tmp_path / "ev" / "results" / "0003" / "result.json").read_text())[
        "stage_s"]
    assert {"verify", "place", "ref", "opt", "measure"} <= set(stage_s)


def test_jsonl_protocol_answers_every_line_with_json(kit, tmp_path):
    libs, harness, _ = kit
    lines = [json.dumps({"binary": str(libs["fast"]), "label": "a", "strategy": "s"}),
             "this is not json",
             json.dumps({"binary": str(libs["flood"]), "label": "flood"}),
             json.dumps({"binary": str(libs["fast"]), "run": "rm -rf /"}),
             json.dumps({"binary": str(tmp_path / "missing.so")}),
             json.dumps({"binary": str(libs["offbyone"])})]
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from kpair.cli import main; sys.exit(main())",
         "evaluate", str(harness), "--jsonl", "-o", str(tmp_path / "ev"), "--time-cap", "0.5",
         "--min-blocks", "4", "--max-blocks", "16", "--timeout", "60"],
        input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=600)
    out = [json.loads(line) for line in proc.stdout.splitlines()]  # every line is JSON
    assert len(out) == 6, proc.stdout + proc.stderr
    assert out[0]["status"] == "pass" and out[0]["label"] == "a"
    assert "not JSON" in out[1]["error"]
    assert out[2]["status"] == "fail" and out[2]["label"] == "flood"
    assert "unknown field 'run'" in out[3]["error"]
    assert "no such file" in out[4]["error"]
    assert out[5]["status"] == "fail" and out[5]["failed_check"]
    assert "99.000x" not in proc.stdout
    assert len(read_attempts(tmp_path / "ev" / "attempts.jsonl")) == 3


def test_replay_says_whether_a_snapshot_reproduces(kit, tmp_path, capsys):
    from kpair.cli import main as kpair

    libs, harness, d = kit
    assert kpair(["replay", str(d / "snap"), "--runs", "3", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["status"] == "byte-exact" and rep["runs"] == 3 and rep["replay"]["mode"]
    # Nondeterministic: the adversarial kernel that flips a bit on every second call.
    nondet = compile_shared(CSRC / "adversarial.c", tmp_path / "nd.so", flags=("-O2",),
                            defines={"KP_CHEAT": 7})
    snap = record_matmul(nondet, tmp_path / "nd", n=16)
    assert kpair(["replay", str(snap), "--runs", "4"]) == 1
    assert capsys.readouterr().out.startswith("nondeterministic: kp_matmul (4 runs")
    # A snapshot whose code object no longer matches its sha256: a bad input file (exit 3,
    # as in inspect and pair), found before a worker starts, naming the blob.
    from kpair.snapshot import Snapshot

    bad = record_matmul(libs["naive"], tmp_path / "bad", n=16)
    (bad / Snapshot.open(bad).manifest.code.blob.path).write_bytes(b"")
    assert kpair(["replay", str(bad)]) == 3
    assert "code_object.blob" in capsys.readouterr().err


def test_kpair_run_and_a_session_judge_the_rowsum_harness_alike(tmp_path):
    """The harness of tests/test_trust.py whose ref aborts on a permuted rowptr: ``kpair run``
    and a session (so ``kpair evaluate``) go through the same setup/retry rule and give the
    same verdict — differential dropped, with the same warning."""
    from conftest import record_rowsum
    from kpair.isolation import run_isolated

    lib, snap = record_rowsum(tmp_path)
    h = create_harness(snap, tmp_path / "h", opt=lib).root
    ran = run_isolated(h, QUICK)
    with Session(h, QUICK, out=tmp_path / "ev") as s:
        judged = s.evaluate(lib)
        again = s.evaluate(lib)
    for r in (ran, judged, again):
        assert r.status == "pass", r.summary()
        assert r.trust["differential"].ran is False
        assert r.correctness.failed_check is None
    assert ran.warnings == judged.warnings == again.warnings
    assert any(w.startswith("differential: dropped, ref itself failed on a mutated input")
               and "SIGABRT" in w for w in judged.warnings), judged.warnings
    assert [a.status for a in read_attempts(tmp_path / "ev" / "attempts.jsonl")] == \
        ["pass", "pass"]
