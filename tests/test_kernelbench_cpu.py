"""benchmarks/kernelbench.py without a GPU and without torch: problem discovery, the
size-scaling patcher (on a made-up problem file, not KernelBench's), the fidelity table built
from real ``kpair replay`` runs (a host snapshot, byte-exact; an incomplete CUDA one, refused),
the runner on a fake torch (with kpair's real capture Filter, whose private seen-sets it
scopes), the results file, the planner, and the driver's calls with a fake ``kpair`` (capture,
replay and optimize answered by a stand-in that writes what the real ones write). The sizes
probe runs where torch is installed (skipped otherwise)."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import record_matmul
from kb_problems import FakeTorch
from test_capture_cpu import SEG, HostArgs, add_launch, make_session

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("kernelbench", ROOT / "benchmarks" /
                                              "kernelbench.py")
kb = importlib.util.module_from_spec(spec)
sys.modules["kernelbench"] = kb
spec.loader.exec_module(kb)

PROBLEM = textwrap.dedent('''\
    import math

    class Model:
        """A made-up problem: no torch, only the shape of a KernelBench file."""
        def __init__(self, in_channels, out_channels, bias_shape):
            self.args = (in_channels, out_channels, bias_shape)

    batch_size = 16  # the batch
    in_channels  = 3
    out_channels = 64
    height = width = 128
    N = 2048 * 2
    rows = batch_size * 4
    bias_shape = (out_channels, 1, 1)
    name = "x"

    def get_inputs():
        return [(batch_size, in_channels, height, width), (N, N), rows]

    def get_init_inputs():
        return [in_channels, out_channels, bias_shape]
    ''')


def run_module(source: str) -> dict:
    env: dict = {}
    exec(compile(source, "<problem>", "exec"), env)
    return env


def test_discovery_orders_by_level_then_number(tmp_path):
    base = tmp_path / "repo" / "KernelBench"
    for level, names in ((1, ["10_B.py", "2_C.py", "1_A_.py", "notes.txt", "x_helper.py"]),
                         (2, ["3_E.py", "1_D.py"])):
        (base / f"level{level}").mkdir(parents=True)
        for n in names:
            (base / f"level{level}" / n).write_text("")
    found = kb.discover(tmp_path / "repo", [1, 2])
    assert [p.key for p in found] == ["level1/1_A_", "level1/2_C", "level1/10_B",
                                      "level2/1_D", "level2/3_E"]
    assert [p.key for p in kb.discover(base, [2, 1], per_level=1)] == \
        ["level2/1_D", "level1/1_A_"]
    with pytest.raises(SystemExit, match="no KernelBench"):
        kb.discover(tmp_path, [1])
    with pytest.raises(SystemExit, match="level3"):
        kb.discover(base, [3])


def test_scaling_divides_the_named_constants_and_nothing_else():
    text, scaled = kb.scale_source(PROBLEM, 4, ("batch_size", "height", "N", "rows"))
    assert scaled == {"batch_size": [16, 4], "height": [128, 32], "width": [128, 32],
                      "N": [4096, 1024]}
    # rows is computed from batch_size: it follows it when the module runs, not divided again
    env = run_module(text)
    assert env["get_inputs"]() == [(4, 3, 32, 32), (1024, 1024), 16]
    assert env["get_init_inputs"]() == [3, 64, (64, 1, 1)]
    assert "batch_size = 4  # the batch  # kernelbench.py --scale 4: was 16" in text
    assert "N = 1024  # kernelbench.py --scale 4: was 2048 * 2" in text
    assert "in_channels  = 3\n" in text and "rows = batch_size * 4\n" in text


def test_scaling_by_one_or_unnamed_changes_nothing_and_never_reaches_zero():
    assert kb.scale_source(PROBLEM, 1) == (PROBLEM, {})
    assert kb.scale_source(PROBLEM, 8, ("name", "bias_shape", "missing")) == (PROBLEM, {})
    text, scaled = kb.scale_source(PROBLEM, 1000, ("batch_size",))
    assert scaled == {"batch_size": [16, 1]}
    assert run_module(text)["get_inputs"]()[0] == (1, 3, 128, 128)
    with pytest.raises(ValueError):
        kb.scale_source(PROBLEM, 0)


def test_a_constant_reassigned_to_something_else_is_not_taken_as_an_int():
    source = "batch_size = 8\nbatch_size = compute()\nN = batch_size * 2\n"
    text, scaled = kb.scale_source(source, 2, ("batch_size", "N"))
    assert scaled == {"batch_size": [8, 4]}
    assert text.splitlines()[1:] == ["batch_size = compute()", "N = batch_size * 2"]


def test_launch_ranges_assign_dispatches_to_problems():
    marks = [{"key": "level1/1_A", "first_launch": 1, "last_launch": 10},
             {"key": "level1/2_B", "first_launch": 11, "last_launch": 11},
             {"key": "level1/3_C", "first_launch": None, "last_launch": None}]
    assert [kb.owner(i, marks) for i in (1, 10, 11, 12)] == \
        ["level1/1_A", "level1/1_A", "level1/2_B", None]


def _incomplete(tmp_path) -> Path:
    session, _ = make_session(tmp_path, max_region_bytes=5000)
    args = HostArgs(("c_uint64", SEG), ("c_uint64", SEG + 4096), ("c_int32", 1))
    launch, kernel = add_launch(args)
    session.launch_enter(launch, kernel, 1)
    session.launch_exit(1, 0)
    session.close(0)
    return tmp_path / "cap"


def test_fidelity_table_from_real_replays(matmul_libs, tmp_path):
    host = record_matmul(matmul_libs["naive"], tmp_path / "host", n=32)
    cap = _incomplete(tmp_path)
    replays = {"0001_kp_add": kb.kpair("replay", str(cap / "0001_kp_add"), "--json",
                                       timeout=300),
               "0002_matmul": kb.kpair("replay", str(host), "--runs", "2", "--json",
                                       timeout=300)}
    assert replays["0001_kp_add"]["exit_code"] == 3
    assert replays["0002_matmul"]["exit_code"] == 0, replays["0002_matmul"]["stderr"]
    summary = json.loads((cap / "capture.json").read_text())
    d = summary["dispatches"][0]
    summary["dispatches"] = [
        d, {**d, "index": 2, "snapshot": "0002_matmul", "kernel": "kp_matmul",
            "launch_index": 5, "complete": True, "omitted_regions": []},
        {"index": 3, "status": "failed", "kernel": "kp_other", "launch_index": 9,
         "reason": "no loaded code object holds this kernel"}]
    problems = {p.key: p for p in (kb.Problem(1, 1, "1_A", Path("1_A.py")),
                                   kb.Problem(1, 2, "2_B", Path("2_B.py")))}
    marks = [{"key": "level1/1_A", "first_launch": 1, "last_launch": 4},
             {"key": "level1/2_B", "first_launch": 5, "last_launch": 9}]
    rows = kb.fidelity_rows("eager", problems, marks, summary, replays)
    assert [(r["problem"], r["verdict"]) for r in rows] == \
        [("1_A", "refused incomplete"), ("2_B", "byte-exact"), ("2_B", "not captured")]
    assert rows[0]["complete"] is False and rows[0]["omitted_bytes"] == 8192
    assert "--max-region-bytes" in rows[0]["detail"]
    assert rows[2]["detail"] == "no loaded code object holds this kernel"
    assert rows[1]["replay_s"] > 0

    s = kb.summarize(rows, [{"key": "level1/1_A", "ok": True},
                            {"key": "level1/2_B", "ok": False}])
    assert s["verdicts"]["byte-exact"] == 1 and s["verdicts"]["refused incomplete"] == 1
    assert s["byte_exact_of_deterministic"] == 1.0 and s["incomplete"] == 1
    assert s["problems_failed"] == ["level1/2_B"]


def test_verdicts_from_replay_reports():
    def rep(status, **kw):
        return {"exit_code": 0 if status == "byte-exact" else 1,
                "stdout": json.dumps({"status": status, **kw}), "stderr": ""}

    assert kb.verdict_of(rep("byte-exact")) == ("byte-exact", None)
    verdict, detail = kb.verdict_of(rep("nondeterministic", unstable_regions=["arg2"]))
    assert verdict == "nondeterministic" and "arg2" in detail
    assert kb.verdict_of(rep("mismatch", differing_regions=["arg1"]))[0] == "mismatch"
    assert kb.verdict_of({"exit_code": 5, "stdout": json.dumps(
        {"status": "error", "error": "DriverError: CUDA_ERROR_ILLEGAL_ADDRESS"}),
        "stderr": ""}) == ("error", "DriverError: CUDA_ERROR_ILLEGAL_ADDRESS")
    assert kb.verdict_of({"exit_code": 124, "stdout": "", "stderr": "timed out after 5 s"}) \
        == ("error", "timed out after 5 s")
    assert kb.verdict_of(None) == ("not captured", None)


def test_the_operator_chosen_is_a_byte_exact_triton_dispatch_with_the_most_bytes():
    p = kb.Problem(2, 1, "1_Conv", Path("1_Conv.py"))
    base = {"mode": "compiled", "problem": "1_Conv", "level": 2, "verdict": "byte-exact"}
    rows = [{**base, "kernel": "triton_poi_fused_0", "region_bytes": 10},
            {**base, "kernel": "triton_red_fused_1", "region_bytes": 30},
            {**base, "kernel": "triton_per_fused_2", "region_bytes": 99,
             "verdict": "nondeterministic"},
            {**base, "kernel": "sm90_xmma_fprop", "region_bytes": 500},
            {**base, "kernel": "triton_poi_fused_3", "region_bytes": 999, "level": 1}]
    assert kb.choose_operator(rows, p)["kernel"] == "triton_red_fused_1"
    assert kb.choose_operator(rows[3:4], p) is None


def test_the_runner_marks_each_problems_launches_and_goes_on_after_a_failure(
        tmp_path, monkeypatch):
    import types

    import kpair.capture
    from kpair.capture.filters import Filter

    session = types.SimpleNamespace(launches=7, filter=Filter(None, 1, None, True))
    torch = FakeTorch().install(monkeypatch)
    monkeypatch.setattr(kpair.capture, "_tracer", types.SimpleNamespace(session=session),
                        raising=False)
    good = textwrap.dedent('''\
        import torch
        batch_size = 4
        class Model:
            def __init__(self, n):
                self.n = n
            def eval(self):
                return self
            def __call__(self, x):
                import kpair.capture
                kpair.capture._tracer.session.launches += self.n * x.shape[0]
                return x
        def get_inputs():
            return [torch.Tensor((batch_size, 8))]
        def get_init_inputs():
            return [3]
        ''')
    (tmp_path / "good.py").write_text(good)
    (tmp_path / "bad.py").write_text(good.replace("return [3]", "raise MemoryError('CUDA out "
                                                  "of memory')"))
    plan = {"mode": "compiled", "marks": str(tmp_path / "marks.json"), "problems": [
        {"key": "level1/1_good", "file": str(tmp_path / "good.py"), "module": "good"},
        {"key": "level1/2_bad", "file": str(tmp_path / "bad.py"), "module": "bad"},
        {"key": "level1/3_good", "file": str(tmp_path / "good.py"), "module": "good3"}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    assert kb.main([kb.RUNNER, str(tmp_path / "plan.json")]) == 0
    marks = json.loads((tmp_path / "marks.json").read_text())
    # compiled: 12 launches in the uncaptured warm-up call and 12 in the captured one
    assert [(m["key"], m["ok"], m["first_launch"], m["last_launch"]) for m in marks] == [
        ("level1/1_good", True, 8, 31), ("level1/2_bad", False, 32, 31),
        ("level1/3_good", True, 32, 55)]
    assert marks[1]["error"] == "MemoryError: CUDA out of memory"
    assert len(torch.compiles) == 2
    assert kb.owner(32, marks) == "level1/3_good"


# --------------------------------------------------------------------------- distinct scopes

def test_distinct_scopes_reach_kpairs_real_capture_filter(monkeypatch):
    """The runner resets kpair's own Filter between problems (compiled) or seeds it with the
    kernels earlier batches took (eager): checked on the real class, so a change to its
    private seen-sets fails here rather than on the GPU."""
    import types

    import kpair.capture
    from kpair.capture.filters import Filter

    f = Filter(None, 1, None, True)
    session = types.SimpleNamespace(filter=f, launches=0)
    monkeypatch.setattr(kpair.capture, "_tracer", types.SimpleNamespace(session=session),
                        raising=False)
    kb.distinct_from_here(["k_add"])
    assert [f.consider(n, n) for n in ("k_add", "k_mul", "k_mul")] == [False, True, False]
    kb.distinct_from_here()
    assert [f.consider(n, n) for n in ("k_add", "k_mul")] == [True, True]
    monkeypatch.setattr(f, "_seen", {"k": 1}, raising=False)   # not a set: kpair changed
    with pytest.raises(RuntimeError, match="distinct_from_here"):
        kb.distinct_from_here()


def test_the_runner_resets_distinct_per_problem_in_compiled_mode(tmp_path, monkeypatch):
    import types

    import kpair.capture
    from kpair.capture.filters import Filter

    f = Filter(None, 1, None, True)
    taken = []

    class Session:
        filter, launches = f, 0

    session = Session()
    FakeTorch().install(monkeypatch)
    monkeypatch.setattr(kpair.capture, "_tracer", types.SimpleNamespace(session=session),
                        raising=False)
    source = textwrap.dedent('''\
        import kpair.capture
        class Model:
            def __init__(self, *a):
                self.calls = 0
            def eval(self):
                return self
            def __call__(self):
                s = kpair.capture._tracer.session
                self.calls += 1   # the first call also tries a config, as an autotuner does
                tried = ("tune_try",) if self.calls == 1 else ()
                for name in (*tried, "relu_0", "relu_0", "mean_1"):
                    s.launches += 1
                    if s.filter.consider(name, name):
                        TAKEN.append(name)
        def get_inputs():
            return []
        def get_init_inputs():
            return []
        ''')
    problems = []
    for n in (1, 2):
        file = tmp_path / f"p{n}.py"
        file.write_text(source)
        problems.append({"key": f"level2/{n}_P", "file": str(file), "module": f"p{n}"})
    real = kb.module_from_source

    def with_taken(text, name, filename):
        module = real(text.replace("TAKEN", "__taken__"), name, filename)
        module.__taken__ = taken
        return module

    monkeypatch.setattr(kb, "module_from_source", with_taken)
    # compiled: a warm-up call uncaptured, then each problem's own first launches; eager: one
    # call, the first launch of each kernel in the run, the skipped ones excepted
    for mode, skip, want in (("compiled", [], ["relu_0", "mean_1", "relu_0", "mean_1"]),
                             ("eager", ["mean_1"], ["tune_try", "relu_0"])):
        taken.clear()
        plan = {"mode": mode, "marks": str(tmp_path / f"{mode}.json"), "problems": problems,
                "distinct": "problem" if mode == "compiled" else "run", "skip": skip}
        (tmp_path / "plan.json").write_text(json.dumps(plan))
        assert kb.main([kb.RUNNER, str(tmp_path / "plan.json")]) == 0
        assert taken == want, mode


# --------------------------------------------------------------------------- results file

HEADER = {"scale": 1, "scale_names": ["batch_size"], "kernelbench": {"commit": None}}


def test_results_resume_skip_a_torn_line_and_refuse_another_scale(tmp_path, capsys):
    path = tmp_path / "results.jsonl"
    r = kb.Results(path, HEADER)
    r.append({"type": "problem", "final": False, "key": "level1/1_A", "mode": "eager"})
    r.append({"type": "problem", "final": True, "key": "level1/1_A", "mode": "eager",
              "rows": [{"kernel": "k_add"}, {"kernel": "k_mul"}]})
    with open(path, "a") as f:
        f.write('{"type": "problem", "final": tr')   # a call killed mid-write
    again = kb.Results(path, HEADER)
    assert "torn line" in capsys.readouterr().err
    assert again.is_final("level1/1_A", "eager") and not again.is_final("level1/1_A",
                                                                          "compiled")
    assert again.attempts("level1/1_A", "eager") == 2
    assert again.kernels_taken("eager") == ["k_add", "k_mul"]
    assert again.kernels_taken("compiled") == []
    again.append({"type": "batch", "mode": "eager"})
    lines = path.read_text().splitlines()
    assert json.loads(lines[-1]) == {"type": "batch", "mode": "eager"}
    assert len(kb.Results(path, HEADER).of_type("batch")) == 1
    with pytest.raises(SystemExit, match="scale"):
        kb.Results(path, {**HEADER, "scale": 4})
    (tmp_path / "other.jsonl").write_text('{"schema": "x"}\n')
    with pytest.raises(SystemExit, match="not a kernelbench results"):
        kb.Results(tmp_path / "other.jsonl", HEADER)


# --------------------------------------------------------------------------- planning

def _sizes(*problems):
    """A sizes map: (key, [(op, bytes read+written, bytes written)...], extra fields)."""
    out = {}
    for key, ops, *rest in problems:
        out[key] = {"key": key, "op_list": [list(o) for o in ops],
                    "state_bytes": sum(o[1] + o[2] for o in ops), "ops": len(ops),
                    "params_bytes": 0, "input_bytes": 100, "output_bytes": 10,
                    **(rest[0] if rest else {})}
    return out


def test_estimates_take_each_op_once_in_eager_and_library_ops_every_time():
    ps = [kb.Problem(1, 1, "1_A", Path()), kb.Problem(1, 2, "2_B", Path()),
          kb.Problem(2, 1, "1_C", Path())]
    sizes = _sizes(("level1/1_A", [("relu", 200, 100)]),
                   ("level1/2_B", [("relu", 200, 100), ("mean", 50, 1)]),
                   ("level2/1_C", [("convolution", 1000, 400), ("relu", 800, 400),
                                   ("add", 800, 400)]))
    est = kb.estimates(ps, sizes)
    assert est["level1/2_B"]["eager"] == {"dispatches": 1, "state_bytes": 51}
    assert est["level2/1_C"]["eager"] == {"dispatches": 2, "state_bytes": 1400 + 1200}
    # compiled: the convolution, plus one fused kernel over inputs and outputs (100 + 2 * 10)
    # (the fused kernel's regions, its operator if optimized: inputs, params, output)
    assert est["level2/1_C"]["compiled"] == {"dispatches": 2, "state_bytes": 1400 + 120,
                                             "operator_bytes": 110}
    assert est["level1/1_A"]["compiled"] == {"dispatches": 1, "state_bytes": 120,
                                             "operator_bytes": 110}
    rates = kb.Rates(eager_s=0, compiled_s=0, replay_fixed_s=0, optimize_s=100,
                     capture_fixed_s=0)
    e = est["level1/1_A"]["compiled"]
    assert [rates.problem_s("compiled", e, 1, 1, limit) for limit in (0, 109, 110)] == \
        pytest.approx([0, 0, 100], abs=1e-3)
    assert rates.problem_s("eager", est["level1/1_A"]["eager"], 1, 1, 110) < 1
    assert kb.estimates(ps[:1], {})["level1/1_A"]["eager"] == {"dispatches": 0,
                                                                 "state_bytes": 0}


def test_batches_fit_the_disk_and_the_call_and_a_huge_problem_goes_alone():
    ps = [kb.Problem(1, n, f"{n}_P", Path()) for n in range(1, 6)]
    gb = 10 ** 9
    est = {p.key: {"eager": {"dispatches": 1, "state_bytes": b * gb}}
           for p, b in zip(ps, (1, 1, 50, 1, 1), strict=True)}
    rates = kb.Rates(start_s=10, eager_s=0, capture_fixed_s=0, capture_gbps=1,
                     replay_fixed_s=0, replay_gbps=1e9, check_gbps=1e9, regen_share=0)

    def plan(todo, **kw):
        args = {"bytes_left": 10 * gb, "seconds_left": 1000, "max_count": 10, "rates": rates,
                "runs": 1, "jobs": 1, "optimize": False, **kw}
        return [p.number for p in kb.plan_batch(todo, est, "eager", **args)]

    assert plan(ps) == [1, 2]                       # the 50 GB one would overflow the disk
    assert plan(ps[2:]) == [3]                      # ... so it goes alone
    assert plan(ps, max_count=1) == [1]
    assert plan(ps, seconds_left=12.5) == [1, 2]    # 10 s start + 1 s + 1 s
    assert plan(ps, seconds_left=11.5) == [1]
    assert plan(ps, seconds_left=10.5) == []        # not even one fits: nothing starts
    assert plan(ps[2:], seconds_left=59) == []      # a long problem waits for a fresh call
    # regenerable snapshots: 90% of the state is a chain and a digest (1% of it stored), so
    # the 50 GB problem stores ~5.45 GB: all five fit the disk, and it costs less time
    regen = kb.dataclasses.replace(rates, regen_share=0.9, stored_share=0.01,
                                   device_gbps=100)
    assert regen.stored_bytes(50 * gb) == pytest.approx(50 * gb * (0.1 + 0.9 * 0.01))
    assert plan(ps, rates=regen) == [1, 2, 3, 4, 5]   # 5.9 GB stored in all
    assert regen.problem_s("eager", est["level1/3_P"]["eager"], 1, 1, 0) < \
        rates.problem_s("eager", est["level1/3_P"]["eager"], 1, 1, 0) / 5


def test_simulate_counts_the_calls():
    ps = [kb.Problem(1, n, f"{n}_P", Path()) for n in range(1, 5)]
    est = {p.key: {m: {"dispatches": 0, "state_bytes": 0} for m in kb.MODES} for p in ps}
    est["level1/3_P"]["eager"]["state_bytes"] = 500e9   # longer than a call
    rates = kb.Rates(start_s=10, eager_s=20, compiled_s=40, capture_gbps=1, replay_gbps=1e9,
                     check_gbps=1e9, regen_share=0)
    doc = kb.simulate(ps, est, ["eager", "compiled"], deadline=100, batch_bytes=1e12,
                      batch_max=10, runs=1, jobs=1, optimize=False, rates=rates)
    # eager: 1, 2 (10 + 20 + 20 = 50; 3 does not fit), then 3 alone, then 4 (30 s) and in
    # the same call compiled 1 (10 + 40: 80 s); then compiled 2, 3 (90 s), then 4
    assert doc["problems_per_call"] == [[["eager", 2]], [["eager", 1]],
                                        [["eager", 1], ["compiled", 1]], [["compiled", 2]],
                                        [["compiled", 1]]]
    assert doc["calls"] == 5
    # two batches at a time (one problem a batch): eager 1 | 2 side by side (30 s), then
    # 4 (3 does not fit: 500 s); compiled 1 | 2 after it (30 + 30 + 50 = 110 > 100: no) ...
    two = kb.simulate(ps, est, ["eager", "compiled"], deadline=100, batch_bytes=1e12,
                      batch_max=1, runs=1, jobs=1, optimize=False, rates=rates,
                      capture_jobs=2)
    one = kb.simulate(ps, est, ["eager", "compiled"], deadline=100, batch_bytes=1e12,
                      batch_max=1, runs=1, jobs=1, optimize=False, rates=rates)
    assert sum(n for call in two["problems_per_call"] for _, n in call) == 8
    assert two["estimated_s"] < one["estimated_s"] and two["calls"] <= one["calls"]
    # problems that hold most of the GPU run one at a time beside each other's lanes
    for pr in ps:
        est[pr.key]["peak_bytes"] = 40 << 30
    tight = kb.simulate(ps, est, ["eager", "compiled"], deadline=100, batch_bytes=1e12,
                        batch_max=1, runs=1, jobs=1, optimize=False, rates=rates,
                        capture_jobs=2, gpu_bytes=64 << 30)
    assert tight["estimated_s"] == one["estimated_s"] > two["estimated_s"]
    assert [pr.number for part in kb.split_by_peak(ps, {**est, "level1/2_P": {
        "peak_bytes": 1}}, 1 << 30) for pr in part] == [1, 3, 4, 2]


# --------------------------------------------------------------------------- the driver

def _problem_files(root: Path, names: dict[int, list[str]]) -> Path:
    for level, stems in names.items():
        d = root / "KernelBench" / f"level{level}"
        d.mkdir(parents=True)
        for stem in stems:
            (d / f"{stem}.py").write_text("batch_size = 8\n")
    (root / "COMMIT").write_text("abc123\n")
    return root


class FakeKpair:
    """``kpair capture`` / ``replay`` / ``optimize`` as the driver sees them: capture runs
    the plan's problems, each launching its kernels (``kernels``) under the plan's distinct
    scope, writes marks.json and capture.json and the snapshot folders; a problem in
    ``crash`` ends the program there. ``replay`` answers byte-exact, or nondeterministic for
    kernels named in ``nondeterministic``."""

    def __init__(self, kernels: dict[str, list[str]], crash=(), nondeterministic=()):
        self.kernels, self.crash, self.nondet = kernels, set(crash), set(nondeterministic)
        self.calls: list[tuple] = []
        self.envs: list[dict | None] = []
        self.argv: list[tuple] = []
        self.on_capture = None
        self.no_cupti = False
        self.teardown = None

    def __call__(self, *args: str, timeout: float, env: dict | None = None) -> dict:
        self.calls.append((args[0], timeout))
        self.envs.append(env)
        self.argv.append(args)
        return getattr(self, args[0])(*args[1:])

    def capture(self, *args):
        cap = Path(args[args.index("-o") + 1])
        plan = json.loads(Path(args[-1]).read_text())
        if self.no_cupti:
            return {"exit_code": 2, "stdout": "", "s": 0.1, "stderr":
                    "kpair capture: CUPTI not found: pip install nvidia-cuda-cupti"}
        cap.mkdir(parents=True)
        marks, dispatches, seen, launches = [], [], set(plan["skip"]), 0
        code = 0
        for p in plan["problems"]:
            if plan["distinct"] == "problem":
                seen = set()
            if p["key"] in self.crash:
                code = 139
                break
            first = launches + 1
            for k in self.kernels[p["key"]]:
                launches += 1
                if k in seen:
                    continue
                seen.add(k)
                snap = f"{len(dispatches) + 1:04d}_{k}"
                (cap / snap).mkdir()
                dispatches.append({"index": len(dispatches) + 1, "status": "captured",
                                   "kernel": k, "launch_index": launches, "snapshot": snap,
                                   "complete": True, "region_bytes": 64 * launches,
                                   "state_bytes": 128, "stored_bytes": 100,
                                   "capture_s": 0.01})
            marks.append({"key": p["key"], "ok": True, "first_launch": first,
                          "last_launch": launches, "run_s": 0.1})
        if self.teardown and not code:   # a launch after the last problem, outside them all
            launches += 1
            dispatches.append({"index": len(dispatches) + 1, "status": "failed",
                               "kernel": self.teardown, "launch_index": launches,
                               "reason": "no loaded code object holds this kernel"})
        Path(plan["marks"]).write_text(json.dumps(marks))
        (cap / "capture.json").write_text(json.dumps({"dispatches": dispatches}))
        if self.on_capture:
            self.on_capture()
        return {"exit_code": code, "stdout": "", "stderr": "Segmentation fault" if code else "",
                "s": 1.0}

    def replay(self, snap, *args):
        kernel = Path(snap).name.split("_", 1)[1]
        status = "nondeterministic" if kernel in self.nondet else "byte-exact"
        assert Path(snap).is_dir()
        return {"exit_code": 0 if status == "byte-exact" else 1, "s": 0.5, "stderr": "",
                "stdout": json.dumps({"status": status})}

    def optimize(self, *args):
        name = args[args.index("--name") + 1]
        assert Path(args[args.index("--snapshot") + 1]).is_dir()   # not deleted before
        return {"exit_code": 0, "s": 3.0, "stderr": "", "stdout": json.dumps({
            "operators": [{"key": f"level2/{name}", "status": "published",
                           "line": "1.10x"}]})}


def _results(out: Path) -> kb.Results:
    return kb.Results(out / "results.jsonl", {"scale": 1, "kernelbench": {"commit": "abc123"},
                                              "scale_names": list(kb.DEFAULT_SCALE_NAMES)})


def _run(root, out, *extra):
    return kb.main(["run", "--kernelbench", str(root), "-o", str(out), *extra])


def test_a_run_records_each_problem_deletes_snapshots_and_resumes(tmp_path, monkeypatch):
    root = _problem_files(tmp_path / "kb", {1: ["1_A", "2_B"], 2: ["1_C"]})
    fake = FakeKpair({"level1/1_A": ["k_add", "k_mul"], "level1/2_B": ["k_add", "k_sum"],
                      "level2/1_C": ["triton_poi_fused_0", "triton_red_fused_1"]},
                     nondeterministic={"k_sum"})
    fake.teardown = "k_cleanup"
    monkeypatch.setattr(kb, "kpair", fake)
    out = tmp_path / "out"
    assert _run(root, out, "--modes", "eager,compiled", "--optimize") == 0
    table = json.loads((out / "fidelity.json").read_text())
    assert [b["unowned"] for b in table["batches"]] == [["k_cleanup"], ["k_cleanup"]]
    assert all(r["kernel"] != "k_cleanup" for r in table["rows"])
    eager = [(r["problem"], r["kernel"], r["verdict"]) for r in table["rows"]
             if r["mode"] == "eager"]
    # eager: each kernel once in the whole run (2_B's k_add was 1_A's)
    assert eager == [("1_A", "k_add", "byte-exact"), ("1_A", "k_mul", "byte-exact"),
                     ("2_B", "k_sum", "nondeterministic"),
                     ("1_C", "triton_poi_fused_0", "byte-exact"),
                     ("1_C", "triton_red_fused_1", "byte-exact")]
    compiled = [(r["problem"], r["kernel"]) for r in table["rows"] if r["mode"] == "compiled"]
    assert ("2_B", "k_add") in compiled          # per problem in compiled mode
    assert table["summary"]["verdicts"]["nondeterministic"] == 2
    assert table["by_mode"]["eager"]["byte_exact_of_deterministic"] == 1.0
    assert table["kernelbench"] == {"commit": "abc123"}
    assert [(o["key"], o["status"]) for o in table["optimize"]] == [
        ("level1/1_A", "no operator"), ("level1/2_B", "no operator"), ("level2/1_C", "ran")]
    assert table["optimize"][2]["kernel"] == "triton_red_fused_1"   # the one with most bytes
    assert table["optimize"][2]["operators"][0]["status"] == "published"
    skipped = tmp_path / "small"
    assert _run(root, skipped, "--modes", "compiled", "--optimize",
                "--optimize-max-bytes", "100") == 0
    [last] = json.loads((skipped / "fidelity.json").read_text())["optimize"][2:]
    assert last["status"] == "skipped" and "over --optimize-max-bytes 100" in last["reason"]
    assert not any((out / "work").iterdir())     # snapshots deleted after the verdicts
    lines = (out / "results.jsonl").read_text().splitlines()
    before = len(fake.calls)
    assert _run(root, out) == 0                  # all decided: nothing runs again
    assert len(fake.calls) == before
    assert (out / "results.jsonl").read_text().splitlines() == lines


def _sizes_doc(path: Path, keys: list[str], peak: int) -> Path:
    path.write_text(json.dumps({"schema": "kpair.kernelbench-sizes", "problems": [
        {"key": k, "level": int(k[5]), "problem": k.split("/")[1], "io_bytes": peak,
         "max_op_bytes": 0, "state_bytes": 1000, "params_bytes": 0, "input_bytes": 1000,
         "output_bytes": 0, "op_list": [["add", 500, 500]]} for k in keys]}))
    return path


def test_batches_are_captured_side_by_side_and_the_table_names_the_largest(tmp_path,
                                                                           monkeypatch):
    import threading

    keys = [f"level2/{n}_P{n}" for n in range(1, 5)]
    root = _problem_files(tmp_path / "kb", {2: [k.split("/")[1] for k in keys]})
    fake = FakeKpair({k: [f"triton_poi_fused_{i}"] for i, k in enumerate(keys)})
    both = threading.Barrier(2, timeout=60)
    fake.on_capture = both.wait   # passes only while two captures are in flight at once
    monkeypatch.setattr(kb, "kpair", fake)
    monkeypatch.setattr(kb, "copy_bandwidth", lambda mib: {
        "device": "stand-in", "bytes": mib << 20, "h2d_pinned_gbps": 25.0})
    out = tmp_path / "out"
    assert _run(root, out, "--level", "2", "--modes", "compiled", "--batch-max", "1",
                "--capture-jobs", "2",
                "--sizes", str(_sizes_doc(tmp_path / "sizes.json", keys, 1 << 20))) == 0
    table = json.loads((out / "fidelity.json").read_text())
    assert len(table["batches"]) == 4 and table["summary"]["problems"] == 4
    assert table["copy_bandwidth"][0]["h2d_pinned_gbps"] == 25.0
    largest = table["summary"]["largest"]
    assert largest["region_bytes"] == max(r["region_bytes"] for r in table["rows"])
    assert {"capture_s", "replay_s", "stored_bytes"} <= set(largest)
    assert table["summary"]["median_stored_bytes"] == 100
    assert not any((out / "work").iterdir())


def test_batches_too_large_for_the_gpu_together_are_captured_one_at_a_time(tmp_path,
                                                                          monkeypatch):
    import threading

    keys = [f"level2/{n}_P{n}" for n in range(1, 4)]
    root = _problem_files(tmp_path / "kb", {2: [k.split("/")[1] for k in keys]})
    fake = FakeKpair({k: [f"triton_poi_fused_{i}"] for i, k in enumerate(keys)})
    started, lock, seen = threading.Event(), threading.Lock(), {"now": 0, "most": 0}
    real = fake.capture

    def capture(*args):
        with lock:
            seen["now"] += 1
            seen["most"] = max(seen["most"], seen["now"])
        started.set()
        try:
            # a second capture, were one let in beside this one, would show up meanwhile
            started.clear()
            started.wait(0.5)
            return real(*args)
        finally:
            with lock:
                seen["now"] -= 1

    fake.capture = capture
    monkeypatch.setattr(kb, "kpair", fake)
    # 31 GiB a problem: two batches' contexts and problems (68 GiB) are more than 80% of
    # 80 GiB
    assert _run(root, tmp_path / "out", "--level", "2", "--modes", "compiled", "--batch-max", "1",
                "--capture-jobs", "3", "--bandwidth-mib", "0", "--sizes",
                str(_sizes_doc(tmp_path / "sizes.json", keys, 31 << 30))) == 0
    assert seen["most"] == 1
    assert len(_results(tmp_path / "out").of_type("batch")) == 3
    # the same with small problems and a disk budget that holds one batch's expected bytes
    seen["most"] = 0
    assert _run(root, tmp_path / "out2", "--level", "2", "--modes", "compiled",
                "--batch-max", "1", "--capture-jobs", "3", "--bandwidth-mib", "0",
                "--disk-budget", "150", "--sizes",   # 109 bytes expected a problem
                str(_sizes_doc(tmp_path / "sizes2.json", keys, 1 << 20))) == 0
    assert seen["most"] == 1


def test_inductor_baselines_capture_each_compiled_batch_under_each_tuning_mode(
        tmp_path, monkeypatch):
    root = _problem_files(tmp_path / "kb", {2: ["1_C"]})
    fake = FakeKpair({"level2/1_C": ["triton_poi_fused_0", "triton_red_fused_1"]})
    monkeypatch.setattr(kb, "kpair", fake)
    out = tmp_path / "out"
    assert _run(root, out, "--modes", "compiled", "--level", "2", "--optimize",
                "--inductor-baseline") == 0
    captures = [(argv, env) for argv, env in zip(fake.argv, fake.envs, strict=True)
                if argv[0] == "capture"]
    assert len(captures) == 3                    # the batch, then once per tuning mode
    (plain, _), *tuned = captures
    assert [sorted(k for k in env if k.startswith("TORCHINDUCTOR_")) for _, env in tuned] == [
        ["TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_COORDINATE_DESCENT_TUNING"],
        ["TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_MAX_AUTOTUNE",
         "TORCHINDUCTOR_MAX_AUTOTUNE_POINTWISE"]]
    # metadata only, a fresh Inductor cache each, marks of their own
    assert tuned[0][1]["TORCHINDUCTOR_CACHE_DIR"] != tuned[1][1]["TORCHINDUCTOR_CACHE_DIR"]
    for argv, _ in tuned:
        assert argv[argv.index("--max-region-bytes") + 1] == "1" and "--distinct" in argv
    assert [Path(argv[-1]).name for argv, _ in tuned] == ["plan-coordinate-descent.json",
                                                          "plan-max-autotune.json"]
    (optimize,) = [argv for argv in fake.argv if argv[0] == "optimize"]
    given = [optimize[i + 1] for i, a in enumerate(optimize) if a == "--baseline-capture"]
    assert [g.split("=", 1)[0] for g in given] == ["coordinate-descent", "max-autotune"]
    (batch,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()
                if '"type": "batch"' in line]
    assert set(batch["baseline_captures"]) == {"coordinate-descent", "max-autotune"}
    assert all(b["ok"] for b in batch["baseline_captures"].values())


def test_a_crash_is_retried_then_decided_and_the_rest_goes_on(tmp_path, monkeypatch):
    root = _problem_files(tmp_path / "kb", {1: ["1_A", "2_B", "3_C"]})
    fake = FakeKpair({"level1/1_A": ["k1"], "level1/2_B": ["k2"], "level1/3_C": ["k3"]},
                     crash={"level1/2_B"})
    monkeypatch.setattr(kb, "kpair", fake)
    out = tmp_path / "out"
    assert _run(root, out, "--level", "1", "--modes", "eager", "--retries", "1") == 0
    results = _results(out)
    problems = results.of_type("problem")
    assert [(p["key"], p["final"], p["ok"]) for p in problems] == [
        ("level1/1_A", True, True),
        ("level1/2_B", False, False),    # first attempt: the program died in it
        ("level1/2_B", False, False),    # second
        ("level1/2_B", True, False),     # decided after --retries 1
        ("level1/3_C", True, True)]
    assert "exit 139: Segmentation fault" in problems[1]["error"]
    assert "cut short in all 2 attempts" in problems[3]["error"]
    # 3_C never ran in the batches 2_B crashed: only its own batch captured it
    assert [r["kernel"] for r in problems[4]["rows"]] == ["k3"]
    table = json.loads((out / "fidelity.json").read_text())
    assert table["summary"]["problems_failed"] == ["eager level1/2_B"]


def test_a_call_that_runs_out_of_time_records_nothing_half_done(tmp_path, monkeypatch):
    root = _problem_files(tmp_path / "kb", {1: ["1_A", "2_B"]})
    fake = FakeKpair({"level1/1_A": ["k1"], "level1/2_B": ["k2"]})
    monkeypatch.setattr(kb, "kpair", fake)
    out = tmp_path / "out"
    monkeypatch.setattr(kb.Call, "left", lambda self: self.remaining.pop(0)
                        if len(self.remaining) > 1 else self.remaining[0])
    # too little time left for the next problem: nothing starts, and the exit status says so
    monkeypatch.setattr(kb.Call, "remaining", [5.0], raising=False)
    assert _run(root, out, "--level", "1", "--modes", "eager") == 3
    assert fake.calls == []
    # time runs out during the replays: the batch's problems are left for the next call
    monkeypatch.setattr(kb.Call, "remaining", [1e9] * 3 + [-1.0], raising=False)
    real_replay = fake.replay
    fake.replay = lambda *a: {**real_replay(*a), "exit_code": 124}
    assert _run(root, out, "--level", "1", "--modes", "eager") == 3
    results = _results(out)
    assert results.final() == []
    # the batch's first problem had the call to itself: an attempt (retries end a problem
    # that never fits); the second did not
    [attempt] = results.of_type("problem")
    assert attempt["key"] == "level1/1_A" and not attempt["final"] and attempt["rows"] == []
    assert "time ran out" in attempt["error"]
    assert results.of_type("batch")[0]["recorded"] == 0
    # a fresh call with time finishes them
    monkeypatch.setattr(kb.Call, "remaining", [1e9], raising=False)
    fake.replay = real_replay
    assert _run(root, out, "--level", "1", "--modes", "eager") == 0
    assert [p["key"] for p in _results(out).final()] == ["level1/1_A", "level1/2_B"]


def test_a_problem_longer_than_any_call_gets_a_call_of_its_own(tmp_path, monkeypatch):
    root = _problem_files(tmp_path / "kb", {1: ["1_A", "2_B"]})
    fake = FakeKpair({"level1/1_A": ["k1"], "level1/2_B": ["k2"]})
    monkeypatch.setattr(kb, "kpair", fake)
    out = tmp_path / "out"
    # every problem is expected to take longer than a 1 s call: each call runs one
    for n in (1, 2):
        assert _run(root, out, "--level", "1", "--modes", "eager", "--deadline", "1") == \
            (3 if n == 1 else 0)
        assert [p["key"] for p in _results(out).final()] == \
            ["level1/1_A", "level1/2_B"][:n]
    assert [c[0] for c in fake.calls] == ["capture", "replay", "capture", "replay"]


# --------------------------------------------------------------------------- sizes (torch)

def test_sizes_of_a_problem_on_the_meta_device_and_its_cpu_pass(tmp_path):
    torch = pytest.importorskip("torch")
    source = textwrap.dedent('''\
        import torch
        import torch.nn as nn
        class Model(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.lin = nn.Linear(n, n, bias=False)
            def forward(self, x):
                return torch.relu(self.lin(x))
        batch_size = 4096
        features = 256
        def get_inputs():
            return [torch.rand(batch_size, features)]
        def get_init_inputs():
            return [features]
        ''')
    d = tmp_path / "KernelBench" / "level2"
    d.mkdir(parents=True)
    (d / "1_Lin.py").write_text(source)
    [problem] = kb.discover(tmp_path, [2])
    rec = kb.probe(problem, torch, budget=1 << 20)
    mib = 1 << 20
    assert rec["params_bytes"] == 256 * 256 * 4
    assert rec["input_bytes"] == rec["output_bytes"] == 4 * mib
    assert [o[0] for o in rec["op_list"]] == ["mm", "relu"]
    assert rec["max_op_bytes"] == 8 * mib + 256 * 1024
    # weight 256 KiB twice (params, the mm) + 4 KiB a row four times (x, out, the mm's two):
    # 128 rows fit 1 MiB, so batch_size 4096 // 32
    assert rec["cpu_ok"] and rec["cpu_scale"] == 32
    assert rec["cpu_scaled"] == {"batch_size": [4096, 128]}
    assert rec["cpu_output"] == [[128, 256]]


def test_a_terminated_driver_kills_the_process_groups_it_started():
    """``timeout`` around a call sends SIGTERM to the driver; the capture it started runs in
    a process group of its own, which would otherwise hold the GPU after the call ends."""
    import subprocess

    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    kb._RUNNING.add(proc)
    try:
        with pytest.raises(SystemExit) as e:
            kb._terminated(15, None)
        assert e.value.code == 143
        assert proc.wait(timeout=30) == -9
    finally:
        kb._RUNNING.discard(proc)
        if proc.poll() is None:
            proc.kill()


def test_a_capture_that_cannot_start_ends_the_call_without_blaming_a_problem(tmp_path,
                                                                            monkeypatch):
    root = _problem_files(tmp_path / "kb", {1: ["1_A"]})
    fake = FakeKpair({"level1/1_A": ["k1"]})
    fake.no_cupti = True
    monkeypatch.setattr(kb, "kpair", fake)
    with pytest.raises(SystemExit, match="never started.*CUPTI not found"):
        _run(root, tmp_path / "out", "--level", "1", "--modes", "eager")
    results = _results(tmp_path / "out")
    assert results.of_type("problem") == []


def test_rates_given_on_the_command_line_replace_the_named_fields():
    import argparse

    r = kb.parse_rates('{"capture_gbps": 0.5, "start_s": 60}')
    assert (r.capture_gbps, r.start_s, r.eager_s) == (0.5, 60.0, kb.Rates().eager_s)
    for bad in ('{"capture_gbs": 1}', "[1]", "{", '{"start_s": "x"}'):
        with pytest.raises(argparse.ArgumentTypeError, match="JSON object of start_s"):
            kb.parse_rates(bad)


def test_the_runner_with_real_torch_on_the_cpu(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "p.py").write_text(textwrap.dedent('''\
        import torch
        import torch.nn as nn
        class Model(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.lin = nn.Linear(n, n)
            def forward(self, x):
                return torch.relu(self.lin(x))
        def get_inputs():
            return [torch.rand(4, 8)]
        def get_init_inputs():
            return [8]
        '''))
    (tmp_path / "bad.py").write_text("def get_inputs():\n    return []\n")
    plan = {"mode": "eager", "marks": str(tmp_path / "marks.json"), "device": "cpu",
            "distinct": "run", "problems": [
                {"key": "level2/1_P", "file": str(tmp_path / "p.py"), "module": "p"},
                {"key": "level2/2_Bad", "file": str(tmp_path / "bad.py"), "module": "bad"}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    assert kb.main([kb.RUNNER, str(tmp_path / "plan.json")]) == 0
    marks = json.loads((tmp_path / "marks.json").read_text())
    assert [m["ok"] for m in marks] == [True, False]
    assert marks[1]["error"] == "AttributeError: module 'kb_bad' has no attribute 'Model'"


def test_each_problem_records_every_problem_and_frees_each_before_the_next(tmp_path):
    import weakref

    torch, path, held, seen = FakeTorch(), tmp_path / "marks.json", [], []

    class Model:
        pass

    def start(i: int, p: dict) -> dict:
        return {"key": p["key"], "ok": False, "first": i == 0}

    def one(p: dict, rec: dict) -> None:
        model = Model()   # what a problem holds: gone before the cache is emptied
        held.append(weakref.ref(model))
        seen.append(json.loads(path.read_text()) if path.exists() else None)
        if p["key"] == "oom":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")
        if p["key"] == "bad":
            raise ValueError("x" * 3000)
        rec["ok"] = True

    torch.cuda.empty_cache = lambda: torch.calls.append(
        f"empty_cache, alive {sum(r() is not None for r in held)}")
    got = kb.each_problem([{"key": k} for k in ("a", "bad", "oom")], path, start, one,
                          torch=torch, out_of_memory=True)
    assert json.loads(path.read_text()) == got and not path.with_suffix(".tmp").exists()
    assert [r["ok"] for r in got] == [True, False, False]
    assert [r["first"] for r in got] == [True, False, False]
    assert got[1]["error"] == "ValueError: " + "x" * 1988 and not got[1]["out_of_memory"]
    assert got[2]["error"].startswith("OutOfMemoryError: CUDA out of memory")
    assert got[2]["out_of_memory"] and "out_of_memory" not in got[0]
    assert seen[0] is None and [r["key"] for r in seen[2]] == ["a", "bad"]   # after each
    assert torch.calls == ["dynamo_reset", "empty_cache, alive 0"] * 3

    torch.calls.clear()
    kb.each_problem([{"key": "a"}], path, start, one, torch=torch, dynamo=False, cuda=False)
    assert torch.calls == [] and "out_of_memory" not in json.loads(path.read_text())[0]

