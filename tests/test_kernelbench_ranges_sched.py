"""benchmarks/kb_pipeline.py (the KernelBench drivers' scheduler) and kernelbench_ranges.py's
driver, without a GPU and without torch: stand-in stages record when they hold the GPU; the
checks are on order and overlap, never on durations.

- the gate: a timed stage that asks goes before shared holders that come after it, and holds
  the GPU alone (a captured program's own hold, through ``KB_GPU_GATE``, included);
- the scheduler: untimed stages run several at a time, no timed stage overlaps any of them,
  the deadline stops new work (by the estimates, on a clock the test moves), a second call
  finishes a half-done problem from its first missing stage;
- the driver: every problem's row carries its breakdown, a resumed call skips what is decided
  and runs only what is missing.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


def _load(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


kp = _load("kb_pipeline")
kr = _load("kernelbench_ranges")


# --------------------------------------------------------------------------- the gate

def _turnstile_taken(gate) -> bool:
    with open(gate.turn, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def test_a_waiting_timed_stage_goes_before_later_shared_holders(tmp_path):
    gate = kp.Gate(tmp_path / "gate")
    events: list[str] = []
    first = gate.acquire_shared()

    def writer():
        with gate.exclusive():
            events.append("timed")

    def reader():
        with gate.shared():
            events.append("later shared")

    w = threading.Thread(target=writer)
    w.start()
    for _ in range(2000):   # until the writer holds the turnstile (it waits for `first`)
        if _turnstile_taken(gate):
            break
        time.sleep(0.005)
    else:
        pytest.fail("the writer never took the turnstile")
    r = threading.Thread(target=reader)
    r.start()
    assert events == []   # the writer waits for the shared holder in flight
    gate.release(first)
    w.join(30)
    r.join(30)
    assert events == ["timed", "later shared"]


CHILD = """
import json, os, sys, time
sys.path.insert(0, {bench!r})
import kb_pipeline
kb_pipeline.hold_gate_from_env()
t0 = time.monotonic()
time.sleep(0.2)
with open({out!r}, "a") as f:
    f.write(json.dumps({{"job": sys.argv[1], "start": t0, "end": time.monotonic()}}) + "\\n")
"""


# --------------------------------------------------------------------------- the scheduler

class StandIns:
    """Stages that record when they held the GPU: the capture a program of its own that takes
    the gate itself (KB_GPU_GATE), replay and pair in the scheduler's pool, run and rerun
    timed. ``calls`` counts each stage's calls per job."""

    def __init__(self, tmp_path: Path, gate, *, est=1.0, fail=(), cut_timed_of=()):
        self.tmp, self.gate, self.est = tmp_path, gate, est
        self.fail, self.cut_timed_of = set(fail), set(cut_timed_of)
        self.gpu = tmp_path / "gpu.jsonl"
        self.script = tmp_path / "child.py"
        self.script.write_text(CHILD.format(bench=str(BENCH), out=str(self.gpu)))
        self.calls: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.inflight = self.most = 0

    def _note(self, job, stage, start, end):
        with self.lock, open(self.gpu, "a") as f:
            f.write(json.dumps({"job": job.key, "stage": stage, "start": start,
                                "end": end}) + "\n")

    def capture(self, job, timeout):
        self.calls.append((job.key, "capture"))
        subprocess.run([sys.executable, str(self.script), job.key], check=True, timeout=60,
                       env={"KB_GPU_GATE": str(self.gate.folder), "PATH": "/usr/bin:/bin"})
        if job.key in self.fail:
            return {"stop": "program failed"}
        return {"capture_s": 0.2}

    def untimed(self, name):
        def stage(job, timeout):
            self.calls.append((job.key, name))
            with self.lock:
                self.inflight += 1
                self.most = max(self.most, self.inflight)
            t0 = time.monotonic()
            time.sleep(0.2)
            self._note(job, name, t0, time.monotonic())
            with self.lock:
                self.inflight -= 1
            return {f"{name}_s": 0.2}
        return stage

    def timed(self, name):
        def stage(job, timeout):
            self.calls.append((job.key, name))
            if job.key in self.cut_timed_of:
                return {"cut": True}
            t0 = time.monotonic()
            time.sleep(0.05)
            self._note(job, name, t0, time.monotonic())
            return {"status": "pass", "s": 0.05}
        return stage

    def stages(self):
        return [kp.Stage("capture", self.capture, self.est, gate_inside=True),
                kp.Stage("replay", self.untimed("replay"), self.est),
                kp.Stage("pair", self.untimed("pair"), self.est),
                kp.Stage("run", self.timed("run"), self.est, timed=True),
                kp.Stage("rerun", self.timed("rerun"), self.est, timed=True)]

    def intervals(self):
        rows = [json.loads(x) for x in self.gpu.read_text().splitlines()]
        for r in rows:
            r.setdefault("stage", "capture")
        return rows


def jobs_of(tmp_path: Path, n: int) -> list:
    return [kp.Job(f"p{i}", tmp_path / "work" / f"p{i}").load() for i in range(1, n + 1)]


def test_untimed_stages_share_the_gpu_and_no_timed_stage_overlaps_them(tmp_path):
    gate = kp.Gate(tmp_path / "gate")
    s = StandIns(tmp_path, gate, fail={"p3"})
    finished = []
    sched = kp.Scheduler(s.stages(), jobs=3, deadline=time.monotonic() + 3600, gate=gate,
                         finish=lambda j: finished.append(j.key), timed_batch=2)
    decided = sched.run(jobs_of(tmp_path, 6))
    assert sorted(finished) == [f"p{i}" for i in range(1, 7)] == sorted(j.key for j in decided)
    assert sched.left == []
    gpu = s.intervals()
    timed = [g for g in gpu if g["stage"] in ("run", "rerun")]
    untimed = [g for g in gpu if g["stage"] not in ("run", "rerun")]
    assert len(timed) == 2 * 5 and len([g for g in untimed if g["stage"] == "capture"]) == 6
    clash = [(t, u) for t in timed for u in untimed
             if t["start"] < u["end"] and u["start"] < t["end"]]
    assert clash == []
    assert not any(a["start"] < b["end"] and b["start"] < a["end"]
                   for a in timed for b in timed if a is not b)   # one at a time
    assert s.most >= 2   # the pool ran untimed stages side by side
    assert kp.overlaps([e for e in sched.log if e["stage"] != "capture"]) == []
    # the failed capture stopped its problem: nothing after it ran
    assert [c for c in s.calls if c[0] == "p3"] == [("p3", "capture")]
    for j in decided:
        assert json.loads((j.folder / "state.json").read_text()) == j.state


class Clock:
    """A clock the stand-in stages move: each stage takes 10 of its seconds."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_the_deadline_stops_new_work_by_the_estimates(tmp_path):
    clock = Clock()
    ran: list[tuple[str, str]] = []

    def stage(name):
        def run(job, timeout):
            ran.append((job.key, name))
            clock.now += 10
            return {}
        return run

    stages = [kp.Stage("capture", stage("capture"), 10.0, gate_inside=True),
              kp.Stage("pair", stage("pair"), 10.0),
              kp.Stage("run", stage("run"), 10.0, timed=True)]
    gate = kp.Gate(tmp_path / "gate")
    finished = []
    # 35 s: the first problem's 30 s fit; a second would need its 30 s and the first's run
    sched = kp.Scheduler(stages, jobs=1, deadline=35.0, gate=gate, clock=clock,
                         finish=lambda j: finished.append(j.key))
    sched.run(jobs_of(tmp_path, 3))
    assert finished == ["p1"]
    assert [j.key for j in sched.left] == ["p2", "p3"]
    assert all(k == "p1" for k, _ in ran)
    # no time at all for a stage: nothing starts
    ran.clear()
    sched = kp.Scheduler(stages, jobs=1, deadline=clock.now + 5, gate=gate, clock=clock,
                         finish=lambda j: finished.append(j.key))
    sched.run(jobs_of(tmp_path, 3)[1:])
    assert ran == [] and [j.key for j in sched.left] == ["p2", "p3"]


def test_a_second_call_finishes_a_half_done_problem_from_its_missing_stage(tmp_path):
    gate = kp.Gate(tmp_path / "gate")
    s = StandIns(tmp_path, gate, cut_timed_of={"p2"})
    first = kp.Scheduler(s.stages(), jobs=2, deadline=time.monotonic() + 3600, gate=gate,
                         finish=lambda j: None)
    decided = first.run(jobs_of(tmp_path, 2))
    assert [j.key for j in decided] == ["p1"] and [j.key for j in first.left] == ["p2"]
    assert set(kp.Job("p2", tmp_path / "work" / "p2").load().state) == {
        "capture", "replay", "pair"}   # the cut run left no record
    (tmp_path / "again").mkdir()
    s2 = StandIns(tmp_path / "again", gate)
    second = kp.Scheduler(s2.stages(), jobs=2, deadline=time.monotonic() + 3600, gate=gate,
                          finish=lambda j: None)
    done = second.run([kp.Job("p2", tmp_path / "work" / "p2").load()])
    assert [j.key for j in done] == ["p2"]
    assert s2.calls == [("p2", "run"), ("p2", "rerun")]


def test_a_half_done_problem_is_kept_at_its_scale_and_dropped_at_another(tmp_path):
    folder = tmp_path / "p1"
    kp.Job("p1", folder, state={"capture": {"scale": 2}, "replay": {}}).save()
    sizes = {"p1": {"state_bytes": 1000}}
    job, nbytes = kr.scaled_job("p1", folder, {"n": 1}, 2, sizes)
    assert set(job.state) == {"capture", "replay"} and job.data == {"n": 1} and nbytes == 500
    job, nbytes = kr.scaled_job("p1", folder, {}, 4, sizes)
    assert job.state == {} and not folder.exists() and nbytes == 250
    job, nbytes = kr.scaled_job("p2", tmp_path / "p2", {}, 1, sizes)   # no probe: 0 bytes
    assert job.state == {} and nbytes == 0


def test_default_jobs_are_bounded_by_cpus_and_gpu_memory():
    assert kp.default_jobs(16, gpu_bytes=80 << 30, per_job_bytes=64 << 20) == 8
    assert kp.default_jobs(16, gpu_bytes=80 << 30, per_job_bytes=20 << 30) == 2
    assert kp.default_jobs(1, gpu_bytes=80 << 30, per_job_bytes=0) == 1
    assert kp.default_jobs(64, gpu_bytes=8 << 30, per_job_bytes=100 << 30) == 1


# --------------------------------------------------------------------------- the driver

def fake_kpair(calls: list, *, cut_run_of=(), fail_run=False):
    """A stand-in for ``kernelbench_ranges.kpair_cmd``: capture writes what the child and a
    range capture would (marks.json with its timings, two snapshot.json); replay answers
    byte-exact; pair makes the harness; run writes a result (exit 124 for ``cut_run_of``)."""
    def call(*args, timeout, env=None):
        calls.append(args)
        verb = args[0]
        if verb == "capture":
            assert env and "KB_GPU_GATE" in env and "TORCHINDUCTOR_CACHE_DIR" in env
            cap = Path(args[args.index("-o") + 1])
            plan = json.loads(Path(args[-1]).read_text())
            marks = []
            for p in plan["problems"]:
                for name in kr.range_names(p["number"]):
                    (cap / name).mkdir(parents=True)
                    (cap / name / "snapshot.json").write_text(json.dumps({
                        "ops": [{}, {}], "regions": [
                            {"name": "x", "size": 4096, "role": "in"},
                            {"name": "y", "size": 4096, "role": "out"}]}))
                marks.append({"number": p["number"], "ok": True, "import_s": 4.0,
                              "gate_wait_s": 0.0, "setup_s": 0.5, "compile_s": 12.0,
                              "ranges_s": 0.3})
            Path(plan["marks"]).write_text(json.dumps(marks))
            return {"exit_code": 0, "stdout": "", "stderr": "", "s": 20.0}
        if verb == "replay":
            return {"exit_code": 0, "stdout": json.dumps({"status": "byte-exact"}),
                    "stderr": "", "s": 3.0}
        if verb == "pair":
            Path(args[args.index("-o") + 1]).mkdir(parents=True)
            return {"exit_code": 0, "stdout": "{}", "stderr": "", "s": 5.0}
        if verb == "run":
            assert args[args.index("--time-cap") + 1] == "2.0"
            harness = Path(args[1])
            if harness.parent.name in cut_run_of:
                return {"exit_code": 124, "stdout": "", "stderr": "timed out", "s": 1.0}
            out = Path(args[args.index("-o") + 1])
            status = "fail" if fail_run else "pass"
            out.write_text(json.dumps({
                "status": status, "stage_s": {"measure": 2.0, "control": 2.0},
                "speed": {"speedup": 1.5 if out.name == "r1.json" else 1.51,
                          "combined_ci95": [1.45, 1.55], "stopped_by": "time_cap",
                          "blocks": 300}}))
            return {"exit_code": 0 if status == "pass" else 1, "stdout": "", "stderr": "",
                    "s": 8.0}
        raise AssertionError(args)
    return call


def driver_args(tmp_path: Path, *extra: str) -> list[str]:
    level = tmp_path / "KernelBench" / "level2"
    level.mkdir(parents=True, exist_ok=True)
    for name in ("1_Conv2D_ReLU_BiasAdd", "2_Gemm_Scale", "3_Matmul_Sum"):
        (level / f"{name}.py").write_text("batch_size = 64\n")
    return ["run", "--kernelbench", str(tmp_path / "KernelBench"), "-o", str(tmp_path / "OUT"),
            "--work", str(tmp_path / "work"), "--sizes", str(tmp_path / "none.json"),
            "--jobs", "2", *extra]


def rows_of(tmp_path: Path) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / "OUT" / "results.jsonl").read_text()
            .splitlines()]


def test_the_driver_records_each_problems_breakdown_and_resumes(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(kr, "kpair_cmd", fake_kpair(calls, cut_run_of={"p3"}))
    assert kr.main(driver_args(tmp_path)) == 3   # p3's run was cut: left for the next call
    rows = {r["key"]: r for r in rows_of(tmp_path)}
    assert set(rows) == {"level2/1_Conv2D_ReLU_BiasAdd", "level2/2_Gemm_Scale"}
    row = rows["level2/2_Gemm_Scale"]
    assert row["outcome"] == "pass" and row["rerun_inside"] is True
    assert row["breakdown"] == {"capture_s": 20.0, "import_s": 4.0, "gate_wait_s": 0.0,
                                "setup_s": 0.5, "compile_s": 12.0, "ranges_s": 0.3,
                                "replay_s": row["breakdown"]["replay_s"], "pair_s": 5.0,
                                "run_s": 8.0, "rerun_s": 8.0}
    assert row["runs"][0]["stage_s"] == {"measure": 2.0, "control": 2.0}
    assert row["runs"][0]["stopped_by"] == "time_cap" and row["runs"][0]["blocks"] == 300
    assert row["eager_replay"]["verdict"] == "byte-exact"
    assert not (tmp_path / "work" / "p2").exists()   # decided: its folder is gone
    state = json.loads((tmp_path / "work" / "p3" / "state.json").read_text())
    assert set(state) == {"capture", "replay", "pair"}
    schedule = json.loads((tmp_path / "OUT" / "schedule.json").read_text())
    assert schedule["left"] == ["level2/3_Matmul_Sum"] and schedule["jobs"] == 2
    summary = json.loads((tmp_path / "OUT" / "summary.json").read_text())
    assert summary["passed"] == 2 and summary["rerun_inside"] == 2
    assert summary["breakdown_total_s"]["compile_s"] == 24.0
    assert summary["breakdown_total_s"]["run_s"] == 16.0

    calls.clear()   # the next call: only p3's timed runs are missing
    monkeypatch.setattr(kr, "kpair_cmd", fake_kpair(calls))
    assert kr.main(driver_args(tmp_path)) == 0
    assert [c[0] for c in calls] == ["run", "run"]
    assert all("p3" in c[1] for c in calls)
    assert [r["key"] for r in rows_of(tmp_path)][-1] == "level2/3_Matmul_Sum"
    calls.clear()   # and a third has nothing to do
    assert kr.main(driver_args(tmp_path)) == 0 and calls == []


def test_a_failed_first_run_is_not_run_again(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(kr, "kpair_cmd", fake_kpair(calls, fail_run=True))
    assert kr.main(driver_args(tmp_path, "--count", "1")) == 0
    (row,) = rows_of(tmp_path)
    assert row["outcome"] == "fail" and len(row["runs"]) == 1
    assert [c[0] for c in calls].count("run") == 1
    # Its folder is gone, its JSON files (no blob) kept to say why: manifests, the result.
    diag = tmp_path / "OUT" / "diag" / "p1"
    assert not (tmp_path / "work" / "p1").exists()
    kept = {f.relative_to(diag).as_posix() for f in diag.rglob("*.json")}
    assert {"cap/p1.eager/snapshot.json", "cap/p1.compiled/snapshot.json", "r1.json"} <= kept


def test_no_problem_starts_past_the_deadline(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(kr, "kpair_cmd", fake_kpair(calls))
    assert kr.main(driver_args(tmp_path, "--deadline", "30")) == 3   # < capture+...+rerun
    assert calls == [] and not (tmp_path / "OUT" / "results.jsonl").exists()


def test_cli_help():
    proc = subprocess.run([sys.executable, str(BENCH / "kernelbench_ranges.py"), "run",
                           "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--jobs" in proc.stdout and "--time-cap" in proc.stdout


def test_a_capture_that_cannot_start_stops_the_call_and_blames_no_problem(tmp_path,
                                                                         monkeypatch):
    calls: list = []

    def no_gpu(*args, timeout, env=None):
        calls.append(args[0])
        return {"exit_code": 4, "stdout": "", "s": 0.5, "stderr": (
            "kpair capture: the NVIDIA driver library (libcuda.so.1) cannot be loaded\n"
            "kpair capture: the program ended with status 4 and left no capture.json: "
            "capture did not start")}

    monkeypatch.setattr(kr, "kpair_cmd", no_gpu)
    with pytest.raises(SystemExit, match="capture did not start"):
        kr.main(driver_args(tmp_path, "--jobs", "1"))
    assert calls == ["capture"]   # nothing started after the first
    assert not (tmp_path / "OUT" / "results.jsonl").exists()
    schedule = json.loads((tmp_path / "OUT" / "schedule.json").read_text())
    assert len(schedule["left"]) == 3 and "capture did not start" in schedule["aborted"]


def test_the_call_model_serializes_the_timed_stages_and_respects_the_deadline():
    free = kp.simulate(30, jobs=8, pool_s=60, timed_s=16)
    assert free["decided"] == 30 and free["timed_s"] == 30 * 16
    assert free["expected_s"] >= free["timed_s"] + 60   # the timed stages never overlap
    more = kp.simulate(30, jobs=16, pool_s=60, timed_s=16)
    assert more["expected_s"] <= free["expected_s"]
    cut = kp.simulate(30, jobs=8, pool_s=60, timed_s=16, deadline=300)
    assert cut["decided"] < 30 and cut["expected_s"] <= 300
    assert kp.simulate(3, jobs=8, pool_s=60, timed_s=16, deadline=50)["decided"] == 0


def test_plan_prints_the_expected_call(capsys):
    assert kr.main(["plan", "--count", "4", "--jobs", "2", "--stage-s",
                    '{"capture": 10, "replay": 0, "pair": 0, "run": 1, "rerun": 1}']) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["decided"] == 4 and doc["timed_s"] == 8 and doc["deadline"] is None
    with pytest.raises(SystemExit, match="JSON object of capture, replay"):
        kr.main(["plan", "--stage-s", "[1]"])


def test_the_child_under_a_torch_stand_in_marks_each_problem(tmp_path, monkeypatch):
    import kpair
    from kb_problems import FakeMarks, FakeTorch, write_fake

    torch, ranges = FakeTorch().install(monkeypatch), FakeMarks()
    monkeypatch.setattr(kpair, "mark", ranges)
    monkeypatch.delenv(kp.GATE_ENV, raising=False)
    problems = kr.kb.discover(write_fake(tmp_path / "kb", 2, {
        "1_Good": None, "2_Init": "init", "3_Oom": "oom"}), [2])
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"marks": str(tmp_path / "marks.json"),
                                "problems": [kr.entry_of(p, 1) for p in problems]}))
    assert kr.main(["child", str(plan)]) == 0
    marks = json.loads((tmp_path / "marks.json").read_text())
    assert [(m["number"], m["ok"]) for m in marks] == [(1, True), (2, False), (3, False)]
    assert marks[0]["output_shape"] == [4, 5] and marks[0]["output_dtype"] == "torch.float32"
    assert all(marks[0][k] >= 0 for k in ("setup_s", "compile_s", "ranges_s"))
    assert marks[1]["error"] == "ValueError: no such layer" and "setup_s" not in marks[1]
    assert marks[2]["error"] == "OutOfMemoryError: CUDA out of memory"
    assert "out_of_memory" not in marks[2] and "ranges_s" not in marks[2]
    assert marks[0]["import_s"] >= 0 and [m["import_s"] for m in marks[1:]] == [0.0, 0.0]
    assert [m["gate_wait_s"] for m in marks] == [0.0, 0.0, 0.0]   # no gate named
    assert ranges.ranges == ["p1.eager", "p1.compiled"]
    assert torch.compiles == [(None, {}), (None, {})]   # 2_Init never had a model
    assert torch.calls.count("dynamo_reset") == torch.calls.count("empty_cache") == 3
