"""``kpair inspect`` (kpair.describe): a harness with its last verdict read through Result."""

from __future__ import annotations

from kpair.cli import main as kpair
from kpair.describe import describe
from kpair.harness import create_harness
from kpair.isolation import run_isolated
from kpair.pipeline import RunOptions


def test_describe_shows_the_last_verdict_of_a_harness(matmul_libs, matmul_snapshot, tmp_path,
                                                      capsys):
    h = create_harness(matmul_snapshot, tmp_path / "h", opt=matmul_libs["fast"]).root
    _, text = describe(h)
    assert "last run" not in text
    result = run_isolated(h, RunOptions(time_cap_s=0.3, min_blocks=8, timeout_s=60))
    _, text = describe(h)
    assert f"last run {result.summary()}" in text
    (h / "result.json").write_text('{"schema": "kpair.result", "schema_version": 1, '
                                   '"status": "maybe"}')
    assert kpair(["inspect", str(h)]) == 0  # an unreadable output does not hide the harness
    assert "last run unreadable" in capsys.readouterr().out
