"""benchmarks/kernelbench_release.py's orchestration on the CPU (no torch, no GPU): the capture
step is a stand-in that records host ranges in this process (tests/csrc/range_ops.c: ref =
matmul, bias, ReLU; candidates bound by --opt-capture), everything after it is the driver's
own: the eager range's replay verdict (a real ``kpair replay``), the policy from
kernelbench_ranges, the contests, the tournament, the release, the run log, the report. A
second call skips the problems the release decided and captures only the one left."""

from __future__ import annotations

import json
import sys
import threading
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



# --------------------------------------------------------------------------- the scheduled call:
# the same stand-in capture through kb_pipeline (untimed stages pooled under the gate, every
# timed stage alone); its release against the sequential path's.

kp = krel.kb_pipeline


class Spans(StandIn):
    """The stand-in, noting when each capture ran (it holds the GPU then) and how many ran at
    once; the recording itself one at a time (the host recorder's arrays are per problem,
    the lock only keeps the test plain)."""

    def __init__(self, lib: Path):
        super().__init__(lib)
        self.spans: list[tuple[str, float, float]] = []
        self.lock, self.record_lock = threading.Lock(), threading.Lock()
        self.inflight = self.most = 0

    def __call__(self, batch, work: Path, timeout: float) -> dict:
        with self.lock:
            self.inflight += 1
            self.most = max(self.most, self.inflight)
        t0 = time.monotonic()
        try:
            time.sleep(0.2)
            with self.record_lock:
                return super().__call__(batch, work, timeout)
        finally:
            with self.lock:
                self.inflight -= 1
                self.spans.append((batch[0].key, t0, time.monotonic()))


def _scheduled(rel: Path, work: Path, capture, lines: list, **kw) -> dict:
    return krel.scheduled(PROBLEMS, rel, work, capture, options=OPTIONS,
                          deadline=time.monotonic() + 3600, jobs=2, verdict=_verdict,
                          search=_search, allow_slower=True, capture_holds_gate=False,
                          log=lines.append, **kw)


def _decisions(rel: Path) -> dict:
    index = load_index(rel)
    return {r.key: (r.producer, r.exclusion, [(e.producer, e.status, e.winner)
                                             for e in r.entrants])
            for r in [*index.operators, *index.refused]}


def test_scheduled_release_overlaps_no_timed_run_with_a_capture_and_matches_sequential(
        lib, tmp_path):
    seq = tmp_path / "seq"
    for _ in range(2):   # the sequential path: two calls (5_Cut and 7_Slow need a second)
        krel.orchestrate(PROBLEMS, seq, tmp_path / "wseq", StandIn(lib) if _ == 0 else
                         _SecondCall(lib), options=OPTIONS, deadline=time.monotonic() + 3600,
                         batch=2, margin=5, verdict=_verdict, search=_search,
                         allow_slower=True, log=lambda s: None)
    rel, work, lines = tmp_path / "rel", tmp_path / "work", []
    capture = Spans(lib)
    first = _scheduled(rel, work, capture, lines)
    assert sorted(first["decided"]) == ["level1/3_Big", "level1/6_Nondet",
                                        "level2/76_Gemm_Add_ReLU", "level2/77_Wrong"]
    assert first["left"] == 2 and first["aborted"] is None
    assert json.loads((rel / krel.TIMEOUTS).read_text()) == {"level1/7_Slow": 1}
    log = first["log"]
    timed = [e for e in log if e["timed"]]
    assert {e["stage"] for e in timed} == {"search", "run"}
    assert kp.overlaps(log) == []   # no timed stage beside a capture, replay or pair
    # and by the stand-in's own clock: no capture while an entrant's run held the GPU
    assert not [(k, e["job"]) for k, s, t in capture.spans for e in timed
                if s < e["end"] and e["start"] < t]
    assert not any(a["start"] < b["end"] and b["start"] < a["end"]
                   for a in timed for b in timed if a is not b)   # one at a time
    assert capture.most >= 2   # the pool captured side by side
    assert [[k] for k in sorted(k for k, *_ in capture.spans)] == sorted(capture.asked)
    second = _scheduled(rel, work, capture, lines)
    assert sorted(second["decided"]) == ["level1/5_Cut", "level1/7_Slow"]
    assert second["skipped"] == 4 and second["left"] == 0
    assert sorted(capture.asked[-2:]) == [["level1/5_Cut"], ["level1/7_Slow"]]
    assert len(capture.asked) == 8
    # the release is the one the sequential path published, operator by operator
    assert _decisions(rel) == _decisions(seq)
    assert _decisions(rel)[(2, "76_Gemm_Add_ReLU")][0] == "kpair-search"
    rec = json.loads((rel / "level2" / "76_Gemm_Add_ReLU" / "provenance" / "tournament.json")
                     .read_text())
    srec = json.loads((seq / "level2" / "76_Gemm_Add_ReLU" / "provenance" / "tournament.json")
                      .read_text())
    assert rec["notes"] == srec["notes"] and rec["policy"] and srec["policy"]
    rows = {r["key"]: r for r in map(json.loads, (rel / krel.BREAKDOWN).read_text()
                                     .splitlines())}
    assert len(rows) == 6
    b = rows["level2/76_Gemm_Add_ReLU"]["breakdown"]
    assert sorted(b["pair_s"]) == sorted(b["run_s"]) == [
        "inductor-default", "kpair-search", "max-autotune"]
    assert b["capture_s"] >= 0.2 and b["replay_s"] >= 0 and b["search_s"] >= 0
    assert all(v > 0 for v in b["run_s"].values())
    assert rows["level1/3_Big"]["exclusion"] == "did-not-fit" and \
        rows["level1/3_Big"]["breakdown"]["run_s"] == {}
    schedule = json.loads((rel / krel.SCHEDULE).read_text())
    assert schedule["jobs"] == 2 and schedule["left"] == []
    assert [len(c.decided) for c in RunLog.load(rel).calls] == [4, 2]
    assert not [p for p in work.iterdir() if p.name != "gate"]   # decided: folders gone
    third = _scheduled(rel, work, capture, lines)
    assert third["decided"] == [] and third["skipped"] == 6 and len(capture.asked) == 8


class _SecondCall(StandIn):
    """The stand-in as a second call sees it: 5_Cut was asked once already."""

    def __init__(self, lib: Path):
        super().__init__(lib)
        self.asked = [["level1/5_Cut"]]


def test_a_half_done_problem_resumes_at_its_missing_stage(lib, tmp_path, monkeypatch):
    rel, work, lines = tmp_path / "rel", tmp_path / "work", []
    problems = PROBLEMS[:1]
    real_run = krel.Pipeline.stage_run
    ran: list[str] = []

    def cut_after_one(self, job, timeout):   # the first call's time ends at the run stage
        ran.append(job.key)
        return real_run(self, job, 1e-3 if len(ran) == 1 else timeout)

    monkeypatch.setattr(krel.Pipeline, "stage_run", cut_after_one)
    capture = StandIn(lib)
    got = krel.scheduled(problems, rel, work, capture, options=OPTIONS,
                         deadline=time.monotonic() + 3600, jobs=2, verdict=_verdict,
                         search=_search, allow_slower=True, capture_holds_gate=False,
                         log=lines.append)
    assert got["decided"] == [] and got["left"] == 1 and load_index(rel) is None
    state = json.loads((work / "l2p76" / "state.json").read_text())
    assert set(state) == {"capture", "replay", "pair", "search"}
    paired = list((work / "l2p76" / "h").iterdir())
    assert len(paired) == 3
    pair_calls: list = []
    monkeypatch.setattr(krel, "pair_entrant", lambda *a: pair_calls.append(a))
    again = krel.scheduled(problems, rel, work, capture, options=OPTIONS,
                           deadline=time.monotonic() + 3600, jobs=2, verdict=_verdict,
                           search=_search, allow_slower=True, capture_holds_gate=False,
                           log=lines.append)
    assert again["decided"] == ["level2/76_Gemm_Add_ReLU"] and again["left"] == 0
    assert capture.calls == 1 and pair_calls == []   # neither captured nor paired again
    assert [e["stage"] for e in again["log"]] == ["run"]
    assert load_index(rel).operators[0].producer == "kpair-search"


def test_release_plan_estimates_the_scheduled_call(capsys):
    assert krel.main(["plan", "--count", "200", "--jobs", "8"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # 4 entrants at kernelbench_ranges' guesses: 4 timed runs of 10 s and a 30 s search each
    assert doc["decided"] == 200 and doc["timed_s"] == 200 * (4 * 10 + 30)
    assert doc["expected_s"] >= doc["timed_s"] and doc["entrants"] == 4
    assert krel.main(["plan", "--count", "10", "--jobs", "2", "--entrants", "3",
                      "--deadline", "300"]) == 0
    cut = json.loads(capsys.readouterr().out)
    assert cut["stage_s"]["search"] == 0.0 and cut["decided"] < 10 and cut["expected_s"] <= 300
    with pytest.raises(SystemExit, match="JSON object of capture, replay, pair, search, run"):
        krel.main(["plan", "--stage-s", "[1]"])


def test_a_capture_that_cannot_start_stops_the_scheduled_call_and_excludes_nothing(
        tmp_path, monkeypatch):
    from kb_problems import write_fake

    calls: list = []

    def no_gpu(*argv, timeout, env=None):
        calls.append((argv[0], dict(env or {})))
        return {"exit_code": 4, "stdout": "", "s": 0.5, "stderr": (
            "kpair capture: the program ended with status 4 and left no capture.json: "
            "capture did not start")}

    monkeypatch.setattr(krel.kr, "kpair_cmd", no_gpu)
    root = write_fake(tmp_path / "kb", 1, {"1_Good": None, "2_Other": None})
    rel, work = tmp_path / "rel", tmp_path / "work"
    with pytest.raises(SystemExit, match="capture did not start"):
        krel.main(["--kernelbench", str(root), "-o", str(rel), "--work", str(work),
                   "--levels", "1", "--jobs", "1", "--no-search",
                   "--sizes", str(tmp_path / "none.json")])
    assert [c for c, _ in calls] == ["capture"]   # nothing started after the first
    assert calls[0][1][kp.GATE_ENV] == str(work / "gate")   # the child takes the gate
    assert load_index(rel) is None   # no problem blamed
    schedule = json.loads((rel / krel.SCHEDULE).read_text())
    assert len(schedule["left"]) == 2 and "capture did not start" in schedule["aborted"]
