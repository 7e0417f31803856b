"""The release tournament (``kpair.release.tournament``) on host ranges: ref = matmul, bias,
ReLU (tests/csrc/range_ops.c, conftest.MlpRanges); entrants recorded in this process
over the same arrays, each bound by ``--opt-capture``: the fused function (correct, faster),
the three calls done twice (correct, slower), and ranges that leave out the bias or the ReLU
(wrong). Every entrant goes through the same pair + run; the release gets the winner with its
producer, or an exclusion with its reason; the report's producer geomeans are recomputed here
from the index rows."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from conftest import MlpRanges
from kpair.errors import UsageError
from kpair.options import RunOptions
from kpair.release import load_index
from kpair.release.index import EntrantRow
from kpair.release.tournament import (
    RUN_FILE,
    TOURNAMENT_FILE,
    Contest,
    Entrant,
    RunLog,
    TournamentRecord,
    choose,
    decided,
    exclusion_of,
    inductor_best,
    run_contests,
)
from kpair.report import JSON_NAME, producer_summary, write_report

N = 256
OPTIONS = RunOptions(time_cap_s=3.0, timeout_s=300)


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("tournament")
    m = MlpRanges(MlpRanges.build(d), N, seed=7)
    ref = m.ref(d / "ref")
    fused = m.candidate(d / "fused", m.fused, scratch=True)
    np.testing.assert_array_equal(m.x["out"], m.x["out2"])   # both really ran
    twice = m.candidate(d / "twice", m.three + m.three)
    no_bias = m.candidate(d / "no_bias", [m.three[0], m.three[2]])
    no_relu = m.candidate(d / "no_relu", m.three[:2])
    return {"dir": d, "ref": ref, "fused": fused, "twice": twice, "no_bias": no_bias,
            "no_relu": no_relu}


@pytest.fixture(scope="module")
def release(lab) -> dict:
    """One run of two contests into a new release: three entrants (slower correct, wrong,
    faster correct), and two entrants that are both wrong."""
    root = lab["dir"] / "release"
    prov = {}
    for who, speedup in (("search", 1.7), ("inductor", 9.9)):
        prov[who] = lab["dir"] / f"prov-{who}"
        prov[who].mkdir()
        (prov[who] / "director_validation.json").write_text(json.dumps({"speedup": speedup}))
    mixed = Contest(2, "76_Gemm_Add_ReLU", lab["ref"], [
        Entrant("inductor-default", lab["twice"], provenance=prov["inductor"]),
        Entrant("max-autotune", lab["no_bias"]),
        Entrant("kpair-search", lab["fused"], note="the fused function",
                provenance=prov["search"])])
    wrong = Contest(2, "77_All_Wrong", lab["ref"], [
        Entrant("inductor-default", lab["no_relu"]), Entrant("max-autotune", lab["no_bias"])])
    lines: list[str] = []
    # allow_slower: the winner is the best estimate among correct entrants; on a loaded
    # machine the fused candidate's interval has reached below 1.0 (test_opt_capture).
    outcomes = run_contests(root, [mixed, wrong], lab["dir"] / "work", OPTIONS,
                            allow_slower=True, log=lines.append)
    return {"root": root, "outcomes": outcomes, "lines": lines, "contests": [mixed, wrong],
            "lab": lab}


def test_the_faster_correct_entrant_is_published_naming_its_producer(release):
    root = release["root"]
    index = load_index(root)
    (row,) = index.operators
    assert row.key == (2, "76_Gemm_Add_ReLU") and row.status == "pass"
    assert row.producer == "kpair-search"
    got = {e.producer: e for e in row.entrants}
    assert [e.producer for e in row.entrants] == ["inductor-default", "max-autotune",
                                                  "kpair-search"]
    assert got["inductor-default"].status == "pass"
    assert got["max-autotune"].status == "fail"
    assert got["kpair-search"].status == "pass" and got["kpair-search"].winner
    assert got["kpair-search"].speedup > got["inductor-default"].speedup
    assert [e.winner for e in row.entrants] == [False, False, True]
    assert row.harness.speedup == got["kpair-search"].speedup   # the judged run, published
    # The published harness stands alone, with its result; provenance holds every attempt.
    assert (root / row.paths.harness / "harness.json").is_file()
    assert (root / row.paths.result).is_file()
    rec = TournamentRecord.read(root / row.paths.provenance / TOURNAMENT_FILE)
    assert rec.winner == 2 and len(rec.attempts) == 3 and rec.exclusion is None
    for a in rec.attempts:
        assert (root / row.paths.provenance / a.result).is_file()
    assert rec.attempts[2].entrant.note == "the fused function"
    # The Director figure is the winner's producer's, reference only; a loser's is not kept.
    assert row.director.speedup == 1.7 and index.summary.director_geomean_speedup == 1.7


def _valid(path: Path, name: str) -> None:
    """``path`` against docs/schemas/<name>.schema.json by a standard Draft 2020-12
    validator (the format registered in kpair.schemas under the file's name); an unknown
    field and a missing version are refused."""
    jsonschema = pytest.importorskip("jsonschema", reason="pip install -e '.[test]'")
    from kpair.schemas import FORMATS

    assert FORMATS[name][0] == path.name
    schema = json.loads((Path(__file__).resolve().parents[1] / "docs" / "schemas"
                         / f"{name}.schema.json").read_text())
    doc = json.loads(path.read_text())
    v = jsonschema.Draft202012Validator(schema)
    v.validate(doc)
    assert not v.is_valid({**doc, "surprise": 1})
    assert not v.is_valid({k: x for k, x in doc.items() if k != "schema_version"})


def test_the_files_written_validate_against_their_schemas(release):
    """tournament.json of every contest (a winner, an exclusion) and tournament_run.json."""
    root = release["root"]
    index = load_index(root)
    rows = [*index.operators, *index.refused]
    assert len(rows) == 2
    for row in rows:
        _valid(root / row.paths.provenance / TOURNAMENT_FILE, "tournament")
    _valid(root / RUN_FILE, "tournament_run")


def test_the_html_report_has_the_producers(release):
    pytest.importorskip("matplotlib")
    from kpair.report import render_html

    page = render_html(load_index(release["root"]), RunLog.load(release["root"]))
    assert "Producers side by side" in page and "wrong-under-every-candidate" in page


def test_an_operator_wrong_under_every_candidate_is_excluded(release):
    index = load_index(release["root"])
    (row,) = index.refused
    assert row.key == (2, "77_All_Wrong") and row.status == "fail"
    assert row.exclusion == "wrong-under-every-candidate" and row.refused_by == "optimizer"
    assert row.producer is None
    assert [e.status for e in row.entrants] == ["fail", "fail"]
    assert "inductor-default: fail" in row.reason and "max-autotune: fail" in row.reason
    (ex,) = index.summary.excluded
    assert (ex.name, ex.exclusion) == ("77_All_Wrong", "wrong-under-every-candidate")
    rec = TournamentRecord.read(release["root"] / row.paths.provenance / TOURNAMENT_FILE)
    assert rec.winner is None and rec.exclusion == "wrong-under-every-candidate"


def test_a_second_run_skips_decided_operators_and_logs_each_call(release, tmp_path):
    root = release["root"]
    before = (root / "index.json").read_bytes()
    again = run_contests(root, release["contests"], tmp_path / "w", OPTIONS)
    assert again == [] and (root / "index.json").read_bytes() == before
    assert decided(root) == {(2, "76_Gemm_Add_ReLU"), (2, "77_All_Wrong")}
    log = RunLog.load(root)
    assert [c.skipped for c in log.calls] == [0, 2]
    assert log.calls[0].decided == ["level2/76_Gemm_Add_ReLU", "level2/77_All_Wrong"]
    assert log.wall_s == pytest.approx(sum(c.wall_s for c in log.calls), abs=0.01)


def test_report_sets_producers_side_by_side_from_the_rows(release):
    root = release["root"]
    written = write_report(root, html_page=False)
    doc = json.loads(written["json"].read_text())
    assert written["json"].name == JSON_NAME
    index = load_index(root)
    want = producer_summary(index, RunLog.load(root))
    assert doc["producers"] == json.loads(json.dumps(want))
    # Recomputed from the index: the published rows' speedups, Inductor's best per row.
    rows = [r for r in index.operators if r.status == "pass"]
    winner = math.exp(sum(math.log(r.harness.speedup) for r in rows) / len(rows))
    best = [inductor_best(r.entrants) for r in rows]
    inductor = math.exp(sum(math.log(b.speedup) for b in best) / len(best))
    s = doc["producers"]["summary"]
    assert s["winner_vs_eager"]["geomean"] == pytest.approx(winner, rel=1e-12)
    assert s["inductor_best_vs_eager"]["geomean"] == pytest.approx(inductor, rel=1e-12)
    assert s["winner_vs_inductor_best"]["geomean"] == pytest.approx(winner / inductor,
                                                                    rel=1e-12)
    lo = math.exp(sum(math.log(r.harness.reported_ci95[0] / b.ci95[1])
                      for r, b in zip(rows, best, strict=True)) / len(rows))
    assert s["winner_vs_inductor_best"]["interval"][0] == pytest.approx(lo, rel=1e-12)
    assert s["winner_vs_eager"]["operators"] == 1 and s["published"] == 1
    assert s["wall_s"] == RunLog.load(root).wall_s
    per = {p["operator"]: p for p in doc["producers"]["operators"]}
    mixed = per["level2/76_Gemm_Add_ReLU"]
    assert mixed["winner"] == "kpair-search"
    assert mixed["producers"]["max-autotune"]["status"] == "fail"
    assert mixed["producers"]["kpair-search"]["speedup"] == rows[0].harness.speedup
    md = written["markdown"].read_text()
    assert "## Producers side by side" in md and "kpair-search" in md
    assert "wrong-under-every-candidate" in md


def test_choose_takes_the_largest_faster_estimate_ties_to_the_earlier():
    def row(p, status="pass", s=None, lo=None, hi=None):
        return EntrantRow(producer=p, candidate="c", status=status, speedup=s,
                          ci95=(lo, hi) if lo else None,
                          faster=None if s is None else lo > 1.0)

    rows = [row("inductor-default", s=1.5, lo=1.2, hi=1.8), row("max-autotune", s=1.5, lo=1.1,
                                                              hi=1.9),
            row("coordinate-descent", s=1.9, lo=0.9, hi=2.9),   # best estimate, not faster
            row("kpair-search", "fail")]
    assert choose(rows) == 0
    assert choose(rows[2:]) is None
    reason, detail = exclusion_of(rows[2:])
    assert reason == "no-candidate-faster" and "coordinate-descent, is 1.900x" in detail
    assert exclusion_of([row("plan", "refused")])[0] == "capture-failed"
    assert exclusion_of([row("plan", "refused"), row("retune", "fail")])[0] == \
        "wrong-under-every-candidate"
    assert exclusion_of([])[0] == "capture-failed"
    # Inductor's best is the best correct estimate, faster or not; a tie goes to the earlier.
    assert inductor_best(rows).producer == "coordinate-descent"
    assert inductor_best(rows[:2]).producer == "inductor-default"


def test_a_contest_decided_before_judging_is_excluded_with_its_reason(tmp_path):
    c = Contest(1, "3_Too_Big", None, excluded=("did-not-fit", "needs 80 GiB"))
    (out,) = run_contests(tmp_path / "rel", [c], tmp_path / "w")
    assert out.exclusion == "did-not-fit"
    (row,) = load_index(tmp_path / "rel").refused
    assert (row.exclusion, row.reason, row.status) == ("did-not-fit", "needs 80 GiB", "error")
    with pytest.raises(UsageError, match="not one of"):
        Contest(1, "x", None, excluded=("too-slow", ""))
    with pytest.raises(UsageError, match="producer"):
        Entrant("someone", tmp_path)


def test_an_entrant_whose_pair_is_refused_is_recorded_and_the_others_go_on(lab, tmp_path):
    c = Contest(1, "9_Refused", lab["ref"], [
        Entrant("plan", tmp_path / "no.plan.json", kind="plan"),
        Entrant("retune", lab["no_relu"])])
    (out,) = run_contests(tmp_path / "rel", [c], tmp_path / "w", OPTIONS)
    first, second = (j.row for j in out.judged)
    assert first.status == "refused" and first.reason.startswith("pair refused: ")
    assert "no.plan.json" in first.reason and first.speedup is None
    assert second.status == "fail"
    assert out.exclusion == "wrong-under-every-candidate"
    (row,) = load_index(tmp_path / "rel").refused
    rec = TournamentRecord.read(tmp_path / "rel" / row.paths.provenance / TOURNAMENT_FILE)
    assert rec.attempts[0].result is None and rec.attempts[1].result is not None
    _valid(tmp_path / "rel" / row.paths.provenance / TOURNAMENT_FILE, "tournament")


def test_a_dispatch_ref_takes_same_layout_opts(matmul_snapshot, matmul_libs, tmp_path):
    """A single-dispatch ref (one recorded kp_matmul) with same-layout code objects as
    entrants: the loop-reordered build (a retune) against a wrong one."""
    c = Contest(1, "1_Square_matrix_multiplication_", matmul_snapshot, [
        Entrant("retune", matmul_libs["offbyone"], kind="opt"),
        Entrant("retune", matmul_libs["fast"], kind="opt", note="loop order i-k-j")])
    (out,) = run_contests(tmp_path / "rel", [c], tmp_path / "w", OPTIONS, allow_slower=True)
    assert [j.row.status for j in out.judged] == ["fail", "pass"] and out.winner == 1
    (row,) = load_index(tmp_path / "rel").operators
    assert row.producer == "retune" and row.range is None and row.plan_launches is None
    assert row.kernels.opt == "kp_matmul"


def test_kpair_verify_keeps_the_tournament_fields(release, tmp_path):
    import shutil

    from kpair.release import verify_release

    root = tmp_path / "copy"
    shutil.copytree(release["root"], root)
    before = load_index(root)
    index = verify_release(root, OPTIONS)
    (row,) = index.operators
    (old,) = before.operators
    assert (row.producer, row.entrants, row.harness) == (old.producer, old.entrants,
                                                         old.harness)
    assert len(row.verifications) == 1 and row.verifications[0].verdict == "pass"
    assert index.refused == before.refused   # the exclusions are carried over as they were
