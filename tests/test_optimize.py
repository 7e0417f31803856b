"""kpair optimize on the host backend: recorded snapshots to a release through a search over
C compiler options and -D source variants, with a candidate that crashes and one that hangs
in the middle of the session; attempts.jsonl, director_validation.json, the index's Director
and Harness numbers, an exclusion with its reason, and resuming. Plus the pure parts of the
strategies: launch-geometry declarations and Triton config and grid arithmetic on recorded
metadata."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import CSRC
from kpair.cli import main as kpair
from kpair.errors import UsageError
from kpair.optimize.director import DirectorValidation
from kpair.optimize.geometry import evaluate, launch_options, parse_geometry
from kpair.optimize.strategies import triton as tr
from kpair.optimize.strategies.host_c import HostC, parse_flags, parse_variant
from kpair.optimize.strategy import KernelSource
from kpair.release import load_index
from kpair.session import read_attempts

SOURCE = CSRC / "matmul_variants.c"
#: Small budgets: a busy 2-core machine; assertions are on statuses and structure.
BUDGET = ["--timeout", "10", "--prune-max-blocks", "8", "--prune-time-cap", "0.5",
          "--time-cap", "1", "--min-blocks", "4", "--max-blocks", "24", "--seed", "3"]


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    from kpair.record import record_call
    from kpair.toolchain import compile_shared

    d = tmp_path_factory.mktemp("opt")
    ref = compile_shared(SOURCE, d / "ref.so")
    rng = np.random.default_rng(0)
    n = 128
    a, b = rng.standard_normal((n, n), np.float32), rng.standard_normal((n, n), np.float32)
    c = np.zeros((n, n), np.float32)
    record_call(ref, "kp_matmul", [a, b, c, np.int32(n)], d / "1_matmul",
                names=["a", "b", "c", "n"],
                provenance=KernelSource.given(SOURCE, "kp_matmul").provenance())
    return d / "1_matmul"


def test_optimize_publishes_a_winner_and_excludes_what_never_beat_ref(snapshot, tmp_path,
                                                                       capsys):
    from kpair.harness import create_harness

    rel, work = tmp_path / "rel", tmp_path / "work"
    # The source comes from the snapshot's provenance (record_call declared it).
    args = ["optimize", "-o", str(rel), "--work", str(work), "--snapshot", str(snapshot),
            "--strategy", "host-c", "--flags=-O3", "--keep", "1",
            "--variant", "KP_VARIANT=3", "--variant", "KP_VARIANT=1",
            "--variant", "KP_VARIANT=4", "--variant", "KP_VARIANT=2", *BUDGET]
    assert kpair(args) == 0, capsys.readouterr().err
    # An existing harness, with variants that never beat ref: -O0 builds and a wrong one.
    h = create_harness(snapshot, tmp_path / "h", opt=work / "ops" / "level1-1_matmul" /
                       "captured.bin")
    assert kpair(["optimize", "-o", str(rel), "--work", str(work), "--harness", str(h.root),
                  "--name", "2_never_faster", "--source", str(SOURCE), "--kernel",
                  "kp_matmul", "--flags=-O0", "--variant", "KP_VARIANT=2", *BUDGET]) == 0
    err = capsys.readouterr().err
    assert "[1/1] level1/2_never_faster: excluded: no candidate beat ref" in err, err

    index = load_index(rel)
    (row,) = index.operators
    assert row.name == "1_matmul" and row.status == "pass"
    assert row.harness.speedup > 1 and row.director.speedup > 1
    assert row.correctness.mode == "byte-exact"
    (refused,) = index.refused
    assert refused.name == "2_never_faster" and "no candidate beat ref" in refused.reason
    assert index.summary.excluded[0].reason == refused.reason
    assert refused.refused_by == "optimizer"
    assert index.summary.excluded[0].where == "refused by the optimizer: no winner"
    assert (rel / "report.md").is_file()

    prov = rel / "level1" / "1_matmul" / "provenance"
    director = DirectorValidation.read(prov / "director_validation.json")
    assert director.strategy == "host-c" and director.params["defines"] == {"KP_VARIANT": "1"}
    assert director.options["control"] is False and director.blocks >= 4
    assert director.confirmed_speedup and director.candidates == 5
    attempts = read_attempts(prov / "attempts.jsonl")
    prune = [a for a in attempts if a.params["stage"] == "prune"]
    by_variant = {a.params["defines"].get("KP_VARIANT", "0"): a for a in prune}
    assert [a.params["defines"].get("KP_VARIANT", "0") for a in prune] == \
        ["0", "3", "1", "4", "2"]
    assert by_variant["3"].status == "error" and "SIGSEGV" in by_variant["3"].reason
    assert by_variant["4"].status == "error" and "Timeout" in by_variant["4"].reason
    assert by_variant["2"].status == "fail" and by_variant["2"].failed_check
    assert by_variant["1"].status == "pass" and by_variant["1"].speedup > 1
    assert all(a.strategy == "host-c" and a.build and "-DKP_VARIANT" in a.build
               for a in prune[1:])
    assert [a.n for a in attempts] == list(range(1, len(attempts) + 1))
    confirm = [a for a in attempts if a.params["stage"] == "confirm"]
    assert confirm and confirm[0].status == "pass" and confirm[0].combined_ci95
    for a in attempts:  # every attempt's result travels with the provenance
        assert json.loads((prov / a.result).read_text())["status"] == a.status
    ex = rel / "excluded" / "level1" / "2_never_faster"
    assert (ex / "provenance" / "attempts.jsonl").is_file() and (ex / "result.json").is_file()
    assert not (ex / "provenance" / "director_validation.json").exists()

    # Resuming: both operators are in the release; nothing is searched again.
    assert kpair(args) == 0
    assert "already in the release, skipped" in capsys.readouterr().err
    assert load_index(rel).operators[0].verified == row.verified


def test_search_evaluates_the_same_code_and_launch_once(snapshot, tmp_path):
    import shutil

    from kpair.harness import create_harness
    from kpair.optimize.search import search
    from kpair.optimize.workbench import built
    from kpair.pipeline import RunOptions

    h = create_harness(snapshot, tmp_path / "h", opt=snapshot.parent / "ref.so")
    twin = tmp_path / "twin.so"
    shutil.copyfile(snapshot.parent / "ref.so", twin)
    candidates = [built(snapshot.parent / "ref.so", "kp_matmul", label="first",
                        strategy="host-c"),
                  built(twin, "kp_matmul", label="twin", strategy="host-c")]
    quick = RunOptions(min_blocks=4, max_blocks=4, control=False, seed=1, timeout_s=30)
    outcome = search(h.root, candidates, tmp_path / "s", prune=quick, confirm=quick)
    assert [e.label for e in outcome.pruned] == ["first"]
    (first,) = outcome.pruned  # judged: its result and attempt number on the one type
    assert first.result is not None and first.attempt == 1 and first.step == "prune"
    ((p, why),) = outcome.skipped
    assert p.label == "twin" and why == "the same code and launch as first"


class _Sessions:
    """Stands in for ``kpair.session.Session`` in the search's bookkeeping tests: each stage's
    speedup of a candidate is a function of its label and the stage's max_blocks."""

    def __init__(self, speed):
        self.speed, self.stages = speed, []

    def __call__(self, harness, options, out):
        from types import SimpleNamespace

        outer, log = self, []
        self.stages.append((Path(out).name, log))

        class Stage:
            harness = SimpleNamespace(policy=SimpleNamespace(mode="byte-exact", note=""))
            setup_failed = None
            evaluated = 0

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def judge(self, candidate):
                from dataclasses import replace

                self.evaluated += 1
                log.append(candidate.label)
                x = outer.speed(candidate.label, options.max_blocks)
                speed = SimpleNamespace(speedup=x, reported_ci95=(x - 0.01, x + 0.01))
                return replace(candidate, attempt=self.evaluated, result=SimpleNamespace(
                    status="pass", speed=speed, reason=None))

        return Stage()


def test_successive_halving_measures_the_best_third_again_and_confirms_its_best(
        monkeypatch, tmp_path):
    import importlib

    from kpair.candidate import Candidate

    search_mod = importlib.import_module("kpair.optimize.search")
    proposals = []
    for i in range(9):
        binary = tmp_path / f"c{i}.bin"
        binary.write_bytes(bytes([i]))
        proposals.append(Candidate(kernel="k", label=f"c{i}", binary=binary, strategy="s"))
    # The prune stage ranks c8 first, then c7, c6 (its noise); the longer rung finds c7 best;
    # c0 never beats ref.
    prune = {f"c{i}": 1.0 + i / 10 for i in range(9)}
    longer = {"c8": 1.1, "c7": 1.2, "c6": 1.05}
    longer["coordinate-descent: cd"] = 1.15
    fake = _Sessions(lambda label, blocks: prune[label] if blocks == 16 else longer[label])
    monkeypatch.setattr(search_mod, "Session", fake)
    baselines = [("coordinate-descent", Candidate(kernel="k", label="cd", binary=binary),
                  {"found": True}),
                 ("max-autotune", None, {"found": False, "reason": "not in that capture"})]
    out = search_mod.search(tmp_path / "h", proposals, tmp_path / "s", keep=1,
                            baselines=baselines)
    assert [name for name, _ in fake.stages] == ["prune", "rung1", "confirm", "baseline"]
    # Inductor's configs are measured with the confirming run's options, after the search.
    assert fake.stages[3][1] == ["coordinate-descent: cd"]
    assert [(b.mode, b.status, b.speedup, b.reason) for b in out.baselines] == [
        ("coordinate-descent", "pass", 1.15, None),
        ("max-autotune", None, None, "not in that capture")]
    # 8 of 9 beat ref in prune; a rung takes ceil(8 / 3) = 3 of them, in prune order.
    assert fake.stages[1][1] == ["c8", "c7", "c6"]
    assert fake.stages[2][1] == ["c7"]                 # the rung's best is confirmed
    assert out.winner.label == "c7" and out.chosen_by.step == "rung1"
    assert out.winner.step == "confirm" and out.winner.strategy == "s"
    assert out.evaluated == 9 + 3 + 1 and [e.step for e in out.rungs[0]] == ["rung1"] * 3

    # Too few to halve: prune, then confirm (no rung measures all of them or only keep).
    fake = _Sessions(lambda label, blocks: prune[label])
    monkeypatch.setattr(search_mod, "Session", fake)
    out = search_mod.search(tmp_path / "h", proposals[:5], tmp_path / "t", keep=2)
    assert [name for name, _ in fake.stages] == ["prune", "confirm"]
    assert out.winner.label == "c4" and out.chosen_by.step == "prune"

    # Nothing beats ref in the rung: no confirming run, the reason says where it stopped.
    fake = _Sessions(lambda label, blocks: prune[label] if blocks == 16 else 0.9)
    monkeypatch.setattr(search_mod, "Session", fake)
    out = search_mod.search(tmp_path / "h", proposals, tmp_path / "u", keep=1)
    assert [name for name, _ in fake.stages] == ["prune", "rung1"]
    assert out.winner is None and out.reason.startswith("no candidate beat ref in rung1")


def test_host_c_refuses_flags_that_change_floating_point_results():
    with pytest.raises(UsageError, match="-ffast-math changes floating-point"):
        parse_flags("-O3 -ffast-math")
    with pytest.raises(UsageError, match="-Ofast"):
        HostC([["-Ofast"]])
    assert parse_variant("KP_VARIANT=1,TILE=32") == {"KP_VARIANT": "1", "TILE": "32"}
    assert ("-O2", "-march=native") in HostC([["-O2"]], native=True).flag_sets


def test_director_validation_reads_back_strictly(tmp_path):
    d = DirectorValidation(speedup=1.5, ci95=(1.4, 1.6), slot_bias=1.0, blocks=8,
                           stopped_by="max_blocks", method="m", options={}, label="x",
                           candidate_sha256="0" * 64, strategy="host-c", attempt=2,
                           candidates=3)
    d.write(tmp_path / "d.json")
    back = DirectorValidation.read(tmp_path / "d.json")
    assert back.speedup == 1.5 and back.reference_only is True and back.written
    raw = json.loads((tmp_path / "d.json").read_text())
    raw["surprise"] = 1
    (tmp_path / "d.json").write_text(json.dumps(raw))
    with pytest.raises(Exception, match="surprise"):
        DirectorValidation.read(tmp_path / "d.json")


# --------------------------------------------------------------------- launch geometry


class _Launch:
    def __init__(self, grid, block):
        self.grid, self.block = grid, block


class _Manifest:
    def __init__(self, params, grid, block, provenance=None):
        from types import SimpleNamespace

        self.kernarg = SimpleNamespace(params=params)
        self.launch = _Launch(grid, block)
        self.provenance = provenance or {}


def test_declared_geometry_is_checked_against_the_dispatch():
    from kpair.snapshot import Param

    src = "// kpair: kernel=kp_sigmoid block=128,256,512 grid=ceil(n/bx)\n__global__ ..."
    g = parse_geometry(src, "kp_sigmoid")
    assert g.blocks == ((128, 1, 1), (256, 1, 1), (512, 1, 1))
    assert parse_geometry(src, "other") is None
    params = (Param(0, 8, "pointer", "x"), Param(8, 8, "i64", "n"))
    kernarg = bytes(8) + (1000).to_bytes(8, "little")
    overrides, why = launch_options(g, _Manifest(params, (4, 1, 1), (256, 1, 1)), kernarg)
    assert why is None
    assert overrides == [None, {"grid": [8, 1, 1], "block": [128, 1, 1]},
                         {"grid": [2, 1, 1], "block": [512, 1, 1]}]
    # A declaration that does not reproduce the captured grid changes nothing.
    overrides, why = launch_options(g, _Manifest(params, (5, 1, 1), (256, 1, 1)), kernarg)
    assert overrides == [None] and "does not describe it" in why
    two_d = parse_geometry("// kpair: block=32x8 grid=(cdiv(cols, bx), cdiv(rows, by))", "k")
    assert two_d.grid_for((32, 8, 1), {"cols": 100, "rows": 17}) == (4, 3, 1)
    for bad in ("__import__('os')", "n.real", "open(n)"):
        with pytest.raises(UsageError):
            evaluate(bad, {"n": 1})


# --------------------------------------------------------------------- Triton configs

INDUCTOR_SRC = """def triton_poi_fused_add_0(in_ptr0, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = xindex < xnumel
    tmp0 = tl.load(in_ptr0 + (xindex), xmask)
    tl.store(out_ptr0 + (xindex), tmp0 + 1.0, xmask)
"""
PERSISTENT_SRC = """def triton_per_fused_sum_1(in_ptr0, out_ptr0, xnumel, rnumel,
        XBLOCK : tl.constexpr, RBLOCK : tl.constexpr):
    rindex = tl.arange(0, RBLOCK)[None, :]
    tmp = tl.sum(tl.load(in_ptr0 + rindex), 1)
"""


def _inductor_meta(source=INDUCTOR_SRC, **extra):
    return {"triton": {
        "launched_by": "CachingAutotuner", "source": source, "function": None,
        "triton_meta": {"signature": {"in_ptr0": "*fp32", "out_ptr0": "*fp32",
                                      "xnumel": "i32", "XBLOCK": "constexpr"},
                        "constants": {}},
        "constants": {"(3,)": 1024},
        "metadata": {"num_warps": 4, "num_stages": 1, "maxnreg": None, "shared": 0},
        **extra}}


def test_triton_inductor_pointwise_configs_and_grid():
    from kpair.snapshot import Param

    prov = _inductor_meta()
    info = tr.kernel_info(prov)
    assert info.function == "triton_poi_fused_add_0" and info.constants == {"XBLOCK": 1024}
    assert info.params == ["in_ptr0", "out_ptr0", "xnumel"] and not info.reduces
    params = (Param(0, 8, "bytes", "arg0"), Param(8, 8, "bytes", "arg1"),
              Param(16, 4, "bytes", "arg2"), Param(24, 8, "bytes", "arg3"))
    kernarg = bytes(16) + (100_000).to_bytes(4, "little") + bytes(12)
    m = _Manifest(params, (98, 1, 1), (128, 1, 1), prov)
    values = tr.scalars(info, m, kernarg)
    assert values == {"xnumel": 100_000}
    formula = tr.grid_formula(info)
    assert tr.grid_for(formula, info.constants, values) == (98, 1, 1)  # the captured grid
    todo = tr.configs(info, grid_known=True, limit=500)
    assert todo and all(c != {"num_warps": 4, "num_stages": 1, "maxnreg": None,
                               "constants": {"XBLOCK": 1024}} for c in todo)
    changes = [sum([c["num_warps"] != 4, c["num_stages"] != 1, c["maxnreg"] is not None,
                    c["constants"]["XBLOCK"] != 1024]) for c in todo]
    assert changes == sorted(changes) and changes[0] == 1  # one knob first
    assert {c["constants"]["XBLOCK"] for c in todo} == {512, 1024, 2048}
    assert {c["num_stages"] for c in todo} == {1}   # no loop: pipelining changes nothing
    assert len(tr.configs(info, grid_known=True, limit=5)) == 5
    config = {"num_warps": 8, "num_stages": 1, "maxnreg": None, "constants": {"XBLOCK": 512}}
    assert tr.launch_override(info, config, shared=64, formula=formula, values=values) == \
        {"block": [256, 1, 1], "dynamic_shared_bytes": 64, "grid": [196, 1, 1]}
    # No grid formula: block sizes are left alone, warps and stages still searched.
    assert all(not c["constants"] for c in tr.configs(info, grid_known=False))


def test_triton_search_starts_from_inductors_own_configs():
    def cfg(x, w, ctas=1, kwargs=None):
        return {"kwargs": {"XBLOCK": x, **(kwargs or {})}, "num_warps": w, "num_stages": 1,
                "num_ctas": ctas, "maxnreg": None}

    prov = _inductor_meta(autotune_configs=[
        cfg(1024, 4),                          # the captured one: it is ref
        cfg(256, 2), cfg(2048, 8),
        cfg(256, 2, ctas=2),                   # a cluster launch: replay has none
        cfg(128, 4, kwargs={"FOO": 3}),        # moves a constexpr this kernel does not have
        cfg(256, 2)])                          # a repeat
    info = tr.kernel_info(prov)
    seeds = tr.seed_configs(info, grid_known=True)
    assert seeds == [{"num_warps": 2, "num_stages": 1, "maxnreg": None,
                      "constants": {"XBLOCK": 256}},
                     {"num_warps": 8, "num_stages": 1, "maxnreg": None,
                      "constants": {"XBLOCK": 2048}}]
    todo = tr.configs(info, grid_known=True, limit=6)
    assert todo[:2] == seeds and len(todo) == 6
    assert all(todo.count(c) == 1 for c in todo)
    assert tr.configs(info, grid_known=True, limit=1) == seeds[:1]
    # Without a grid formula XBLOCK cannot move: a seed that moves it is not this dispatch's.
    assert tr.seed_configs(info, grid_known=False) == []


def test_triton_autotuner_launch_is_settled_by_the_dispatch_geometry():
    # An Inductor launch recorded through its autotuner: no compiled metadata, only the
    # configs it compiled; the block and the grid tell which one ran.
    from kpair.snapshot import Param

    prov = _inductor_meta()
    t = prov["triton"]
    del t["constants"], t["metadata"]
    t["triton_meta"]["configs"] = [{"(0,)": [["tt.divisibility", 16]]}]
    t["launcher_configs"] = [
        {"kwargs": {"XBLOCK": 1024}, "num_warps": 4, "num_stages": 1, "maxnreg": None},
        {"kwargs": {"XBLOCK": 512}, "num_warps": 8, "num_stages": 1, "maxnreg": None},
        {"kwargs": {"XBLOCK": 256}, "num_warps": 8, "num_stages": 1, "maxnreg": None}]
    info = tr.kernel_info(prov)
    assert info.constants == {} and info.attrs == {"(0,)": [["tt.divisibility", 16]]}
    params = (Param(0, 8, "bytes", "arg0"), Param(8, 8, "bytes", "arg1"),
              Param(16, 4, "bytes", "arg2"), Param(24, 8, "bytes", "arg3"))
    kernarg = bytes(16) + (100_000).to_bytes(4, "little") + bytes(12)
    ran = tr.resolve(info, _Manifest(params, (196, 1, 1), (256, 1, 1), prov), kernarg)
    assert ran.constants == {"XBLOCK": 512} and ran.metadata["num_warps"] == 8
    assert tr.resolve(info, _Manifest(params, (98, 1, 1), (128, 1, 1), prov),
                      kernarg).constants == {"XBLOCK": 1024}
    why = tr.resolve(info, _Manifest(params, (7, 1, 1), (256, 1, 1), prov), kernarg)
    assert isinstance(why, str) and "0 of the 3 recorded autotuner configs" in why
    t["launched_config"] = t["launcher_configs"][2]   # the compiled kernel was reachable
    assert tr.kernel_info(prov).constants == {"XBLOCK": 256}


def test_triton_plan_from_a_real_inductor_capture():
    """The record of an Inductor kernel launched on the H200 (no compiled kernel reachable,
    one autotuner config): the config that ran is settled by the dispatch, and the block-size
    candidates get grids that cover the same elements."""
    from kpair.snapshot import Param

    data = json.loads((Path(__file__).parent / "data" / "inductor_launch_h200.json").read_text())
    prov = {"triton": data["triton"]}
    params = tuple(Param(p["offset"], p["size"], p["kind"], p["name"]) for p in data["params"])
    grid, block = data["launch"]["grid"], data["launch"]["block"]
    xnumel = 2097152                  # the kernel's static size: grid 4096 x XBLOCK 512
    kernarg = bytes(16) + xnumel.to_bytes(4, "little") + bytes(20)
    info = tr.kernel_info(prov)
    assert info.inductor and "XBLOCK" not in info.constants   # not known from the record
    assert info.metadata == {"enable_fp_fusion": True}        # Inductor's compile option
    ran = tr.resolve(info, _Manifest(params, grid, block, prov), kernarg)
    assert ran.constants == {"XBLOCK": 512} and ran.metadata["num_warps"] == 8
    assert tr.scalars(ran, _Manifest(params, grid, block), kernarg) == {"xnumel": xnumel}
    formula = tr.grid_formula(ran)
    todo = tr.configs(ran, grid_known=True, limit=12)
    assert len(todo) == 12 and {c["num_stages"] for c in todo} == {1}
    for c in todo:
        g = tr.launch_override(ran, c, shared=0, formula=formula,
                               values={"xnumel": xnumel})["grid"]
        assert g[0] * c["constants"]["XBLOCK"] == xnumel


def test_triton_persistent_reduction_keeps_its_rblock_and_hand_written_grids():
    prov = _inductor_meta(PERSISTENT_SRC)
    prov["triton"]["triton_meta"]["signature"] = {
        "in_ptr0": "*fp32", "out_ptr0": "*fp32", "xnumel": "i32", "rnumel": "i32",
        "XBLOCK": "constexpr", "RBLOCK": "constexpr"}
    prov["triton"]["constants"] = {"XBLOCK": 1, "RBLOCK": 64}
    info = tr.kernel_info(prov)
    assert info.reduces and tr.tunable_blocks(info, grid_known=True) == ["XBLOCK"]
    looped = PERSISTENT_SRC.replace("rindex =", "for roffset in range(0, rnumel, RBLOCK):\n"
                                    "        rindex =")
    info = tr.kernel_info(_inductor_meta(looped) | {})
    info = tr.TritonKernel(**{**info.__dict__, "constants": {"XBLOCK": 1, "RBLOCK": 64}})
    assert tr.tunable_blocks(info, grid_known=False) == ["RBLOCK"]
    # A hand-written kernel declares its grid; jsonified constexpr keys are paths.
    hand = {"triton": {"launched_by": "triton.CompiledKernel", "function": "add_kernel",
                       "source": "def add_kernel(x, y, out, n, BLOCK_SIZE: tl.constexpr):\n"
                                 "    # kpair: grid=cdiv(n, BLOCK_SIZE)\n    pass\n",
                       "signature": {"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32",
                                     "BLOCK_SIZE": "constexpr"},
                       "constants": {"(4,)": 256}, "attrs": {"(0,)": [["tt.divisibility", 16]]},
                       "metadata": {"num_warps": 4, "num_stages": 3}}}
    info = tr.kernel_info(hand)
    assert info.constants == {"BLOCK_SIZE": 256} and tr.grid_formula(info) == \
        "cdiv(n, BLOCK_SIZE)"
    assert tr.grid_for("cdiv(n, BLOCK_SIZE)", {"BLOCK_SIZE": 512}, {"n": 4096}) == (8, 1, 1)
    assert tr.kernel_info({"triton": {"source": "x", "source_truncated": True}}) is None


def test_triton_absent_names_the_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "triton", None)
    with pytest.raises(Exception, match="pip install triton"):
        tr._triton()


def test_inductor_baselines_are_found_by_source_and_fitted_to_the_dispatch(snapshot, tmp_path):
    """A capture made under Inductor's tuning (here a recorded host call carrying an Inductor
    kernel's metadata; tuned_configs reads only the record) names the kernel's config;
    the operator whose kernel has the same source, under another name, gets it."""
    from types import SimpleNamespace

    from kpair.optimize.baseline import tuned_configs
    from kpair.optimize.strategy import Context
    from kpair.record import record_call
    from kpair.snapshot import Param

    def tuned_capture(where, xblock, warps):
        prov = _inductor_meta(INDUCTOR_SRC.replace("_add_0", "_add_7"))
        prov["triton"]["constants"] = {"(3,)": xblock}
        prov["triton"]["metadata"]["num_warps"] = warps
        where.mkdir()
        n = 4
        record_call(snapshot.parent / "ref.so", "kp_matmul",
                    [np.ones((n, n), np.float32), np.ones((n, n), np.float32),
                     np.zeros((n, n), np.float32), np.int32(n)], where / "0001_k",
                    names=["a", "b", "c", "n"], provenance=prov)
        (where / "capture.json").write_text(json.dumps({"exit_status": 0, "dispatches": [
            {"status": "captured", "snapshot": "0001_k"},
            {"status": "failed", "snapshot": None}]}))
        return tuned_configs(where)

    ours = tr.kernel_info(_inductor_meta())
    cd = tuned_capture(tmp_path / "cd", 2048, 8)
    assert list(cd) == [tr.info_key(ours)]          # the name differs, the source is the same
    assert cd[tr.info_key(ours)]["config"] == {"num_warps": 8, "num_stages": 1, "maxnreg": None,
                                            "constants": {"XBLOCK": 2048}}
    assert cd[tr.info_key(ours)]["kernel"] == "triton_poi_fused_add_7"
    same = tuned_capture(tmp_path / "same", 1024, 4)  # Inductor kept the captured config

    params = (Param(0, 8, "bytes", "arg0"), Param(8, 8, "bytes", "arg1"),
              Param(16, 4, "bytes", "arg2"), Param(24, 8, "bytes", "arg3"))
    kernarg = bytes(16) + (100_000).to_bytes(4, "little") + bytes(12)
    harness = SimpleNamespace(backend="cuda", snapshot=SimpleNamespace(
        manifest=_Manifest(params, (98, 1, 1), (128, 1, 1), _inductor_meta()),
        kernarg=lambda: kernarg))
    context = Context(work=tmp_path)
    got = {mode: (p, entry) for mode, p, entry in tr.TritonRetune().baselines(
        harness, context, {"coordinate-descent": same, "max-autotune": {}})}
    p, entry = got["coordinate-descent"]
    assert p is None and entry["same_as_ref"] and entry["speedup"] == 1.0
    p, entry = got["max-autotune"]
    assert p is None and not entry["found"] and "no kernel with this source" in entry["reason"]
    # A dispatch whose grid the formula does not give: XBLOCK cannot move there.
    harness.snapshot.manifest = _Manifest(params, (7, 1, 1), (128, 1, 1), _inductor_meta())
    ((mode, p, entry),) = tr.TritonRetune().baselines(harness, context,
                                                      {"coordinate-descent": cd})
    assert p is None and entry["found"] and "cannot change (captured 1024; no grid " \
        "formula)" in entry["reason"]


def test_baseline_options_are_checked_before_anything_runs(snapshot, tmp_path, capsys):
    common = ["optimize", "-o", str(tmp_path / "rel"), "--snapshot", str(snapshot)]
    assert kpair([*common, "--inductor-baseline"]) == 2
    assert "--inductor-baseline captures the program again" in capsys.readouterr().err
    assert kpair([*common, "--baseline-capture", "fastest=x"]) == 2
    assert "MODE one of coordinate-descent, max-autotune" in capsys.readouterr().err
    assert kpair([*common, "--baseline-capture", f"max-autotune={tmp_path}"]) == 2
    assert "holds no capture.json" in capsys.readouterr().err
    assert not (tmp_path / "rel").exists()
