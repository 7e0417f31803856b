"""``kpair optimize --range`` on the host backend: the range matmul + bias + ReLU
(tests/csrc/range_ops.c) as ref; as candidates, captures of the same range made other ways in
this process over the same arrays. The race (``race``): ref is an eager range that computes
its matmul ``REPEAT`` times before bias and ReLU (redundant work, as an eager program may do),
so by construction the fused function (one pass) is several times faster than ref, and a
capture of ref's own calls again (``slow``: ref's speed) is several times slower than the
fused one; a fused function that skips its work (wrong) and one over a copy of ``b`` (cannot
be bound) complete it. The fastest correct one is published with its producer named; the
wrong one is recorded as failed with its check, the unbound one as refused with the reason.
Plus the CLI (``--json``: one document; exit codes) and the plan substitution kpair's Triton
retunes use, on host ``.so`` plans (``lab``: ``conftest.record_mlp_range``)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from conftest import CSRC, range_arrays, record_mlp_range
from kpair.cli import main as kpair
from kpair.errors import AbiMismatch, UsageError
from kpair.harness import bind_snapshot, load_plan
from kpair.optimize import OptimizeOptions, RangeCandidate, optimize_range
from kpair.optimize.director import DirectorValidation
from kpair.optimize.ranges import FILE as RANGE_FILE
from kpair.optimize.ranges import RangeCandidates
from kpair.optimize.strategies.captured import (
    RETUNE,
    CapturedRange,
    check_candidates,
    substitute,
    write_variant,
)
from kpair.optimize.strategy import Context
from kpair.optimize.workbench import quick_options
from kpair.options import RunOptions
from kpair.plan import Plan
from kpair.record import Recorder
from kpair.release import load_index
from kpair.session import Session
from kpair.snapshot import Snapshot
from kpair.toolchain import compile_shared

N = 256
#: Small budgets on a busy 2-core machine.
FAST = RunOptions(time_cap_s=3.0, max_blocks=64, control=False, timeout_s=300, seed=3)
OPTIONS = OptimizeOptions(strategies=(), prune=quick_options(FAST, max_blocks=16,
                                                             time_cap_s=0.5),
                          rungs=(), confirm=FAST, publish=FAST, keep=2)
BUDGET = ["--timeout", "300", "--prune-max-blocks", "16", "--prune-time-cap", "0.5",
          "--rungs", "0", "--time-cap", "3", "--max-blocks", "64", "--seed", "3"]


def _fused(lib: Path, x: dict, out: Path, n: int, fn: str = "kp_fused", b=None) -> Path:
    """A capture of the range as one fused call ``fn`` writing ``out2`` (declared)."""
    x["out2"][...] = 0
    b = x["b"] if b is None else b
    with Recorder(out, names={"a": x["a"], "b": b, "bias": x["bias"], "out2": x["out2"],
                              "row": x["row"]}, outputs=[x["out2"]], scratch=[x["row"]]) as r:
        r.call(lib, fn, [np.int32(n), x["bias"], x["a"], b, x["out2"], x["row"]])
    return r.snapshot.root


def _eager(lib: Path, x: dict, out: Path, n: int, into: str, times: int):
    """The range with its matmul computed ``times`` times into ``into`` (declared), then
    bias and ReLU: ``times + 2`` calls."""
    x[into][...] = 0
    with Recorder(out, names={"a": x["a"], "b": x["b"], "bias": x["bias"],
                              into: x[into]}, outputs=[x[into]]) as r:
        for _ in range(times):
            r.call(lib, "kp_matmul", [x["a"], x["b"], x[into], np.int32(n)])
        r.call(lib, "kp_bias", [x[into], x["bias"], np.int32(n)])
        r.call(lib, "kp_relu", [x[into], np.int32(n)])
    return r.snapshot.root


def _unfused(lib: Path, x: dict, out: Path, n: int) -> Path:
    """The same three calls again, into ``out2``: correct, at ref's speed."""
    x["out2"][...] = 0
    with Recorder(out, names={"a": x["a"], "b": x["b"], "bias": x["bias"],
                              "out2": x["out2"]}, outputs=[x["out2"]]) as r:
        r.call(lib, "kp_matmul", [x["a"], x["b"], x["out2"], np.int32(n)])
        r.call(lib, "kp_bias", [x["out2"], x["bias"], np.int32(n)])
        r.call(lib, "kp_relu", [x["out2"], np.int32(n)])
    return r.snapshot.root


#: The race's size, and how many times its ref computes the matmul.
RACE_N, REPEAT = 128, 8


@pytest.fixture(scope="module")
def race(tmp_path_factory) -> dict:
    """ref: the matmul ``REPEAT`` times, then bias and ReLU; the candidates' captures."""
    d = tmp_path_factory.mktemp("race")
    lib = compile_shared(CSRC / "range_ops.c", d / "ops.so", flags=("-O2", "-g"))
    x, n = range_arrays(RACE_N), RACE_N
    ref = _eager(lib, x, d / "ref", n, "out", REPEAT)
    caps = {"slow": _eager(lib, x, d / "slow", n, "out2", REPEAT),
            "inductor-default": _fused(lib, x, d / "fused", n),
            "skips-work": _fused(lib, x, d / "skip", n, fn="kp_fused_skip"),
            "other-b": _fused(lib, x, d / "otherb", n, b=x["b"].copy())}
    np.testing.assert_array_equal(x["out"], x["out2"])   # the fused calls really ran
    # Three calls, the first one kp_matmul_repeat: REPEAT matmuls in one launch (ref's speed).
    repeat = compile_shared(CSRC / "range_repeat.c", d / "repeat.so", flags=("-O2", "-g"),
                            defines={"KP_REPEAT": REPEAT})
    x["out2"][...] = 0
    with Recorder(d / "unfused", names={"a": x["a"], "b": x["b"], "bias": x["bias"],
                                        "out2": x["out2"]}, outputs=[x["out2"]]) as r:
        r.call(repeat, "kp_matmul_repeat", [x["a"], x["b"], x["out2"], np.int32(n)])
        r.call(lib, "kp_bias", [x["out2"], x["bias"], np.int32(n)])
        r.call(lib, "kp_relu", [x["out2"], np.int32(n)])
    np.testing.assert_array_equal(x["out"], x["out2"])
    return {"dir": d, "lib": lib, "x": x, "ref": ref, "caps": caps,
            "repeat": r.snapshot.root}


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("optrange")
    lib = compile_shared(CSRC / "range_ops.c", d / "ops.so", flags=("-O2", "-g"))
    x = range_arrays(N)
    ref = record_mlp_range(lib, d / "ref", x, N).root
    caps = {"unfused": _unfused(lib, x, d / "unfused", N),
            "inductor-default": _fused(lib, x, d / "fused", N),
            "skips-work": _fused(lib, x, d / "skip", N, fn="kp_fused_skip"),
            "other-b": _fused(lib, x, d / "otherb", N, b=x["b"].copy())}
    np.testing.assert_array_equal(x["out"], x["out2"])   # the fused calls really ran
    return {"dir": d, "lib": lib, "x": x, "ref": ref, "caps": caps}


def _valid(path: Path) -> None:
    """``path`` (a range_candidates.json) against its published JSON Schema, by a standard
    Draft 2020-12 validator; an unknown field is refused."""
    import jsonschema

    schema = json.loads((Path(__file__).resolve().parents[1] / "docs" / "schemas"
                         / "range_candidates.schema.json").read_text())
    doc = json.loads(path.read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)
    assert not jsonschema.Draft202012Validator(schema).is_valid({**doc, "surprise": 1})


def test_publishes_the_fastest_correct_and_records_every_candidate(race, tmp_path):
    rel = tmp_path / "rel"
    cands = [RangeCandidate(p, s) for p, s in race["caps"].items()]
    summary = optimize_range(race["ref"], cands, rel, OPTIONS, name="mlp",
                             work=tmp_path / "work", log=lambda s: None)
    (o,) = summary.outcomes
    assert (o.status, o.producer) == ("published", "inductor-default"), o.line
    assert summary.exit_code == 0 and summary.published == 1
    row = next(r for r in load_index(rel).operators if r.name == "mlp")
    assert row.level == 2 and row.status == "pass" and row.plan_launches == 1
    assert row.range.ops == REPEAT + 2 and row.kernels.opt == "kp_fused"
    # One fused pass against REPEAT matmuls: far above 1 (point estimates, not intervals).
    assert row.harness.speedup > 4.0, row.harness
    assert row.producer == "inductor-default"   # the index's v4 field, as a tournament's
    prov = rel / row.rel / "provenance"
    _valid(prov / RANGE_FILE)
    record = RangeCandidates.read(prov / RANGE_FILE)
    by = {c.producer: c for c in record.candidates}
    assert set(by) == set(race["caps"])
    assert record.winner == "inductor-default" and by["inductor-default"].winner
    assert by["inductor-default"].status == "pass" and by["inductor-default"].step == "confirm"
    assert by["skips-work"].status == "fail" and by["skips-work"].failed_check
    assert by["other-b"].status == "refused"
    assert "b: no counterpart" in by["other-b"].reason
    # ref's own calls again: correct, about ref's speed, REPEAT times the fused one's work.
    assert by["slow"].status == "pass" and not by["slow"].winner
    assert by["inductor-default"].speedup > 4 * by["slow"].speedup, \
        (by["inductor-default"].speedup, by["slow"].speedup)
    assert DirectorValidation.read(prov / "director_validation.json").label == \
        "inductor-default"
    # Resuming: the operator is in the release, nothing is judged again.
    again = optimize_range(race["ref"], cands, rel, OPTIONS, name="mlp",
                           work=tmp_path / "work", log=lambda s: None)
    assert [o.status for o in again.outcomes] == ["skipped"]


def test_no_correct_candidate_refuses_the_range_with_the_reason(lab, tmp_path):
    cands = [RangeCandidate("skips-work", lab["caps"]["skips-work"]),
             RangeCandidate("other-b", lab["caps"]["other-b"])]
    summary = optimize_range(lab["ref"], cands, tmp_path / "rel", OPTIONS, name="mlp",
                             work=tmp_path / "work", log=lambda s: None)
    (o,) = summary.outcomes
    assert o.status == "refused" and o.producer is None
    assert "none of 1 candidates passed" in o.line
    (row,) = load_index(tmp_path / "rel").refused
    assert row.name == "mlp" and row.refused_by == "optimizer"
    written = tmp_path / "work" / "ops" / "level2-mlp" / "provenance" / RANGE_FILE
    _valid(written)
    record = RangeCandidates.read(written)
    assert record.winner is None and "none of 1 candidates passed" in record.reason
    assert [(c.producer, c.status) for c in record.candidates] == [
        ("other-b", "refused"), ("skips-work", "fail")]


def test_cli_json_is_one_document(race, tmp_path, capsys):
    caps = race["caps"]
    args = ["optimize", "--range", str(race["ref"]), "--opt-capture",
            f"inductor-default={caps['inductor-default']}", "--opt-capture",
            f"skips-work={caps['skips-work']}", "--name", "mlp", "-o", str(tmp_path / "rel"),
            "--json", *BUDGET]
    code = kpair(args)
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(out)   # exactly one document on stdout
    assert doc["published"] == 1 and doc["exit_code"] == 0
    (op,) = doc["operators"]
    assert op["key"] == "level2/mlp" and op["producer"] == "inductor-default"
    assert "kpair optimize: 1 published" in err


@pytest.mark.parametrize("extra,code,message", [
    (["--opt-capture", "x=y"], 2, "--opt-capture NAME=SNAP goes with --range"),
    (["--range", "MISSING", "--opt-capture", "a=b"], 3, "no such snapshot directory"),
    (["--range", "REF"], 2, "--range needs at least one --opt-capture"),
    (["--range", "REF", "--opt-capture", "nameless"], 2, "give NAME=SNAP"),
    (["--range", "REF", "--opt-capture", "a=x", "--opt-capture", "a=y"], 2,
     "producer 'a' is given twice"),
    (["--range", "REF", "--opt-capture", "a b=x"], 2, "give a short name"),
    (["--range", "REF", "--opt-capture", "a=x", "--snapshot", "REF"], 2,
     "give no program, --snapshot"),
])
def test_cli_usage_errors_are_one_line(lab, tmp_path, capsys, extra, code, message):
    extra = [str(lab["ref"]) if a == "REF" else str(tmp_path / a) if a == "MISSING" else a
             for a in extra]
    assert kpair(["optimize", "-o", str(tmp_path / "rel"), *extra]) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Traceback" not in err[0], err
    assert not (tmp_path / "rel").exists()


def test_the_index_producer_of_a_winner(tmp_path):
    from kpair.optimize.program import index_producer
    from kpair.release import add_operator

    capture = {"strategy": "opt-capture", "producer": "max-autotune"}
    assert index_producer(capture) == "max-autotune"
    assert index_producer({**capture, "producer": "my-compiler"}) is None
    assert index_producer({"strategy": RETUNE, "producer": RETUNE}) == "kpair-search"
    assert index_producer({"strategy": "triton", "producer": "triton"}) == "kpair-search"
    with pytest.raises(UsageError, match="producer 'my-compiler' is not one of"):
        add_operator(tmp_path / "rel", tmp_path, level=2, name="x", producer="my-compiler")
    assert not (tmp_path / "rel").exists()


def test_check_candidates():
    with pytest.raises(UsageError, match="names kpair's own retunes"):
        check_candidates([RangeCandidate(RETUNE, Path("x"))])


# ------------------------------------------------------------ plan substitution (retunes)


@pytest.fixture(scope="module")
def bound(lab, tmp_path_factory) -> dict:
    """The fused capture bound to ref's range; the same source built -O0 (same layout)."""
    d = tmp_path_factory.mktemp("subst")
    ref = Snapshot.open(lab["ref"])
    path = bind_snapshot(ref, lab["caps"]["inductor-default"], d / "plan")
    slow = compile_shared(CSRC / "range_ops.c", d / "ops_O0.so", flags=("-O0", "-g"))
    return {"ref": ref, "path": path, "plan": Plan.read(path), "other": slow}


def test_a_launch_substituted_keeps_the_kernarg_and_passes(bound, lab):
    plan = bound["plan"]
    variant = write_variant(bound["path"], plan, bound["other"].read_bytes(), ".so",
                            "variant", 0, "kp_fused", "elf-so",
                            {"block": [1, 1, 1]}, "the -O0 build")
    got = Plan.read(variant)
    (old,), (new,) = plan.launches, got.launches
    assert new.code != old.code and (variant.parent / new.code).read_bytes() == \
        bound["other"].read_bytes()
    assert (new.kernarg, new.params, new.relocations) == (old.kernarg, old.params,
                                                           old.relocations)
    load_plan(variant, bound["ref"].manifest)   # the new code object's layout is checked
    from kpair.optimize.strategies.captured import plan_candidate

    with Session(_aa(lab, bound), RunOptions(
            time_cap_s=0.5, min_blocks=4, max_blocks=16, control=False, timeout_s=300)) as s:
        judged = s.judge(plan_candidate(variant, label="O0", strategy=RETUNE))
    assert judged.result.status == "pass", judged.result.reason


def _aa(lab, bound) -> Path:
    from kpair.optimize.workbench import Operator, base_harness

    op = Operator(2, "mlp", snapshot=lab["ref"])
    work = bound["path"].parent.parent / "aa"
    return base_harness(op, work).root   # the candidates' scratch: placed by the session


def test_a_substituted_launch_of_another_layout_is_refused(bound):
    variant = write_variant(bound["path"], bound["plan"], bound["other"].read_bytes(), ".so",
                            "wrong", 0, "kp_matmul", "elf-so", None, "another layout")
    with pytest.raises(AbiMismatch, match=r"launch 0 \(kp_matmul\): the kernarg's layout"):
        load_plan(variant, bound["ref"].manifest)


def test_only_a_kernel_launch_can_be_substituted(bound):
    from kpair.plan import PlanLaunch, RegionArg

    memset = PlanLaunch(kind="memset", dst=RegionArg("out", 0, "write"), count=4)
    plan = bound["plan"].replace(launches=(memset, *bound["plan"].launches))
    with pytest.raises(UsageError, match="launch 0 is a memset"):
        substitute(plan, 0, code="x.so", kernel="k", fmt="elf-so")


@pytest.mark.skipif(importlib.util.find_spec("triton") is not None,
                    reason="Triton is installed: this checks the refusal without it")
def test_a_triton_launch_without_triton_is_recorded_not_retuned(lab, tmp_path):
    """A capture whose operation carries Triton metadata (as ``kpair capture --range``
    records it) is retuned per launch; without Triton each such launch is one candidate
    that was not built, with the reason — the bound capture itself goes on."""
    cap = tmp_path / "cap"
    import shutil

    shutil.copytree(lab["caps"]["inductor-default"], cap)
    doc = json.loads((cap / "snapshot.json").read_text())
    source = "def kp_fused(x_ptr, xnumel, XBLOCK: tl.constexpr):\n    pass\n"
    doc["provenance"]["ops"] = [{"kind": "kernel", "triton": {
        "source": source, "function": "kp_fused", "launched_by": "triton.CompiledKernel",
        "signature": {"x_ptr": "*fp32", "xnumel": "i32", "XBLOCK": "constexpr"},
        "constants": {"XBLOCK": 128}, "metadata": {"num_warps": 4, "num_stages": 1}}}]
    (cap / "snapshot.json").write_text(json.dumps(doc))
    strategy = CapturedRange([RangeCandidate("compiled", cap)], limit=4)
    from kpair.harness import Harness

    h = Harness.open(_aa(lab, {"path": tmp_path / "p" / "x", "plan": Plan.read(
        bind_snapshot(Snapshot.open(lab["ref"]), cap, tmp_path / "b"))}))
    got = list(strategy.candidates(h, Context(work=tmp_path / "w")))
    assert [c.label for c in got] == ["compiled", "compiled op0"]
    assert got[0].build_error is None and got[0].format == "plan"
    assert got[1].strategy == RETUNE and "pip install triton" in got[1].build_error


def test_the_best_retune_of_each_launch_is_combined(lab, bound, tmp_path):
    """Retunes that beat their capture on two launches are put in place together: the
    combined plan fits the range and passes; with one improving launch there is none."""
    from kpair.harness import Harness
    from kpair.optimize.strategies.captured import (
        Variant,
        best_per_launch,
        combined_plan,
        keep_code,
    )

    path = bind_snapshot(bound["ref"], lab["caps"]["unfused"], tmp_path / "plan")
    plan = Plan.read(path)
    assert [x.kernel for x in plan.launches] == ["kp_matmul", "kp_bias", "kp_relu"]
    rel = keep_code(path, bound["other"].read_bytes(), ".so")
    variants = [Variant("u op0 a", "u", 0, rel, "kp_matmul", "elf-so"),
                Variant("u op0 b", "u", 0, rel, "kp_matmul", "elf-so"),
                Variant("u op1 a", "u", 1, rel, "kp_bias", "elf-so"),
                Variant("u op2 a", "u", 2, rel, "kp_relu", "elf-so")]
    scores = {"u": 1.0, "u op0 a": 1.05, "u op0 b": 1.2, "u op1 a": 0.97, "u op2 a": 1.02}
    chosen = best_per_launch(variants, scores, scores["u"])
    assert {i: v.label for i, v in chosen.items()} == {0: "u op0 b", 2: "u op2 a"}
    both = combined_plan(plan, chosen)
    assert [x.code == rel for x in both.launches] == [True, False, True]
    assert both.launches[1] == plan.launches[1]

    strategy = CapturedRange([RangeCandidate("u", lab["caps"]["unfused"])],
                             scores=lambda: scores)
    strategy._variants["u"] = variants
    h = Harness.open(_aa(lab, bound))
    got = strategy.combined(h, RangeCandidate("u", lab["caps"]["unfused"]), path)
    assert got is not None and got.label == "u combined" and got.strategy == RETUNE
    assert got.params["launches"] == {"0": "u op0 b", "2": "u op2 a"}
    with Session(h.root, RunOptions(time_cap_s=0.5, min_blocks=4, max_blocks=16,
                                    control=False, timeout_s=300)) as s:
        judged = s.judge(got)
    assert judged.result.status == "pass", judged.result.reason
    strategy.scores = lambda: {**scores, "u op2 a": 0.99}   # one launch improved: no plan
    assert strategy.combined(h, RangeCandidate("u", lab["caps"]["unfused"]), path) is None


def test_a_retuned_launch_goes_through_the_search_and_can_win(race, tmp_path, monkeypatch,
                                                              matmul_libs):
    """The retune path end to end on the host, Triton's compile stood in for: the race's
    ref (REPEAT matmuls, bias, ReLU) against a capture of three calls whose first one,
    kp_matmul_repeat, does REPEAT matmuls in one launch (so the capture runs at ref's speed);
    its first operation carries Triton metadata (as ``kpair capture --range`` records it), and
    each config "builds" a host kp_matmul doing one matmul — the fast loop order
    (bit-identical) or the off-by-one one. Each is put in place of launch 0, checked, judged:
    the fast one passes and, by construction several times faster than the capture, wins for
    producer kpair-retune; the wrong one fails; each row names what it retuned."""
    import shutil

    from kpair.candidate import Candidate
    from kpair.optimize.strategies import captured

    cap = tmp_path / "unfused"
    shutil.copytree(race["repeat"], cap)
    doc = json.loads((cap / "snapshot.json").read_text())
    doc["provenance"]["ops"] = [{"kind": "kernel", "triton": {
        "source": "def kp_matmul(a, b, c, n):\n    pass\n", "function": "kp_matmul",
        "signature": {"a": "*fp32", "b": "*fp32", "c": "*fp32", "n": "i32"},
        "metadata": {"num_warps": 4, "num_stages": 1}}}, {"kind": "kernel"},
        {"kind": "kernel"}]
    (cap / "snapshot.json").write_text(json.dumps(doc))
    builds = {2: matmul_libs["fast"], 8: matmul_libs["offbyone"]}

    def fake_build(info, fn, config, stem, harness, context, formula, values, *, origin):
        lib = builds.get(config["num_warps"], matmul_libs["fast"])
        label = f"num_warps={config['num_warps']} maxnreg={config['maxnreg']}"
        return Candidate(lib.read_bytes(), "kp_matmul", "elf-so", {"block": [1, 1, 1]},
                         label=label, strategy="triton", params={"origin": origin},
                         source=f"{info.function} (stand-in)", build=f"stand-in {label}")

    monkeypatch.setattr(captured, "load_function", lambda info, where: object())
    monkeypatch.setattr(captured, "_build", fake_build)
    opts = OptimizeOptions(strategies=(), prune=OPTIONS.prune, rungs=(), confirm=FAST,
                           publish=FAST, keep=2, triton_limit=3)
    summary = optimize_range(race["ref"], [RangeCandidate("unfused", cap)], tmp_path / "rel",
                             opts, name="mlp", work=tmp_path / "work", log=lambda s: None)
    (o,) = summary.outcomes
    record = RangeCandidates.read(tmp_path / "work" / "ops" / "level2-mlp" / "provenance"
                              / RANGE_FILE)
    rows = {c.label: c for c in record.candidates}
    assert set(rows) == {"unfused", "unfused op0 num_warps=2 maxnreg=None",
                         "unfused op0 num_warps=8 maxnreg=None",
                         "unfused op0 num_warps=4 maxnreg=128"}, list(rows)
    fast, wrong = rows["unfused op0 num_warps=2 maxnreg=None"], \
        rows["unfused op0 num_warps=8 maxnreg=None"]
    assert (fast.producer, fast.of, fast.status) == (RETUNE, "unfused", "pass")
    assert wrong.status == "fail" and "region out" in wrong.reason
    assert fast.speedup > 4 * rows["unfused"].speedup, (fast.speedup, rows["unfused"].speedup)
    assert (o.status, o.producer) == ("published", RETUNE), o.line
    assert record.winner == RETUNE and rows[record.winner_label].winner
    row = next(r for r in load_index(tmp_path / "rel").operators if r.name == "mlp")
    assert row.plan_launches == 3   # the capture's three launches, the first one retuned
    assert row.producer == "kpair-search"   # kpair's own: its retune of a capture
