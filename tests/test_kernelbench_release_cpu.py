"""benchmarks/kernelbench_release.py's orchestration on the CPU (no torch, no GPU): the capture
step is a stand-in that records host ranges in this process (tests/csrc/range_ops.c: ref =
matmul, bias, ReLU; candidates bound by --opt-capture), everything after it is the driver's
own: the eager range's replay verdict (a real ``kpair replay``), the policy from
kernelbench_ranges, the contests, the tournament, the release, the run log, the report. A
second call skips the problems the release decided and captures only the one left."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from conftest import MlpRanges
from kb_problems import FakeMarks, FakeTorch, write_fake
from kpair.options import RunOptions
from kpair.release import load_index
from kpair.release.tournament import RunLog

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import kernelbench as kb  # noqa: E402
import kernelbench_release as krel  # noqa: E402

N = 128
OPTIONS = RunOptions(time_cap_s=2.0, timeout_s=300)


def _problem(level: int, name: str) -> kb.Problem:
    return kb.Problem(level, int(name.split("_")[0]), name, Path(f"/nonexistent/{name}.py"))


PROBLEMS = [_problem(2, "76_Gemm_Add_ReLU"), _problem(2, "77_Wrong"), _problem(1, "3_Big"),
            _problem(1, "5_Cut"), _problem(1, "6_Nondet"), _problem(1, "7_Slow")]


class StandIn:
    """The capture step on host ranges: per problem what a GPU capture would hand over."""

    def __init__(self, lib: Path):
        self.lib, self.asked, self.calls = lib, [], 0

    def __call__(self, batch, work: Path, timeout: float) -> dict:
        self.calls += 1
        self.asked.append([p.key for p in batch])
        out = {}
        for p in batch:
            if p.name == "3_Big":
                out[p.key] = krel.Captured(did_not_fit="90.0 GiB at KernelBench's sizes")
                continue
            if p.name == "7_Slow":   # its capture runs out of time on every call
                out[p.key] = krel.Captured(cut=True, timed_out=True)
                continue
            if p.name == "5_Cut":
                first = sum(p.key in keys for keys in self.asked) == 1
                out[p.key] = krel.Captured(cut=True) if first else \
                    krel.Captured(failed="the captured program died (exit -9)")
                continue
            m, d = MlpRanges(self.lib, N, seed=3), work / p.name
            d.mkdir()
            ref = m.ref(d / "eager")
            three = m.three

            def cand(name: str, calls: list, scratch: bool = False, m=m, d=d) -> Path:
                return m.candidate(d / name, calls, scratch)

            if p.name == "76_Gemm_Add_ReLU":
                cands = {"inductor-default": cand("twice", three + three),
                         "max-autotune": cand("no_bias", [three[0], three[2]]),
                         "fused": cand("fused", m.fused, scratch=True)}
            elif p.name == "77_Wrong":
                cands = {"inductor-default": cand("no_relu", three[:2]),
                         "coordinate-descent": cand("no_bias", [three[0], three[2]])}
            else:
                cands = {"inductor-default": cand("twice", three + three)}
            out[p.key] = krel.Captured(ref=ref, candidates=cands, notes=["host stand-in"])
        return out


def _search(p, ref: Path, candidates: dict, work: Path, seconds: float) -> tuple:
    """A stand-in for kpair's search: the fused capture, where the stand-in made one."""
    fused = candidates.pop("fused", None)
    if fused is None:
        return None, "kpair-search: nothing found (stand-in)"
    return krel.Entrant("kpair-search", fused, note="stand-in search"), None


@pytest.fixture(scope="module")
def lib(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("kbrel")
    return MlpRanges.build(d)


def _verdict(snap: Path) -> tuple[str, str | None]:
    if "6_Nondet" in str(snap):
        return "nondeterministic", '{"unstable": ["out"]}'
    return krel.replay_verdict(snap, 2, 300)


def test_orchestrate_publishes_excludes_and_resumes(lib, tmp_path):
    rel, work = tmp_path / "rel", tmp_path / "work"
    capture = StandIn(lib)
    lines: list[str] = []
    first = krel.orchestrate(PROBLEMS, rel, work, capture, options=OPTIONS,
                             deadline=time.monotonic() + 3600, batch=2, margin=5,
                             verdict=_verdict, search=_search, allow_slower=True,
                             log=lines.append)
    assert capture.asked == [["level2/76_Gemm_Add_ReLU", "level2/77_Wrong"],
                             ["level1/3_Big", "level1/5_Cut"], ["level1/6_Nondet", "level1/7_Slow"]]
    assert sorted(first["decided"]) == ["level1/3_Big", "level1/6_Nondet",
                                        "level2/76_Gemm_Add_ReLU", "level2/77_Wrong"]
    assert first["left"] == 2 and first["skipped"] == 0
    assert "kernelbench_release: level1/5_Cut: left for the next call" in lines
    assert json.loads((rel / krel.TIMEOUTS).read_text()) == {"level1/7_Slow": 1}
    index = load_index(rel)
    (row,) = index.operators
    assert row.key == (2, "76_Gemm_Add_ReLU") and row.producer == "kpair-search"
    assert [(e.producer, e.status) for e in row.entrants] == [
        ("inductor-default", "pass"), ("max-autotune", "fail"), ("kpair-search", "pass")]
    # The judged policy is kernelbench_ranges' allclose on the range's output.
    assert row.correctness.mode == "tolerance"
    assert [t.criterion for t in row.correctness.tolerances] == ["allclose"]
    why = {r.name: r.exclusion for r in index.refused}
    assert why == {"77_Wrong": "wrong-under-every-candidate", "3_Big": "did-not-fit",
                   "6_Nondet": "nondeterministic-ref"}
    rec = json.loads((rel / row.paths.provenance / "tournament.json").read_text())
    assert "host stand-in" in rec["notes"] and "plan, retune: not made by this driver" \
        in rec["notes"]
    assert (rel / "report.md").is_file()
    (head,) = [x for x in lines if "published," in x]
    assert head.startswith("kernelbench_release: 1 published, 3 excluded") and "seed 1.3637x" \
        in head
    doc = json.loads((rel / "report.json").read_text())
    assert doc["producers"]["summary"]["published"] == 1
    assert doc["producers"]["summary"]["excluded"] == {
        "wrong-under-every-candidate": 1, "did-not-fit": 1, "nondeterministic-ref": 1}

    # The second call: only the problem left is captured; the decided ones are skipped.
    index_before = (rel / "level2" / "76_Gemm_Add_ReLU" / "harness" / "result.json").read_bytes()
    second = krel.orchestrate(PROBLEMS, rel, work, capture, options=OPTIONS,
                              deadline=time.monotonic() + 3600, batch=2, margin=5,
                              verdict=_verdict, search=_search, log=lines.append)
    assert capture.asked[-1] == ["level1/5_Cut", "level1/7_Slow"] and len(capture.asked) == 4
    assert second == {"decided": ["level1/5_Cut", "level1/7_Slow"], "skipped": 4, "left": 0}
    index = load_index(rel)
    why = {r.name: (r.exclusion, r.reason) for r in index.refused}
    assert why["5_Cut"][0] == "capture-failed"
    assert why["7_Slow"] == ("did-not-fit", "its capture did not finish in the time of a call, "
                                            "2 times")
    assert (rel / "level2" / "76_Gemm_Add_ReLU" / "harness" / "result.json").read_bytes() \
        == index_before
    log = RunLog.load(rel)
    assert [len(c.decided) for c in log.calls] == [4, 2] and log.calls[1].skipped == 4
    doc = json.loads((rel / "report.json").read_text())
    assert doc["producers"]["summary"]["wall_s"] == log.wall_s
    # A third call has nothing to do and captures nothing.
    third = krel.orchestrate(PROBLEMS, rel, work, capture, options=OPTIONS,
                             deadline=time.monotonic() + 3600, verdict=_verdict, log=lines.append)
    assert third == {"decided": [], "skipped": 6, "left": 0} and len(capture.asked) == 4


def test_a_call_out_of_time_starts_no_batch(lib, tmp_path):
    capture = StandIn(lib)
    got = krel.orchestrate(PROBLEMS, tmp_path / "rel", tmp_path / "w", capture,
                           options=OPTIONS, deadline=time.monotonic() + 10, margin=60,
                           verdict=_verdict, log=lambda s: None)
    assert capture.calls == 0 and got == {"decided": [], "skipped": 0, "left": 6}
    assert load_index(tmp_path / "rel") is None
    assert len(RunLog.load(tmp_path / "rel").calls) == 1


def test_release_is_a_subcommand_of_kernelbench_py():
    src = (Path(kb.__file__)).read_text()
    assert '"release"' in src and "kernelbench_release" in src


# --------------------------------------------------------------------------- the GPU child,
# on a fake torch: its ranges, producers and marks, and the capture step's reading of them.

def test_the_child_captures_eager_then_each_producer_and_the_step_reads_its_marks(
        tmp_path, monkeypatch):
    import types

    import kpair

    torch = FakeTorch(broken={"max-autotune-no-cudagraphs"}).install(monkeypatch)
    marks = FakeMarks()
    monkeypatch.setattr(kpair, "mark", marks)
    problems = kb.discover(write_fake(tmp_path / "kb", 1, {
        "1_Good": None, "2_Init": "init", "3_Oom": "oom", "4_Never": None}), [1])

    def fake_capture(*argv, timeout, env=None):
        """``kpair capture`` of the child, in this process: a snapshot folder per range the
        child marked; the program "dies" before the fourth problem."""
        assert argv[0] == "capture" and env["TORCHINDUCTOR_CACHE_DIR"]
        cap, plan = Path(argv[argv.index("-o") + 1]), Path(argv[-1])
        doc = json.loads(plan.read_text())
        doc["problems"] = doc["problems"][:3]
        plan.write_text(json.dumps(doc))
        assert krel.main(["child", str(plan)]) == 0
        for name in marks.ranges:
            (cap / name).mkdir(parents=True)
            (cap / name / "snapshot.json").write_text("{}")
        return {"exit_code": -9, "stdout": "", "stderr": "Killed", "s": 0.1}

    monkeypatch.setattr(krel.kr, "kpair_cmd", fake_capture)
    args = types.SimpleNamespace(sizes=str(tmp_path / "none.json"), capture_timeout=300,
                                 producers=list(krel.COMPILE), scale=False, budget_mib=64,
                                 max_gib=60, inductor_cache=str(tmp_path / "ind"))
    work = tmp_path / "w"
    work.mkdir()
    got = krel.capture_batch(args)(problems, work, 100.0)
    # Eager first, then the producers in order; max-autotune compiled without CUDA graphs,
    # coordinate descent with its config on (and only it).
    assert marks.ranges == ["l1p1.eager", "l1p1.inductor-default",
                            "l1p1.coordinate-descent"]
    assert torch.compiles == [(None, {}), ("max-autotune-no-cudagraphs", {}),
                              (None, {"coordinate_descent_tuning": True})]
    good = got["level1/1_Good"]
    assert good.ref == work / "cap" / "l1p1.eager"
    assert sorted(good.candidates) == ["coordinate-descent", "inductor-default"]
    assert any(n.startswith("max-autotune: not captured: RuntimeError") for n in good.notes)
    assert "no such layer" in got["level1/2_Init"].failed
    assert got["level1/3_Oom"].did_not_fit and got["level1/3_Oom"].failed is None
    assert "died" in got["level1/4_Never"].failed   # the first problem without a mark

