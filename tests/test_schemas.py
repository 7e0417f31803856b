"""Every file kpair writes validates against its published JSON Schema (docs/schemas/), with
a standard Draft 2020-12 validator (the ``jsonschema`` library), not kpair's own reader.

The files come from real runs on the host backend: a recorded call (snapshot.json), a pair
(harness.json, validation_policy.json), an evaluation session (attempts.jsonl, result.json),
the demo's Director measurement (director_validation.json), a release with a refused
operator and a verification (index.json, result.json of a pass and of a fail); capture.json
and profile.json from kpair's capture and profile writers fed a scripted driver (no GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kpair import release
from kpair.formats import write
from kpair.harness import create_harness
from kpair.pipeline import RunOptions
from kpair.policy import Policy, Tolerance
from kpair.release.index import BaselineEntry, BaselineRecord
from kpair.schemas import FORMATS
from kpair.session import Session

jsonschema = pytest.importorskip("jsonschema", reason="pip install -e '.[test]'")

SCHEMAS = Path(__file__).resolve().parents[1] / "docs" / "schemas"
QUICK = RunOptions(time_cap_s=0.3, min_blocks=8, timeout_s=120, replicates=1)


def _schema(name: str) -> dict:
    return json.loads((SCHEMAS / f"{name}.schema.json").read_text())


@pytest.mark.parametrize("path", sorted(SCHEMAS.glob("*.schema.json")), ids=lambda p: p.name)
def test_every_published_schema_is_valid_draft_2020_12(path):
    schema = json.loads(path.read_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


def test_every_format_has_a_published_schema():
    assert {p.name for p in SCHEMAS.glob("*.schema.json")} == \
        {f"{name}.schema.json" for name in FORMATS}


@pytest.fixture(scope="module")
def written(matmul_libs, matmul_snapshot, tmp_path_factory) -> dict[str, list[Path]]:
    """Files of each format, as kpair wrote them: format name → paths."""
    from kpair.demo import director_validation

    d = tmp_path_factory.mktemp("written")
    files: dict[str, list[Path]] = {name: [] for name in FORMATS}
    # A declared tolerance, so that validation_policy.json holds more than the default.
    c_bytes = 128 * 128 * 4
    policy = Policy((Tolerance("c", 0, c_bytes, "float32", "cosine", min_cosine=0.9999),))
    harness = create_harness(matmul_snapshot, d / "harness", opt=matmul_libs["fast"],
                             policy=policy).root
    wrong = create_harness(matmul_snapshot, d / "wrong", opt=matmul_libs["offbyone"]).root
    files["snapshot"].append(matmul_snapshot / "snapshot.json")
    files["harness"] += [harness / "harness.json", wrong / "harness.json"]
    files["policy"] += [h / "capture" / "validation_policy.json" for h in (harness, wrong)]

    with Session(harness, QUICK, out=d / "ev") as session:
        session.evaluate(matmul_libs["fast"])
        session.evaluate(matmul_libs["offbyone"])
    files["attempt"].append(d / "ev" / "attempts.jsonl")
    files["result"] += sorted((d / "ev" / "results").glob("*/result.json"))

    prov = d / "prov"
    director = director_validation(harness, matmul_libs["fast"], prov)
    assert director is not None
    director.write(prov / "director_validation.json")
    files["director_validation"].append(prov / "director_validation.json")
    BaselineRecord(entries=[
        BaselineEntry(mode="coordinate-descent", found=True, kernel="triton_poi_fused_add_3",
                      config={"num_warps": 8, "num_stages": 1, "maxnreg": None,
                              "constants": {"XBLOCK": 256}},
                      status="pass", speedup=1.04, ci95=(1.03, 1.05)),
        BaselineEntry(mode="max-autotune", found=False,
                      reason="no kernel with this source in the max-autotune capture")]
    ).write(prov / "baseline.json")
    files["baseline"].append(prov / "baseline.json")
    files["attempt"].append(prov / "attempts.jsonl")

    root = d / "rel"
    assert release.add_operator(root, harness, level=1, name="1_mm", provenance=prov,
                                options=QUICK, allow_slower=True).added
    assert not release.add_operator(root, wrong, level=1, name="2_wrong", options=QUICK).added
    release.verify_release(root, QUICK)   # appends a verification record to the row
    index = release.load_index(root)
    assert index.operators[0].verifications and index.refused and index.verifications
    assert [b.mode for b in index.operators[0].baselines] == ["coordinate-descent",
                                                              "max-autotune"]
    assert index.summary.baselines[0].operators == 1
    files["index"].append(root / "index.json")
    files["result"] += [root / "level1" / "1_mm" / "harness" / "result.json",
                        root / "excluded" / "level1" / "2_wrong" / "result.json"]

    files["capture"].append(_capture(d / "capture"))
    files["snapshot"] += sorted((d / "capture" / "cap").glob("*/snapshot.json"))
    files["profile"].append(_profile(d / "profile.json"))
    files["plan"].append(_plan(d / "opt.plan.json"))
    files["range_candidates"].append(_range_candidates(d / "range_candidates.json"))
    files["tournament"].append(_tournament(d / "tournament.json"))
    files["tournament_run"].append(_tournament_run(d / "trel"))
    return files


def _tournament(path: Path) -> Path:
    """tournament.json with a published attempt, a refused one and a note (a real tournament
    writes it in tests/test_tournament.py, validated there too)."""
    from kpair.release.index import EntrantRow
    from kpair.release.tournament import EntrantAttempt, TournamentRecord

    write(path, TournamentRecord(
        level=2, name="76_Gemm_Add_ReLU", ref="/snapshots/ref", policy=None,
        options={"time_cap_s": 3.0}, winner=1, notes=["max-autotune: not captured"],
        attempts=[
            EntrantAttempt(entrant=EntrantRow(producer="plan", candidate="no.plan.json",
                                              status="refused",
                                              reason="pair refused: no.plan.json"),
                           kind="plan", path="no.plan.json", pair_s=0.01),
            EntrantAttempt(entrant=EntrantRow(producer="inductor-default", candidate="fused",
                                              status="pass", speedup=1.4, ci95=(1.2, 1.6),
                                              winner=True),
                           kind="opt-capture", path="fused", pair_s=0.5, run_s=3.2,
                           result="attempts/1-inductor-default.result.json")]))
    return path


def _tournament_run(root: Path) -> Path:
    """tournament_run.json after two calls (``record_call``, as ``run_contests`` appends)."""
    from kpair.release.tournament import RUN_FILE, record_call

    root.mkdir()
    record_call(root, "2026-12-07T19:00:00Z", 12.5, ["level2/76_Gemm_Add_ReLU"], 0)
    record_call(root, "2026-12-07T19:05:00Z", 0.2, [], 1)
    return root / RUN_FILE


def _range_candidates(path: Path) -> Path:
    """range_candidates.json with a candidate of every status (a real search writes it in
    tests/test_optimize_range.py, validated there too)."""
    from kpair.optimize.ranges import RangeAttempt, RangeCandidates

    RangeCandidates(candidates=[
        RangeAttempt(producer="other-b", label="other-b", strategy="opt-capture",
                     snapshot="otherb", status="refused", reason="not bound: b"),
        RangeAttempt(producer="inductor-default", label="inductor-default",
                     strategy="opt-capture", snapshot="fused", status="pass", step="confirm",
                     speedup=2.5, ci95=(2.1, 2.9), winner=True),
        RangeAttempt(producer="kpair-retune", label="inductor-default op0 num_warps=2",
                     strategy="kpair-retune", of="inductor-default", status="fail",
                     step="prune", failed_check="guard_bands", reason="FAIL [guard_bands]"),
    ], winner="inductor-default", winner_label="inductor-default").write(path)
    return path


def _plan(path: Path) -> Path:
    """A two-launch plan with scratch and every kind of binding, as kpair encodes it."""
    from kpair.plan import Plan, PlanLaunch, RegionArg, ScalarArg, Scratch, ScratchArg

    launches = (PlanLaunch(code="gemm.so", kernel="kp_gemm", args=(
        RegionArg("a"), RegionArg("b", offset=64, bytes=128), ScratchArg("c"),
        ScalarArg("i32", 64))),
        PlanLaunch(code="epi.so", kernel="kp_epi", grid=(2, 1, 1), args=(
            ScratchArg("c"), RegionArg("out", access="write"), ScalarArg("f32", 0.5))))
    write(path, Plan(launches=launches, scratch=(Scratch("c", 16384),), note="fused"))
    return path


def _capture(where: Path) -> Path:
    """capture.json of a capture session fed by a scripted driver (tests/test_capture_cpu)."""
    from test_capture_cpu import MIB, SEG, HostArgs, add_launch, make_session

    where.mkdir()
    session, driver = make_session(where, max_region_bytes=5000)
    args = HostArgs(("c_uint64", SEG), ("c_uint64", SEG + 4096), ("c_uint64", SEG + 64 * MIB),
                    ("c_int32", 1))
    launch, kernel = add_launch(args)
    session.launch_enter(launch, kernel, 1)
    driver.write(SEG + 64 * MIB, b"\xAA" * 16)
    session.launch_exit(1, 0)
    session.launch_enter(launch, kernel, 2)
    session.launch_exit(2, 719)                 # a failed launch is recorded too
    session.close(exit_status=0)
    return where / "cap" / "capture.json"


def _profile(path: Path) -> Path:
    from test_profile_cpu import make_profile

    write(path, make_profile(notes=["CUPTI dropped 3 records"]))
    return path


def _documents(path: Path) -> list:
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [json.loads(path.read_text())]


def test_every_file_kpair_writes_validates_against_its_schema(written):
    checked = {}
    for name, paths in written.items():
        validator = jsonschema.Draft202012Validator(_schema(name))
        for path in paths:
            assert path.name == FORMATS[name][0]
            for doc in _documents(path):
                errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                          for e in validator.iter_errors(doc)]
                assert not errors, f"{path} against {name}.schema.json:\n" + "\n".join(errors)
                checked[name] = checked.get(name, 0) + 1
    assert set(checked) == set(FORMATS), f"no file written for {set(FORMATS) - set(checked)}"


def test_the_schemas_refuse_what_the_readers_refuse(written):
    # The schema is a contract, not a formality: an unknown field and a missing version fail.
    index = json.loads(written["index"][0].read_text())
    validator = jsonschema.Draft202012Validator(_schema("index"))
    assert validator.is_valid(index)
    assert not validator.is_valid({**index, "surprise": 1})
    assert not validator.is_valid({k: v for k, v in index.items() if k != "schema_version"})
    verification = index["operators"][0]["verifications"][0]
    verification["outcome"] = "nearly reproduced"
    assert not validator.is_valid(index)
    attempt = _documents(written["attempt"][0])[0]
    line = jsonschema.Draft202012Validator(_schema("attempt"))
    assert line.is_valid(attempt) and not line.is_valid({**attempt, "n": "one"})
