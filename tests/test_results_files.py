"""benchmarks/results: one file of runs per benchmark and device class, an index naming every
entry, and ``benchmarks/fold_result.py`` folding a new run in."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
_spec = importlib.util.spec_from_file_location("fold_result",
                                               ROOT / "benchmarks" / "fold_result.py")
fold_result = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fold_result)

RUN_KEYS = {"id", "date", "device", "tree", "command", "figures"}


def _run_files() -> list[Path]:
    out = []
    for p in sorted(RESULTS.glob("*.json")):
        doc = json.loads(p.read_text())
        if isinstance(doc, dict) and isinstance(doc.get("runs"), list) and \
                doc["runs"] and isinstance(doc["runs"][0], dict) and "figures" in doc["runs"][0]:
            out.append(p)
    return out


def test_files_of_runs_have_one_shape_newest_first_and_no_repeated_run():
    files = _run_files()
    assert len(files) >= 10
    for p in files:
        doc = json.loads(p.read_text())
        assert p.stem == f"{doc['benchmark']}_{doc['device_class']}", p.name
        runs = doc["runs"]
        assert all(set(r) >= RUN_KEYS for r in runs), p.name
        ids = [r["id"] for r in runs]
        assert len(ids) == len(set(ids)), (p.name, ids)
        dates = [r["date"] for r in runs]
        assert dates == sorted(dates, reverse=True), p.name
        figures = [json.dumps(r["figures"], sort_keys=True) for r in runs]
        assert len(figures) == len(set(figures)), f"{p.name}: the same figures twice"


def test_no_file_name_carries_a_session():
    named = [p.name for p in RESULTS.rglob("*") if re.search(r"session\d", p.name)]
    assert not named, named


def test_the_index_names_every_entry():
    index = (RESULTS / "README.md").read_text()
    named = set(re.findall(r"`([A-Za-z0-9_.-]+(?:\.json|/))`", index))
    present = {p.name + ("/" if p.is_dir() else "") for p in RESULTS.iterdir()
               if p.name != "README.md"}
    assert present <= named, sorted(present - named)


def test_a_cited_run_is_in_the_file_it_is_cited_from():
    """``X.json` (run `ID`)`` in the README, the docs and the evidence names a run of X."""
    cite = re.compile(r"`(?:benchmarks/results/)?([A-Za-z0-9_.-]+\.json)` \(run `([^`]+)`\)")
    bad = []
    for f in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for n, line in enumerate(f.read_text().splitlines(), 1):
            for name, rid in cite.findall(line):
                doc = json.loads((RESULTS / name).read_text())
                if rid not in {r["id"] for r in doc["runs"]}:
                    bad.append(f"{f.relative_to(ROOT)}:{n}: {name} has no run {rid!r}")
    assert not bad, "\n".join(bad)


def test_fold_adds_a_run_newest_first_once(tmp_path):
    into = tmp_path / "trust_overhead_cuda_h100.json"
    doc = fold_result.new_file(into)
    assert (doc["benchmark"], doc["device_class"]) == ("trust_overhead", "cuda_h100")
    assert fold_result.new_file(tmp_path / "reproduce_small_h200.json")["benchmark"] == \
        "reproduce_small"
    old = fold_result.fold(doc, {"device": "H100", "x": 1}, date="2026-12-01", tree="aaaaaaa")
    new = fold_result.fold(doc, {"device_line": "H100, 580", "command": "c", "x": 2},
                           date="2026-12-05 10:00 UTC", tree="bbbbbbb")
    assert [r["id"] for r in doc["runs"]] == [new["id"], old["id"]]
    assert new["device"] == "H100, 580" and new["command"] == "c" and old["device"] == "H100"
    assert fold_result.fold(doc, {"device": "H100", "x": 1}) is None    # already there
    again = fold_result.fold(doc, {"x": 3}, date="2026-12-01", tree="aaaaaaa")
    assert again["id"] != old["id"] and len(doc["runs"]) == 3


def test_fold_result_command_line(tmp_path, capsys):
    out = tmp_path / "out.json"
    out.write_text(json.dumps({"benchmark": "worker_alloc", "cases": {"a": 1.5}}))
    into = tmp_path / "worker_alloc_host.json"
    assert fold_result.main([str(out), str(into), "--command", "python x.py",
                             "--device", "2 CPUs", "--tree", "abc1234"]) == 0
    doc = json.loads(into.read_text())
    (run,) = doc["runs"]
    assert run["figures"] == {"benchmark": "worker_alloc", "cases": {"a": 1.5}}
    assert (run["command"], run["device"], run["tree"]) == ("python x.py", "2 CPUs", "abc1234")
    assert fold_result.main([str(out), str(into)]) == 0
    assert "already there" in capsys.readouterr().out
    assert len(json.loads(into.read_text())["runs"]) == 1
    (tmp_path / "bad.json").write_text("{")
    assert fold_result.main([str(tmp_path / "bad.json"), str(into)]) == 2


@pytest.mark.parametrize("name", ["trust_overhead_cuda_h100.json", "reproduce_h100.json"])
def test_consolidated_runs_keep_their_figures(name):
    """The runs the docs cite most keep their figures: the H100 trust overhead of tree
    ec8a887 and the H100 publication of 2026-12-07 05:58 (78 of 78 re-runs inside)."""
    doc = json.loads((RESULTS / name).read_text())
    runs = {r["id"]: r for r in doc["runs"]}
    if name.startswith("trust"):
        assert runs["2026-12-07 ec8a887"]["figures"]["cases"]
    else:
        f = runs["2026-12-07 05:58"]["figures"]
        assert (f["compared"], f["inside"]) == (78, 78)
