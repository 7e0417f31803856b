"""`kpair demo --backend cuda`: the demo release built from the package's CUDA kernels."""

from __future__ import annotations

import json

import pytest

from kpair.cli import main as kpair

pytestmark = pytest.mark.gpu


def test_cuda_demo_publishes_four_and_excludes_the_wrong_one(gpu_arch, tmp_path, capsys):
    out = tmp_path / "release"
    assert kpair(["demo", "--out", str(out), "--backend", "cuda"]) == 0
    printed = capsys.readouterr().out
    print(printed)  # the evidence run keeps it
    index = json.loads((out / "index.json").read_text())
    rows = {r["name"]: r for r in index["operators"]}
    assert sorted(rows) == ["1_Square_matrix_multiplication_", "23_Softmax",
                            "37_FrobeniusNorm_", "76_Gemm_Add_ReLU"]
    assert all(r["status"] == "pass" and r["backend"] == "cuda" for r in rows.values())
    assert [r["name"] for r in index["refused"]] == ["21_Sigmoid"]
    for r in rows.values():
        assert r["harness"]["ci95"][0] > 1.0, r  # every honest opt is measurably faster
    assert (out / "report.md").is_file()
