"""benchmarks/kernelbench.py without a GPU: problem discovery, the size-scaling patcher (on a
made-up problem file, not KernelBench's), and the fidelity table built from real ``kpair
replay`` runs (a host snapshot, byte-exact; an incomplete CUDA one, refused)."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import record_matmul
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


def test_the_table_resumes_and_refuses_another_scale(tmp_path):
    path = tmp_path / "fidelity.json"
    t = kb.Table(path, {"scale": 2, "scale_names": ["batch_size"]})
    t.add([{"key": "level1/1_A", "mode": "eager", "ok": True, "scaled": {}}], [])
    again = kb.Table(path, {"scale": 2, "scale_names": ["batch_size"]})
    assert again.done("level1/1_A", "eager") and not again.done("level1/1_A", "compiled")
    assert json.loads(path.read_text())["summary"]["problems"] == 1
    with pytest.raises(SystemExit, match="scale"):
        kb.Table(path, {"scale": 4, "scale_names": ["batch_size"]})


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


class _FakeTorch:
    """What the runner calls of torch, on the CPU: a forward pass "launches" kernels by
    bumping the capture session's launch counter."""

    class Tensor:
        def __init__(self, shape):
            self.shape = shape

        def cuda(self):
            return self

    def __init__(self, session):
        import contextlib
        import types

        self.session, self.compiled = session, []
        self.device = lambda name: contextlib.nullcontext()
        self.no_grad = contextlib.nullcontext
        self.manual_seed = lambda seed: None
        self.cuda = types.SimpleNamespace(synchronize=lambda: None, empty_cache=lambda: None)
        self._dynamo = types.SimpleNamespace(reset=lambda: None)

    def compile(self, model):
        self.compiled.append(model)
        return model


def test_the_runner_marks_each_problems_launches_and_goes_on_after_a_failure(
        tmp_path, monkeypatch):
    import types

    import kpair.capture

    session = types.SimpleNamespace(launches=7)
    torch = _FakeTorch(session)
    monkeypatch.setitem(sys.modules, "torch", torch)
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
    assert [(m["key"], m["ok"], m["first_launch"], m["last_launch"]) for m in marks] == [
        ("level1/1_good", True, 8, 19), ("level1/2_bad", False, 20, 19),
        ("level1/3_good", True, 20, 31)]
    assert marks[1]["error"] == "MemoryError: CUDA out of memory"
    assert len(torch.compiled) == 2
    assert kb.owner(20, marks) == "level1/3_good"
