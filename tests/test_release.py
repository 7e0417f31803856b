"""Releases: index math, incremental add (refusals, --replace, atomicity), isolated verify."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import msgspec
import pytest

from conftest import CSRC
from fake_release import fake_row
from kpair import release
from kpair.cli import main as kpair
from kpair.errors import FormatError, UsageError
from kpair.formats import encode
from kpair.harness import create_harness
from kpair.pipeline import RunOptions
from kpair.result import Result
from kpair.snapshot import Snapshot
from kpair.toolchain import compile_shared

#: Enough blocks for a verdict, short enough for a test.
# One ABBA run, not replicates: these tests are about the release's files, and a 0.3 s budget
# split four ways leaves each replicate one round (the re-run interval is tested in
# tests/test_measure.py and benchmarks/reproduce.py).
QUICK = RunOptions(time_cap_s=0.3, min_blocks=8, timeout_s=60, replicates=1)
QUICK_ARGS = ["--time-cap", "0.3", "--min-blocks", "8", "--timeout", "60", "--replicates", "1"]


# --------------------------------------------------------------------------- index math


def test_summary_geomean_is_exp_mean_log_over_passing_only():
    rows = [fake_row(1, "1_a", 2.0, slot_bias=0.995, director=3.0),
            fake_row(1, "2_b", 8.0, slot_bias=1.004, director=12.0, mode="tolerance"),
            fake_row(2, "3_c", 0.5, slot_bias=1.02),
            fake_row(1, "4_bad", status="fail", director=100.0),
            fake_row(2, "5_crash", status="error", director=100.0)]
    refused = [fake_row(1, "6_wrong", status="fail")]
    s = release.summarize(rows, refused)
    assert s.harness_geomean_speedup == pytest.approx(
        math.exp((math.log(2) + math.log(8) + math.log(0.5)) / 3))  # = 2**(1/3)
    assert s.harness_geomean_over == 3
    # Director numbers of failing operators stay out too, even when they look great.
    assert s.director_geomean_speedup == pytest.approx(6.0) and s.director_geomean_over == 2
    assert s.slot_bias_range == (0.995, 1.02)
    assert s.slot_bias_outside_band == ["level2/3_c"]
    c = s.counts
    assert (c.published, c.passed, c.fail, c.error, c.refused, c.excluded) == \
        (5, 3, 1, 1, 1, 3)
    assert (c.byte_exact, c.tolerance) == (2, 1)
    assert c.by_level == {"level1": 2, "level2": 1}
    assert {(e.name, e.where) for e in s.excluded} == {
        ("4_bad", "published, fails verification"), ("5_crash", "published, fails verification"),
        ("6_wrong", "refused by release add")}


def test_summary_compares_kpairs_choice_with_each_baseline_mode():
    from kpair.release.index import Baseline

    def cd(x, lo=None):
        return Baseline(mode="coordinate-descent", speedup=x, ci95=(lo or x * 0.99, x * 1.01))

    rows = [fake_row(2, "1_a", 1.30).replace(baselines=[cd(1.20), Baseline(
                mode="max-autotune", speedup=1.0, same_as_ref=True)]),
            fake_row(2, "2_b", 1.05).replace(baselines=[cd(1.10, lo=1.09)]),
            fake_row(2, "3_c", 1.10).replace(baselines=[Baseline(
                mode="coordinate-descent", reason="no kernel with this source")])]
    # No winner: kpair keeps ref (1.0), Inductor's choice was slower than ref.
    refused = [fake_row(2, "4_d", status="fail").replace(refused_by="optimizer",
                                                         baselines=[cd(0.95)])]
    s = release.summarize(rows, refused)
    by = {b.mode: b for b in s.baselines}
    c = by["coordinate-descent"]
    assert c.operators == 3                      # 3_c has no number
    assert c.geomean_over_baseline == pytest.approx((1.3 / 1.2 * 1.05 / 1.1 / 0.95) ** (1 / 3))
    assert c.at_least == 2                       # 2_b is slower than Inductor's choice
    assert c.not_slower == 2                     # ... beyond the intervals (1.071 < 1.09)
    m = by["max-autotune"]
    assert (m.operators, m.at_least, m.geomean_over_baseline) == (1, 1, pytest.approx(1.3))


def test_summary_of_nothing_passing_has_no_geomean():
    s = release.summarize([fake_row(1, "a", status="fail")], [])
    assert s.harness_geomean_speedup is None and s.director_geomean_speedup is None
    assert s.slot_bias_range is None


def test_index_sorts_by_level_then_problem_number(tmp_path):
    idx = release.build_index([fake_row(2, "1_x", 1.1), fake_row(1, "10_y", 1.2),
                               fake_row(1, "2_z", 1.3)], [])
    assert [(r.level, r.name) for r in idx.operators] == [
        (1, "2_z"), (1, "10_y"), (2, "1_x")]
    idx.write(tmp_path / "index.json")
    assert release.load_index(tmp_path) == idx


def test_an_index_written_by_kpair_0_1_reads_and_writes_back_unchanged(tmp_path):
    """tests/data/release_index_v1.json: `kpair demo` of the commit before the typed index."""
    fixture = Path(__file__).parent / "data" / "release_index_v1.json"
    idx = release.Index.read(fixture)
    assert [r.name for r in idx.operators] == ["1_Square_matrix_multiplication_",
                                               "23_Softmax", "37_FrobeniusNorm_",
                                               "76_Gemm_Add_ReLU"]
    assert idx.refused[0].name == "21_Sigmoid" and idx.refused[0].harness is None
    assert idx.operators[1].correctness.tolerances[0].threshold == {"min_cosine": 0.9999}
    # Read as v4: the same publication, not verified yet, no ref identity recorded.
    v1 = json.loads(fixture.read_text())
    assert json.loads(encode(idx)) == {**v1, "schema_version": 4, "verifications": []}
    assert all(r.ref_identity is None and r.verifications == [] for r in idx.operators)
    # Its summary is what today's arithmetic makes of its rows (a geomean to the last ulp or
    # so: kpair 0.1 took numpy's log and mean, whose bits vary with the CPU and version).
    got, want = release.summarize(idx.operators, idx.refused), idx.summary
    assert got.harness_geomean_speedup == pytest.approx(want.harness_geomean_speedup, rel=1e-14)
    assert got.director_geomean_speedup == pytest.approx(want.director_geomean_speedup, rel=1e-14)
    assert got.replace(harness_geomean_speedup=want.harness_geomean_speedup,
                       director_geomean_speedup=want.director_geomean_speedup) == want


def test_a_v1_index_is_read_by_the_v1_rules(tmp_path):
    """A v1 file may not hold what only v2 defines; a version neither reads is refused."""
    v1 = json.loads((Path(__file__).parent / "data" / "release_index_v1.json").read_text())
    (tmp_path / "index.json").write_text(json.dumps({**v1, "verifications": []}))
    with pytest.raises(FormatError) as e:
        release.load_index(tmp_path)
    assert e.value.field == "verifications"
    v1["operators"][0]["verifications"] = []
    (tmp_path / "index.json").write_text(json.dumps(v1))
    assert release.load_index(tmp_path).operators[0].verifications == []
    v1["operators"][0]["ref_identity"] = _identity().to_json()
    (tmp_path / "index.json").write_text(json.dumps(v1))
    with pytest.raises(FormatError) as e:
        release.load_index(tmp_path)
    assert e.value.field == "operators[0].ref_identity"
    (tmp_path / "index.json").write_text(json.dumps({**v1, "schema_version": 5}))
    with pytest.raises(FormatError, match="reads 1, 2, 3 and 4") as e:
        release.load_index(tmp_path)
    assert e.value.field == "schema_version"


@pytest.mark.parametrize("mutate, field", [
    (lambda i: i.update(schema="other"), "schema"),
    (lambda i: i.update(schema_version=5), "schema_version"),
    (lambda i: i.update(schema_version=1), "verifications"),  # v1 has no verifications
    (lambda i: i["verifications"].append({"run": 1}), "verifications[0].when"),
    (lambda i: i.update(operators={}), "operators"),
    (lambda i: i["operators"][0].update(status="maybe"), "operators[0].status"),
    (lambda i: i["operators"][0].update(name="../escape"), "operators[0]"),
    (lambda i: i["operators"][0].update(level=0), "operators[0].level"),
    (lambda i: i["operators"][0].update(status="fail"), "operators[0]"),  # a fail with a speed
    (lambda i: i["operators"][0]["harness"].pop("ci95"), "operators[0].harness.ci95"),
    (lambda i: i["operators"][0]["correctness"].update(mode="close"),
     "operators[0].correctness.mode"),
    (lambda i: i["operators"][0].update(extra=1), "operators[0].extra"),
    (lambda i: i["summary"]["counts"].pop("pass"), "summary.counts.pass"),
    (lambda i: i.pop("summary"), "summary"),
])
def test_load_index_names_the_bad_field(tmp_path, mutate, field):
    idx = release.build_index([fake_row(1, "a", 1.5)], []).to_json()
    mutate(idx)
    (tmp_path / "index.json").write_text(json.dumps(idx))
    with pytest.raises(FormatError) as e:
        release.load_index(tmp_path)
    assert e.value.field == field


def test_a_v2_index_reads_as_v3_without_region_and_stored_bytes(tmp_path):
    idx = release.build_index([fake_row(1, "a", 1.5)], []).to_json()
    v2 = {**idx, "schema_version": 2}
    (tmp_path / "index.json").write_text(json.dumps(v2))
    got = release.load_index(tmp_path)
    assert got.schema_version == 4 and got.operators[0].region_bytes is None
    assert json.loads(encode(got)) == idx
    v2["operators"][0]["stored_bytes"] = 10  # a v3 field in a v2 file
    (tmp_path / "index.json").write_text(json.dumps(v2))
    with pytest.raises(FormatError) as e:
        release.load_index(tmp_path)
    assert e.value.field == "operators[0].stored_bytes"


def test_index_is_the_registered_format_with_a_json_schema():
    from kpair.formats import json_schema
    from kpair.schemas import FORMATS, load_format

    assert FORMATS["index"][0] == release.INDEX and load_format("index") is release.Index
    schema = json_schema(release.Index)
    row = schema["$defs"]["Row"]
    assert row["additionalProperties"] is False and "harness" in row["required"]


def test_operator_names_must_be_safe_directories():
    for bad in ("", ".hidden", "-x", "a/b", "..", "a b"):
        with pytest.raises(UsageError):
            release.check_key(1, bad)
    with pytest.raises(UsageError):
        release.check_key(0, "ok")
    assert release.check_key(2, "37_FrobeniusNorm_") == (2, "37_FrobeniusNorm_")


def test_malformed_director_file_is_a_row_problem_not_a_crash(tmp_path):
    (tmp_path / "director_validation.json").write_text('{"speedup": "fast"}')
    d = release.read_director(tmp_path, "x/director_validation.json")
    assert d.speedup is None and "speedup" in d.error and d.reference_only is True
    (tmp_path / "director_validation.json").write_text('{"speedup": 1.51}')
    assert release.read_director(tmp_path, "x").speedup == 1.51
    assert release.read_director(None, "x") is None


# --------------------------------------------------------------------------- harnesses


@pytest.fixture(scope="module")
def harnesses(matmul_libs, matmul_snapshot, tmp_path_factory) -> dict[str, Path]:
    """Pairs on one recorded kp_matmul call: honest, wrong, crashing and hanging opts."""
    d = tmp_path_factory.mktemp("pairs")
    faults = {name: compile_shared(CSRC / "faulty.c", d / f"{name}.so", defines={"KP_FAULT": v})
              for name, v in (("crash", 1), ("hang", 2))}
    opts = {"fast": matmul_libs["fast"], "offbyone": matmul_libs["offbyone"], **faults}
    pairs = {name: create_harness(matmul_snapshot, d / name, opt=lib).root
             for name, lib in opts.items()}
    # Correct (the same additions in the same order) but slower: the fast build as ref.
    pairs["slower"] = create_harness(matmul_snapshot, d / "slower", ref=matmul_libs["fast"],
                                     opt=matmul_libs["naive"]).root
    return pairs


def _provenance(tmp_path: Path, speedup: float) -> Path:
    p = tmp_path / f"prov-{speedup}"
    p.mkdir()
    (p / "director_validation.json").write_text(json.dumps({"speedup": speedup}))
    (p / "attempts.jsonl").write_text('{"attempt": 0}\n')
    return p


def test_add_publishes_a_passing_pair_with_provenance(harnesses, tmp_path):
    root = tmp_path / "rel"
    code = kpair(["release", "add", str(root), str(harnesses["fast"]), "--level", "1",
                  "--name", "1_Square_matrix_multiplication_",
                  "--provenance", str(_provenance(tmp_path, 1.7)), "--allow-slower",
                  *QUICK_ARGS])  # the files are tested, not the gain (load may blur it)
    assert code == 0
    op = root / "level1" / "1_Square_matrix_multiplication_"
    assert (op / "harness" / "harness.json").is_file()
    assert (op / "harness" / "result.json").is_file()
    assert (op / "provenance" / "attempts.jsonl").is_file()
    idx = release.load_index(root)
    (row,) = idx.operators
    assert row.status == "pass" and row.correctness.mode == "byte-exact"
    assert row.director.speedup == 1.7 and row.director.reference_only is True
    assert row.paths.harness == "level1/1_Square_matrix_multiplication_/harness"
    assert idx.summary.harness_geomean_speedup == pytest.approx(row.harness.speedup)
    snap = Snapshot.open(op / "harness" / "capture")  # the harness's own bytes, counted
    assert row.region_bytes == snap.region_bytes() > 0
    assert row.stored_bytes == snap.stored_bytes() == sum(
        p.stat().st_size for p in (op / "harness" / "capture" / "blobs").iterdir())
    result = Result.read(op / "harness" / "result.json")
    assert result.harness == str((op / "harness").resolve())
    assert not [p for p in root.iterdir() if p.name.startswith(".add-")]  # staging cleaned


def test_add_refuses_a_failing_pair_and_records_the_exclusion(harnesses, tmp_path, capsys):
    root = tmp_path / "rel"
    code = kpair(["release", "add", str(root), str(harnesses["offbyone"]), "--level", "1",
                  "--name", "1_wrong", "--provenance", str(_provenance(tmp_path, 9.9)),
                  *QUICK_ARGS])
    assert code == 1
    assert "refused level1/1_wrong" in capsys.readouterr().out
    assert not (root / "level1" / "1_wrong").exists()
    kept = root / "excluded" / "level1" / "1_wrong"
    assert Result.read(kept / "result.json").status == "fail"
    assert (kept / "provenance" / "director_validation.json").is_file()
    idx = release.load_index(root)
    assert idx.operators == []
    (row,) = idx.refused
    assert row.status == "fail" and row.reason.startswith("FAIL") and row.harness is None
    assert idx.summary.excluded[0].where == "refused by release add"
    assert idx.summary.harness_geomean_speedup is None
    assert idx.summary.director_geomean_speedup is None  # its 9.9x stays out


def test_add_refuses_a_correct_opt_that_is_not_faster(harnesses, tmp_path, capsys):
    root = tmp_path / "rel"
    args = ["release", "add", str(root), str(harnesses["slower"]), "--level", "1", "--name",
            "1_slow", *QUICK_ARGS]
    assert kpair(args) == 1
    assert "refused level1/1_slow" in capsys.readouterr().out
    assert not (root / "level1" / "1_slow").exists()
    assert Result.read(root / "excluded" / "level1" / "1_slow" / "result.json").status == "pass"
    idx = release.load_index(root)
    (row,) = idx.refused
    assert row.status == "pass" and row.harness.ci95[0] <= 1.0
    assert row.reason.startswith("not faster") and "--allow-slower" in row.reason
    assert row.paths.harness is None
    assert idx.operators == [] and idx.summary.harness_geomean_speedup is None
    (excluded,) = idx.summary.excluded
    assert excluded.where == "refused by release add" and excluded.reason == row.reason
    # --allow-slower publishes it, and the refused row gives way to the published one.
    assert kpair([*args, "--allow-slower"]) == 0
    idx = release.load_index(root)
    assert [r.name for r in idx.operators] == ["1_slow"] and idx.refused == []
    assert idx.operators[0].reason is None


def test_not_faster_needs_the_whole_interval_above_one():
    speed = fake_row(1, "a", 1.2).harness
    assert release.not_faster(speed) is None
    for ci in ((0.9, 1.3), (1.0, 1.1), (0.5, 0.9)):
        assert "not faster" in release.not_faster(msgspec.structs.replace(speed, ci95=ci))


def test_writers_sweep_staging_left_by_dead_processes(harnesses, tmp_path):
    root = tmp_path / "rel"
    root.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = root / f".add-{dead.pid}-x1y2"
    live = root / f".add-{os.getpid()}-a3b4"
    unrelated = root / ".add-notapid"
    for d in (stale, live, unrelated):
        (d / "op").mkdir(parents=True)
    release.add_operator(root, harnesses["fast"], level=1, name="1_mm", options=QUICK)
    assert not stale.exists() and live.exists() and unrelated.exists()
    stale.mkdir()
    release.verify_release(root, QUICK)
    assert not stale.exists() and live.exists()


def test_add_never_replaces_without_replace(harnesses, tmp_path, capsys):
    root = tmp_path / "rel"
    args = ["release", "add", str(root), str(harnesses["fast"]), "--level", "1", "--name",
            "1_mm", "--allow-slower", *QUICK_ARGS]   # replacing is tested, not the gain
    assert kpair(args) == 0
    before = (root / "index.json").read_text()
    capsys.readouterr()
    assert kpair(args) == 2
    assert "--replace" in capsys.readouterr().err
    assert (root / "index.json").read_text() == before
    assert kpair([*args, "--replace"]) == 0
    assert len(release.load_index(root).operators) == 1


def test_refused_replacement_keeps_the_published_operator(harnesses, tmp_path):
    root = tmp_path / "rel"
    release.add_operator(root, harnesses["fast"], level=1, name="1_mm", options=QUICK,
                         allow_slower=True)   # what a refused replacement keeps is tested
    out = release.add_operator(root, harnesses["offbyone"], level=1, name="1_mm", replace=True,
                               options=QUICK)
    assert not out.added and out.exit_code == 1
    idx = release.load_index(root)
    assert [r.status for r in idx.operators] == ["pass"]
    assert [r.status for r in idx.refused] == ["fail"]
    assert (root / "level1" / "1_mm" / "harness" / "opt.so").read_bytes() == \
        (harnesses["fast"] / "opt.so").read_bytes()


@pytest.mark.parametrize(("replace", "pair"), [(False, "fast"), (True, "fast"),
                                               (False, "offbyone")])
def test_interrupted_add_leaves_the_old_index_and_tree(harnesses, tmp_path, monkeypatch,
                                                       replace, pair):
    """Published (fast) or refused (offbyone: its exclusion is written under excluded/),
    an add interrupted before its index lands leaves the tree as it was."""
    root = tmp_path / "rel"
    # allow_slower: the interruption is tested, not the gain (a busy machine may blur it)
    release.add_operator(root, harnesses["fast"], level=1, name="1_mm", options=QUICK,
                         allow_slower=True)
    before = (root / "index.json").read_bytes()
    tree_before = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                         if "result" not in p.name and "samples" not in p.name)
    real_replace = os.replace

    def dies_on_index(src, dst, *a, **k):  # the moment the new index would land
        if Path(dst).name == "index.json":
            raise KeyboardInterrupt("simulated interruption")
        return real_replace(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", dies_on_index)
    name = "1_mm" if replace else "2_other"
    with pytest.raises(KeyboardInterrupt):
        release.add_operator(root, harnesses[pair], level=1, name=name, replace=replace,
                             options=QUICK)
    monkeypatch.undo()
    assert (root / "index.json").read_bytes() == before
    idx = release.load_index(root)  # still valid
    assert [r.name for r in idx.operators] == ["1_mm"]
    assert not (root / "level1" / "2_other").exists()
    assert (root / "level1" / "1_mm" / "harness" / "harness.json").is_file()
    tree_after = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                        if "result" not in p.name and "samples" not in p.name
                        and ".index.json.tmp" not in p.name)
    assert tree_after == tree_before


def test_second_writer_is_refused_while_one_holds_the_lock(tmp_path):
    with release.locked(tmp_path), pytest.raises(UsageError, match="another kpair command"), \
            release.locked(tmp_path):
        pass


# --------------------------------------------------------------------------- verify


def test_verify_isolates_crashes_and_hangs_and_goes_on(harnesses, tmp_path, capsys):
    root = tmp_path / "rel"
    for level, name, which in ((1, "1_crash", "crash"), (1, "2_hang", "hang"),
                               (2, "3_good", "fast")):
        shutil.copytree(harnesses[which], root / f"level{level}" / name / "harness")
    (root / "level2" / "3_good" / "provenance").mkdir()
    (root / "level2" / "3_good" / "provenance" / "director_validation.json").write_text(
        '{"speedup": 2.5}')
    code = kpair(["verify", str(root), "--time-cap", "0.3", "--min-blocks", "8",
                  "--timeout", "12"])
    assert code == 5
    err = capsys.readouterr().err
    assert "[3/3] level2/3_good: PASS" in err
    rows = {r.name: r for r in release.load_index(root).operators}
    assert rows["1_crash"].status == "error"
    assert "SIGSEGV" in rows["1_crash"].reason and "stage opt" in rows["1_crash"].reason
    assert rows["2_hang"].status == "error" and "Timeout" in rows["2_hang"].reason
    assert rows["3_good"].status == "pass"
    for name in rows:
        level = rows[name].level
        assert (root / f"level{level}" / name / "harness" / "result.json").is_file()
    s = release.load_index(root).summary
    assert s.harness_geomean_over == 1 and s.director_geomean_speedup == 2.5
    assert {e.name for e in s.excluded} == {"1_crash", "2_hang"}


def test_verify_keeps_refused_rows_and_needs_operators(harnesses, tmp_path):
    root = tmp_path / "rel"
    release.add_operator(root, harnesses["offbyone"], level=1, name="9_wrong", options=QUICK)
    shutil.copytree(harnesses["fast"], root / "level1" / "1_mm" / "harness")
    idx = release.verify_release(root, QUICK)
    assert [r.name for r in idx.operators] == ["1_mm"]
    assert [r.name for r in idx.refused] == ["9_wrong"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UsageError, match="no operators"):
        release.verify_release(empty, QUICK)


# --------------------------------------------------------------------------- reproduction


def _identity(**changes):
    from kpair.release.index import RefIdentity

    return RefIdentity(sha256="ab" * 32, kernel="triton_poi_fused_0", grid=(128, 1, 1),
                       block=(256, 1, 1), dynamic_shared_bytes=0).replace(**changes)


def _rerun(status: str = "pass", speedup: float | None = None, ci=None, **identity):
    """The row a re-run's result makes (as verify builds it), without running anything."""
    row = fake_row(1, "op", speedup, status=status).replace(
        ref_identity=_identity(**identity), verified="2027-01-01T00:00:00+00:00")
    return row.replace(harness=row.harness.replace(ci95=ci)) if ci else row


def test_classify_compares_the_point_with_the_published_interval():
    from kpair.release.index import classify

    pub = (1.9, 2.1)
    assert classify(pub, "pass", 2.0, (1.95, 2.05), True) == ("reproduced", True, True)
    assert classify(pub, "pass", 2.1, (2.0, 2.2), None) == ("reproduced", True, True)  # ends in
    # Outside the published interval: not reproduced, even when the intervals overlap.
    assert classify(pub, "pass", 2.15, (2.05, 2.25), True) == ("not reproduced", False, True)
    assert classify(pub, "pass", 3.0, (2.9, 3.1), True) == ("not reproduced", False, False)
    # A failing or erroring re-run never claims reproduction; nothing is compared.
    assert classify(pub, "fail", None, None, True) == ("not reproduced", None, None)
    assert classify(pub, "error", None, None, True) == ("error", None, None)
    # Another ref is another operator, whatever its numbers say.
    assert classify(pub, "pass", 2.0, (1.95, 2.05), False) == \
        ("different operator", None, None)
    assert classify(None, "pass", 2.0, (1.95, 2.05), True) == \
        ("no published figure", None, None)


def test_ref_identity_names_what_differs():
    a = _identity()
    assert a.differences(_identity()) == []
    assert a.differences(_identity(grid=(64, 1, 1), dynamic_shared_bytes=1024)) == [
        "grid: 128x1x1 -> 64x1x1", "dynamic_shared_bytes: 0 -> 1024"]
    (code,) = a.differences(_identity(sha256="cd" * 32))
    assert code == "code sha256: abababababab -> cdcdcdcdcdcd"
    assert release.index.same_operator(a, None) is None


def test_a_verification_is_appended_and_the_publication_kept(tmp_path):
    from kpair.release.index import latest, verified_row, verify_run

    published = fake_row(1, "op", 2.0).replace(ref_identity=_identity())
    published = published.replace(harness=published.harness.replace(
        ci95=(1.98, 2.02), combined_ci95=(1.9, 2.1)))  # the verdict's interval: the combined
    once = verified_row(published, _rerun("pass", 2.08, (2.0, 2.16)), run=1)
    twice = verified_row(once, _rerun("pass", 2.5, (2.4, 2.6)), run=2)
    assert twice.replace(verifications=[]) == published  # the figures stay as published
    first, second = twice.verifications
    assert (first.run, first.outcome, first.inside, first.compatible) == \
        (1, "reproduced", True, True)
    assert first.published_ci95 == (1.9, 2.1) and first.speedup == 2.08
    assert first.same_operator is True and first.environment == "test cpu, host/x86_64"
    assert (second.run, second.outcome, second.inside, second.compatible) == \
        (2, "not reproduced", False, False)
    other = verified_row(published, _rerun("pass", 2.0, kernel="triton_poi_fused_1"), run=3)
    moved = latest(other)
    assert moved.outcome == "different operator" and moved.same_operator is False
    assert moved.differs == ["kernel: triton_poi_fused_0 -> triton_poi_fused_1"]
    broken = latest(verified_row(published, _rerun("error"), run=4))
    assert broken.outcome == "error" and broken.inside is None and broken.speedup is None
    tally = verify_run(5, "now", [first, second, moved, broken])
    assert (tally.compared, tally.reproduced, tally.not_reproduced, tally.error,
            tally.different_operator) == (3, 1, 1, 1, 1)
    assert tally.rate == pytest.approx(1 / 3)
    assert verify_run(6, "now", [moved]).rate is None
    # Written and read back by the strict reader.
    idx = release.build_index([twice, other], [], [tally])
    path = tmp_path / "index.json"
    idx.write(path)
    assert release.Index.read(path) == idx


def _fake_runner(make):
    """A verify runner that runs nothing: ``make(job)`` is the re-run's result."""
    def runner(jobs, options):
        for job in jobs:
            result = make(job)
            result.write(job.out)
            yield job, 0, result
    return runner


def _speed_like(result: Result, speedup: float, ci: tuple[float, float]) -> Result:
    s = result.speed.replace(speedup=speedup, ci95=ci,
                             combined_ci95=ci if result.speed.combined_ci95 else None)
    return result.replace(speed=s)


def test_verify_appends_a_record_per_run_and_keeps_the_published_row(harnesses, tmp_path,
                                                                     capsys):
    from kpair.result import error_result

    root = tmp_path / "rel"
    assert release.add_operator(root, harnesses["fast"], level=1, name="1_mm",
                                options=QUICK, allow_slower=True).added
    (published,) = release.load_index(root).operators
    assert published.ref_identity is not None and published.ref_identity.kernel == "kp_matmul"
    before = (root / "index.json").read_text()
    lo, hi = published.harness.reported_ci95
    publication = root / "level1" / "1_mm" / "harness" / "result.json"
    stored, stored_bytes = Result.read(publication), publication.read_bytes()

    # A real re-run, through the CLI: its outcome is the machine's; its record is certain.
    code = kpair(["verify", str(root), *QUICK_ARGS])
    assert code == 0
    out = capsys.readouterr().out
    assert "level1/1_mm: reproduced" in out or "level1/1_mm: NOT reproduced" in out
    assert "reproduced 1 of 1" in out or "reproduced 0 of 1" in out
    # The re-run has a result of its own; the publication's result.json is as published.
    assert publication.read_bytes() == stored_bytes
    record = release.load_index(root).operators[0].verifications[0]
    assert record.result == "level1/1_mm/verify/1/result.json"
    assert Result.read(root / record.result).status == record.verdict
    # Re-runs through the store's runner hook: one inside, one outside the interval.
    release.verify_release(root, QUICK, runner=_fake_runner(
        lambda job: _speed_like(stored, (lo + hi) / 2, (lo, hi))))
    index = release.verify_release(root, QUICK, runner=_fake_runner(
        lambda job: _speed_like(stored, hi * 1.5, (hi * 1.4, hi * 1.6))))
    (row,) = index.operators
    assert row.replace(verifications=[]) == published  # the published figures, untouched
    assert [v.run for v in row.verifications] == [1, 2, 3]
    real, inside, outside = row.verifications
    assert real.verdict == "pass" and real.same_operator is True
    assert real.published_ci95 == (lo, hi)
    assert (inside.outcome, inside.inside, inside.compatible) == ("reproduced", True, True)
    assert (outside.outcome, outside.inside, outside.compatible) == \
        ("not reproduced", False, False)
    assert [(r.run, r.compared, r.reproduced) for r in index.verifications][1:] == \
        [(2, 1, 1), (3, 1, 0)]
    assert release.load_index(root) == index
    assert json.loads(before)["operators"][0]["harness"] == \
        json.loads((root / "index.json").read_text())["operators"][0]["harness"]
    # A re-run that cannot run is an error, never a reproduction; the exit status says so.
    from kpair.cli.release import _verify_exit, describe_reproduction

    index = release.verify_release(root, QUICK, runner=_fake_runner(
        lambda job: error_result(job.harness, "boom", stage="run")))
    assert release.index.latest(index.operators[0]).outcome == "error"
    assert _verify_exit(index) == 5 and index.verifications[-1].rate == 0.0
    assert describe_reproduction(index)[0].startswith("level1/1_mm: error")
    # Adding an operator keeps the release's verification history.
    release.add_operator(root, harnesses["offbyone"], level=1, name="2_wrong", options=QUICK)
    after = release.load_index(root)
    assert after.verifications == index.verifications
    assert after.operators[0].verifications == index.operators[0].verifications


def test_a_harness_with_another_ref_is_a_different_operator(harnesses, tmp_path, capsys):
    root = tmp_path / "rel"
    # --allow-slower: what is tested is the record, not the gain (a busy machine may blur it).
    assert release.add_operator(root, harnesses["fast"], level=1, name="1_mm", options=QUICK,
                                allow_slower=True).added
    stored = Result.read(root / "level1" / "1_mm" / "harness" / "result.json")
    before = (root / "index.json").read_text()
    # release add: another ref under a published name is refused, --replace or not.
    for extra in ([], ["--replace"]):
        assert kpair(["release", "add", str(root), str(harnesses["slower"]), "--level", "1",
                      "--name", "1_mm", *extra, *QUICK_ARGS]) == 2
        err = capsys.readouterr().err
        assert "different operator" in err and "code sha256" in err and "--name" in err
    assert (root / "index.json").read_text() == before
    # verify: a harness re-captured in place with another ref is not compared.
    harness = root / "level1" / "1_mm" / "harness"
    shutil.rmtree(harness)
    shutil.copytree(harnesses["slower"], harness)
    index = release.verify_release(root, QUICK, runner=_fake_runner(
        lambda job: _speed_like(stored, stored.speed.speedup, stored.speed.reported_ci95)))
    (v,) = index.operators[0].verifications
    assert v.outcome == "different operator" and v.same_operator is False
    assert v.inside is None and any(d.startswith("code sha256") for d in v.differs)
    assert index.verifications[-1].different_operator == 1
    assert index.verifications[-1].compared == 0 and index.verifications[-1].rate is None
    from kpair.cli.release import describe_reproduction

    assert describe_reproduction(index)[0].startswith("level1/1_mm: different operator")


def _benchmark(name: str, monkeypatch):
    """The script benchmarks/<name>.py as a module (its helpers, _bench, beside it)."""
    import importlib.util

    bench = Path(__file__).parents[1] / "benchmarks"
    monkeypatch.syspath_prepend(str(bench))
    spec = importlib.util.spec_from_file_location(name, bench / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reproduce_compares_interval_rules_on_the_same_reruns(monkeypatch):
    """benchmarks/reproduce.py reports, beside the published (quadrature) intervals, what
    other ways of folding in the identical-binary control, or leaving out the run-level term,
    would have covered: same re-runs, one table, so a rule is judged on runs it was not chosen
    from."""
    rep = _benchmark("reproduce", monkeypatch)
    # linear 0.015, quadrature 0.0112, calibrated 0.013, no_run_term hypot(0.006, b) 0.0078
    w, b, w0 = 0.01, 0.005, 0.006
    at = [math.exp(math.log(1.1) + d) for d in (0.0, 0.0105, 0.0125, -0.014)]
    ops = [{"speedup": 1.1, "log_parts": (w, b), "w_no_run_term": w0, "ref_median_us": 8.0,
            "reruns": [*at, None], "inside": [True, True, True, True, None]}]
    identical = {"p": [{"speedup": 1.004, "ci95": [0.99, 1.01], "bound": 1.002}]}
    r = rep.rules(ops, identical)
    assert {k: v["inside"] for k, v in r.items()} == {
        "linear": 4, "rerun_only": 1, "quadrature": 2, "calibrated": 3, "no_run_term": 1}
    assert all(v["compared"] == 5 for v in r.values())     # a failed re-run is a miss
    assert r["linear"]["median_half_width_ref_ge_5us"] == pytest.approx(math.expm1(0.015))
    assert r["rerun_only"]["identical_no_difference"] == 1.0


def test_reproduce_takes_the_run_level_term_out_of_a_published_interval(monkeypatch):
    """w0, the re-run interval's log half-width without u: w scaled by
    sqrt((s^2/R) / (s^2/R + u^2)); a result without u (older ones) keeps w."""
    rep = _benchmark("reproduce", monkeypatch)
    s_, u, r = 0.02, 0.005, 8
    w = 0.03
    speed = {"ci95": [math.exp(-w), math.exp(w)], "systematic": {"bound": 1.004},
             "replicate_sd_log": s_, "run_sd_log": u, "replicates": [{}] * r}
    got = rep._parts(speed)
    assert got[:2] == pytest.approx((w, math.log(1.004)))
    assert got[2] == pytest.approx(w * math.sqrt((s_ * s_ / r) / (s_ * s_ / r + u * u)))
    assert rep._parts({**speed, "run_sd_log": 0.0})[2] == pytest.approx(w)
    assert rep._parts({"ci95": [0.9, 1.1]}) is None       # no control bound: no parts


def test_replicate_structure_tells_sticky_from_alternating_replicates(monkeypatch):
    """benchmarks/replicate_structure.py's lag-1 correlation: replicates that stay on one level
    for several renewals read above 0, replicates that alternate read toward -1."""
    rs = _benchmark("replicate_structure", monkeypatch)
    sticky = [[0.14, 0.14, 0.14, 0.08, 0.08, 0.08]]
    alternating = [[0.14, 0.08, 0.14, 0.08, 0.14, 0.08]]
    assert rs.lag1_correlation(sticky) == pytest.approx(0.5)
    assert rs.lag1_correlation(alternating) == pytest.approx(-5 / 6)
    assert rs.lag1_correlation(sticky + alternating) == pytest.approx((3 - 5) / 12)
    assert math.isnan(rs.lag1_correlation([[0.5, 0.5, 0.5]]))
