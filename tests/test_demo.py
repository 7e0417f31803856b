"""``kpair demo`` end to end through the CLI, and what it refuses."""

from __future__ import annotations

import shutil

import pytest

from kpair import release
from kpair.cli import main as kpair
from kpair.demo import OPERATORS, run_demo
from kpair.optimize.director import DirectorValidation
from kpair.session import read_attempts


def test_demo_builds_verifies_and_reports_a_release(tmp_path, capsys):
    out = tmp_path / "demo"
    assert kpair(["demo", "--out", str(out), "--time-cap", "0.4"]) == 0
    printed = capsys.readouterr().out
    assert f"index:  {out / 'index.json'}" in printed
    assert "DELIBERATELY WRONG" in printed and "excluded as intended" in printed

    idx = release.load_index(out)
    rows = {r.name: r for r in idx.operators}
    assert all(r.status == "pass" for r in rows.values())
    # Only real gains on this machine are published: a correct opt whose CI is not above 1.0
    # here is refused with that reason (on a quiet machine there is none).
    slow = {r.name: r for r in idx.refused if r.status == "pass"}
    assert all(r.reason.startswith("not faster") for r in slow.values())
    correct = {**rows, **slow}
    assert len(correct) == 4 and {r.level for r in correct.values()} == {1, 2}
    modes = {r.correctness.mode for r in correct.values()}
    criteria = {t.criterion for r in correct.values() for t in r.correctness.tolerances or []}
    assert "byte-exact" in modes and {"cosine", "scalar_rtol"} <= criteria
    frob = correct["37_FrobeniusNorm_"].correctness.tolerances[0]
    assert frob.threshold == {"rtol": 1e-6} and frob.measured <= 1e-6
    # Honest optimizations: every published opt measured faster, with its CI above 1.
    for r in rows.values():
        assert r.harness.ci95[0] > 1.0, (r.name, r.harness)
        assert r.director.reference_only is True and r.director.speedup > 0
    # The deliberately wrong operator is refused and kept out of both geomeans.
    (wrong,) = [r for r in idx.refused if r.status != "pass"]
    assert wrong.name == "21_Sigmoid" and wrong.status == "fail"
    s = idx.summary
    assert s.harness_geomean_over == s.director_geomean_over == len(rows)
    assert s.counts.excluded == 1 + len(slow)
    assert (out / "report.md").is_file()
    pytest.importorskip("matplotlib")
    assert "<svg" in (out / "report.html").read_text()
    # Provenance as the seed laid it out, beside each harness.
    prov = out / "level2" / "76_Gemm_Add_ReLU" / "provenance"
    director = DirectorValidation.read(prov / "director_validation.json")
    assert director.reference_only and director.strategy == "demo"
    assert director.speedup == rows["76_Gemm_Add_ReLU"].director.speedup
    (attempt,) = read_attempts(prov / "attempts.jsonl")
    assert attempt.status == "pass" and (prov / attempt.result).is_file()
    # The wrong operator has no Director number: its opt did not pass the session either.
    wrong_prov = out / "excluded" / "level1" / "21_Sigmoid" / "provenance"
    assert not (wrong_prov / "director_validation.json").exists()
    assert read_attempts(wrong_prov / "attempts.jsonl")[0].status == "fail"
    # Each operator's note speaks of what its opt does on the backend that ran it.
    assert "shared-memory" not in printed and "register blocks" in printed


def test_demo_excludes_an_operator_that_is_not_faster_here(tmp_path, monkeypatch):
    from kpair.release import store

    monkeypatch.setattr(store, "not_faster", lambda speed: "not faster: forced by the test")
    lines = []
    result = run_demo(tmp_path / "d", operators=OPERATORS[:1], time_cap_s=0.3,
                      log=lines.append)
    assert result.as_expected  # correct as intended; the speed is the machine's
    idx = release.load_index(tmp_path / "d")
    assert idx.operators == [] and not (tmp_path / "d" / "level1").exists()
    (row,) = idx.refused
    assert row.status == "pass" and row.reason == "not faster: forced by the test"
    assert any("excluded:" in line and "forced by the test" in line and "not wrong" in line
               for line in lines)


def test_demo_operators_cover_the_brief():
    levels = {op.level for op in OPERATORS}
    assert levels == {1, 2}
    assert sum(op.expect == "pass" for op in OPERATORS) >= 4


def test_demo_refuses_a_non_empty_out(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("keep me")
    assert kpair(["demo", "--out", str(tmp_path)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]


def test_demo_cuda_kernels_build_with_nvcc(tmp_path):
    """Every operator's .cu source builds for sm_90 in both variants and exports its symbol."""
    from importlib import resources

    from kpair.demo import OPERATORS
    from kpair.snapshot import detect_format
    from kpair.toolchain import compile_cuda

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed")
    for op in OPERATORS:
        with resources.as_file(resources.files("kpair.demo") / "csrc" / f"{op.source}.cu") as src:
            for variant in (0, 1):
                cubin = compile_cuda(src, tmp_path / f"{op.source}{variant}.cubin",
                                     defines={"KP_OPT": variant}).read_bytes()
                assert detect_format(cubin) == "cubin"
                assert op.symbol.encode() + b"\0" in cubin


def test_demo_cuda_without_the_driver_says_how_to_install(tmp_path, capsys):
    try:
        import cuda.bindings.driver  # noqa: F401
        pytest.skip("cuda-bindings is installed here; the GPU run is tests/gpu/test_cuda_demo.py")
    except ImportError:
        pass
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed (the demo builds its CUDA kernels first)")
    assert kpair(["demo", "--out", str(tmp_path / "d"), "--backend", "cuda"]) == 4
    assert "pip install 'kpair[cuda]'" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
