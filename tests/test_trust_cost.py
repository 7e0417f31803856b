"""What the checks cost, counted: a checked run does no device work or host byte work that
gives nothing (issue 44, "trust overhead still <= 1.5x"), with every check as it was.

Run in-process on the host backend through a counting proxy, on both of the audit's paths:
the host's (``compares_in_place`` False: regions read back) and a GPU's (True: held copies
and compares where the memory is, on the host's read-based defaults). Cases: y = a*x + y
(an update in place) and z = a*x + y (a write-only output), 64 Ki floats per region.
"""

from __future__ import annotations

import numpy as np
import pytest

from kpair.harness import create_harness
from kpair.pipeline import RunOptions
from kpair.record import record_call
from kpair.toolchain import compile_shared

N = 64 << 10
QUICK = RunOptions(time_cap_s=2.0, min_blocks=8, max_blocks=8, seed=3, timeout_s=120,
                   device_options={"flush_bytes": 1 << 20})
SRC = """#include <stdint.h>
void kp_axpy(const float *x, float *y, float a, int32_t n) {
    for (int32_t i = 0; i < n; i++) y[i] = a * x[i] + y[i];
}
void kp_axpbyz(const float *x, const float *y, float *z, float a, int32_t n) {
    for (int32_t i = 0; i < n; i++) z[i] = a * x[i] + y[i];
}
"""


class Counting:
    """A device, every call passed through; calls per stage and method."""

    def __init__(self, inner, in_place: bool):
        self._inner, self._in_place, self.current = inner, in_place, "place"
        self.calls: dict[str, dict[str, int]] = {}

    @property
    def compares_in_place(self) -> bool:
        return self._in_place

    def __getattr__(self, name: str):
        attr = getattr(self._inner, name)
        if not callable(attr) or name.startswith("_"):
            return attr

        def counted(*args, **kw):
            stage = self.calls.setdefault(self.current, {})
            stage[name] = stage.get(name, 0) + 1
            return attr(*args, **kw)

        return counted


@pytest.fixture(scope="module")
def harnesses(tmp_path_factory):
    d = tmp_path_factory.mktemp("trust_cost")
    (d / "k.c").write_text(SRC)
    lib = compile_shared(d / "k.c", d / "k.so")
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(N, np.float32), rng.standard_normal(N, np.float32)
    axpy = record_call(lib, "kp_axpy", [x, y.copy(), np.float32(1.5), np.int32(N)],
                       d / "axpy", names=["x", "y", "a", "n"])
    axpbyz = record_call(lib, "kp_axpbyz", [x, y, np.zeros(N, np.float32), np.float32(1.5),
                                            np.int32(N)], d / "axpbyz",
                         names=["x", "y", "z", "a", "n"])
    return {"axpy": create_harness(axpy.root, d / "h-axpy", opt=lib).root,
            "axpbyz": create_harness(axpbyz.root, d / "h-axpbyz", opt=lib).root}


def _run(root, in_place: bool, monkeypatch, inspect=None):
    """One checked in-process run: (result.json, the Run, calls per stage, must_move);
    ``inspect(run)`` is called before its device is closed."""
    import kpair.pipeline as pipeline
    from kpair.pipeline import Facts, close, evaluate, own_candidate, prepare

    real, made = pipeline.open_device, []

    def opening(*a, **kw):
        made.append(Counting(real(*a, **kw), in_place))
        return made[-1]

    def stage(name: str) -> None:
        if made:
            made[-1].current = name

    monkeypatch.setattr(pipeline, "open_device", opening)
    run, failed = prepare(root, QUICK, facts=Facts(harness=str(root), started="now"),
                          stage=stage)
    try:
        assert failed is None, failed.summary()
        result, _ = evaluate(run, own_candidate(run.harness), stage)
        must_move = run.audit.must_move()
        if inspect is not None:
            inspect(run)
        return result.to_json(), run, made[-1].calls, must_move
    finally:
        close(run)


def _changed(pre: bytes, post: bytes) -> int:
    return int(np.count_nonzero(np.frombuffer(pre, np.uint8) != np.frombuffer(post, np.uint8)))


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("case", ["axpy", "axpbyz"])
def test_changed_bytes_and_must_move_are_counted_once_and_right(harnesses, case, in_place,
                                                                 monkeypatch):
    """The bytes ref changes (``noop``) and must_move read what a byte-by-byte comparison of
    the pre-state and ref's answer reads, counted once (on a GPU's path, on the device)."""
    r, run, _, must_move = _run(harnesses[case], in_place, monkeypatch)
    assert r["status"] == "pass", r.get("correctness")
    replay = run.replay
    want = {n: _changed(replay.pre[n], replay.expected[n]) for n in replay.pre}
    assert r["trust"]["noop"]["finding"]["changed_bytes"] == want
    out = "y" if case == "axpy" else "z"
    assert want[out] > N * 4 * 0.9 and want["x"] == 0
    poisoned = run.audit.armor.plan
    need = want[out] if out not in poisoned else 4 * N   # z: every byte write-only
    assert must_move == need


@pytest.mark.parametrize("in_place", [False, True])
def test_an_updated_region_takes_one_discovery_fill(harnesses, in_place, monkeypatch):
    """y is read and written: after the first fill no element comes out as in ref's answer,
    so no second fill can make a byte write-only; x is an input (one fill shows it). A
    write-only output (z) still takes both fills, and is poisoned."""
    r, run, calls, _ = _run(harnesses["axpy"], in_place, monkeypatch)
    assert r["status"] == "pass", r.get("correctness")
    assert calls["trust:poison"]["launch"] == 2
    assert run.audit.not_tested["y"] == \
        "ref's output in it depends on what it held (read and written)"
    assert run.audit.not_tested["x"].startswith("ref reads it")
    assert "y" in run.audit._in_place
    if in_place:   # an input's fill changed y: told by a compare on the device, nothing read
        assert "fetch" not in calls["trust:poison"] and "read" not in calls["trust:poison"]
    r, run, calls, _ = _run(harnesses["axpbyz"], in_place, monkeypatch)
    assert r["status"] == "pass", r.get("correctness")
    assert set(run.audit.armor.plan) == {"z"}
    # x and y one fill each, z two, then ref's control under each of the two poisons; the
    # first candidate is judged under those proven poisons: opt's three runs, no control again
    assert calls["trust:poison"]["launch"] == 1 + 1 + 2 + 2
    assert calls["opt"]["launch"] == 3
    if in_place:
        assert "fetch" not in calls["trust:poison"] and "read" not in calls["trust:poison"]
    assert r["trust"]["poisoned_outputs"]["passed"] is True


def test_sparse_inputs_are_held_from_the_pre_state_in_one_batch(harnesses, monkeypatch):
    """On a GPU's path each sparse input's device copy is made from the held pre-state and
    its changed words in one batch (``Device.patch``), not a write (and a wait) per word; the
    copy holds exactly the input."""
    held = []

    def inspect(run):
        for _, state, _, _ in run.audit.variants[1:]:
            for name, data in state.items():
                copy = run.replay.known.find(name, data)
                held.append(copy is not None and run.replay.device.fetch(copy) == data)

    r, run, calls, _ = _run(harnesses["axpy"], True, monkeypatch, inspect)
    assert r["status"] == "pass", r.get("correctness")
    mutate = calls["trust:mutate"]
    sparse = [v for v in run.audit.variants if v[1] is not None]
    assert len(sparse) == 2 and all(set(v[1]) == {"x", "y"} for v in sparse)
    assert held == [True] * 4
    assert mutate["patch"] == 4
    # Only the whole-region mutated inputs are written from the host (x and y, one run).
    whole = len(run.audit._mutated) - len(sparse)
    assert whole >= 1 and mutate["write"] == 2 * whole
    assert r["trust"]["differential"]["passed"] is True


def test_check_many_on_a_gpu_is_one_pass_with_each_check_s_own_answer():
    """``Device.check_many`` on the CUDA backend (fake driver with memory, the check kernels
    run as their host reference): the canary checks and the compares after a launch in one
    kp_diff launch and one read of the counters, each answer the one ``check_fills`` and
    ``compare`` give alone; an overwritten held copy still reads None."""
    from test_cuda_cpu import MIB, _memory_device

    drv, dev = _memory_device()
    try:
        lo = 0x7F12_4000_0000
        dev.map([(lo, lo + 2 * MIB)])
        rng = np.random.default_rng(5)
        a, b = lo + 4096, lo + MIB
        dev.write(a, rng.bytes(300_000))
        dev.write(b, rng.bytes(70_001))
        ha, hb = dev.keep(a, 300_000), dev.keep(b, 70_001)
        dev.write(a + 77, b"\0\1\2")                         # a now differs in <= 3 bytes
        dev.fill_many([(lo, 4096), (a + 300_000, 512)], 0xC0FFEE11)
        dev.write(lo + 100, b"x")                            # one canary byte overwritten
        spans, compares = [(lo, 4096), (a + 300_000, 512)], [(a, 300_000, ha), (b, 70_001, hb)]
        alone = (dev.check_fills(spans, 0xC0FFEE11),
                 [dev.compare(x, n, h) for x, n, h in compares])
        before = sum(c[0] == "cuLaunchKernel" for c in drv.calls)
        both = dev.check_many(spans, 0xC0FFEE11, compares)
        assert sum(c[0] == "cuLaunchKernel" for c in drv.calls) - before == 1
        assert both == alone
        assert both[0][0] == (1, 100) and both[0][1] == (0, None)
        assert both[1][0][0] and both[1][0][1] >= 77 and both[1][1] == (0, None)
        dev.write(hb.ptr, b"\xff" * 8)                       # the held copy overwritten
        assert dev.check_many([], 0, compares)[1][1] is None
    finally:
        dev.close()


LATE = """#include <stdint.h>
void kp_axpy(const float *x, float *y, float a, int32_t n) {
    static unsigned calls;
    for (int32_t i = 0; i < n; i++) y[i] = a * x[i] + y[i];
    if (++calls >= 4) y[7] += 1.0f;    /* from its first timing window on */
}
"""


@pytest.mark.parametrize("in_place", [False, True])
def test_a_wrong_timed_launch_on_the_captured_input_still_fails(harnesses, tmp_path, in_place,
                                                                monkeypatch):
    """With no mutations (``"mutations": []``) every timed launch runs the captured input and
    is judged against its expected output; on a GPU's path that compare runs with the
    launch's canary check (``Device.check_many``). A kernel right on its three check runs and
    wrong from its first timing window on fails timed_outputs there."""
    from kpair.policy import Policy

    (tmp_path / "late.c").write_text(LATE)
    late = compile_shared(tmp_path / "late.c", tmp_path / "late.so")
    snap = harnesses["axpy"].parent / "axpy"
    root = create_harness(snap, tmp_path / "h-late", opt=late,
                          policy=Policy(mutations=())).root
    r, _, calls, _ = _run(root, in_place, monkeypatch)
    assert r["status"] == "fail", r.get("speed")
    assert r["correctness"]["failed_check"] == "timed_outputs", r["correctness"]
    failed = r["trust"]["timed_outputs"]["finding"]["failed"]
    assert failed[0]["launch"] == 1 and failed[0]["window"] is True, failed
    if in_place:
        assert calls["trust:timing"].get("check_many", 0) >= 1


def test_holds_pointers_finds_what_patch_pointers_would_shift():
    """The chunked scan says a region holds a pointer exactly where ``patch_pointers`` would
    shift a word: any alignment, chunk size, word at a chunk's edge, empty span."""
    from kpair.placement import holds_pointers, patch_pointers

    rng = np.random.default_rng(1)
    seen = set()
    for _ in range(300):
        n = int(rng.integers(0, 3000))
        data = bytearray(rng.integers(0, 256, n, np.uint8).tobytes())
        base = int(rng.integers(0, 64))
        lo = int(rng.integers(0, 2**63))
        hi = lo + int(rng.integers(1, 2**40)) if rng.random() > 0.1 else lo - 5
        if n >= 16 and hi > lo and rng.random() < 0.5:
            skip = (-base) % 8
            k = int(rng.integers(0, (n - skip) // 8))
            data[skip + 8 * k:skip + 8 * k + 8] = int(rng.integers(lo, hi)).to_bytes(8, "little")
        want = patch_pointers(bytes(data), base, lo, hi, 1)[1] > 0
        seen.add(want)
        for chunk in (1, 3, 1 << 17):
            assert holds_pointers(bytes(data), base, lo, hi, chunk=chunk) == want
    assert seen == {True, False}


def test_findings_redrawn_after_every_stage_judge_each_run_once(harnesses, tmp_path,
                                                                 monkeypatch):
    """The findings are redrawn after every stage of a candidate (``Run.failure``) from the
    same runs. Each run's whole-region work (opt_determinism's verdict against the first run,
    the poison it left, the bias sign tests of each declared float range) is done once per
    run: on the CUDA demo's softmax (32 MiB, cosine) redoing it cost about 5 s a stage, and
    the run passed its 70 s --timeout in trust:ref."""
    import kpair.trust.findings as findings_mod
    from kpair.policy import Policy, Tolerance

    snap = harnesses["axpbyz"].parent / "axpbyz"
    policy = Policy((Tolerance("z", 0, 4 * N, "float32", "cosine", min_cosine=0.9999),))
    root = create_harness(snap, tmp_path / "h-cos", opt=harnesses["axpbyz"].parent / "k.so",
                          policy=policy).root
    work = {"check": [], "poison_left": [], "bias_stats": []}
    for name in work:
        real = getattr(findings_mod, name)

        def counted(*a, _real=real, _name=name, **kw):
            work[_name].append(a)
            return _real(*a, **kw)

        monkeypatch.setattr(findings_mod, name, counted)
    redrawn = {}

    def inspect(run):
        audit = run.audit
        runs = audit.opt_runs + audit.diff_runs
        assert len(audit.opt_runs) == 3 and runs
        first = {k: len(v) for k, v in work.items()}
        for _ in range(3):   # as after three more stages: the cache key moved each time
            audit._cache = None
            audit.findings()
        redrawn.update({k: len(v) - first[k] for k, v in work.items()})
        redrawn["before"] = first

    r, run, _, _ = _run(root, True, monkeypatch, inspect)
    assert r["status"] == "pass", r.get("correctness")
    assert r["trust"]["bias"]["passed"] is True and r["trust"]["opt_determinism"]["passed"]
    first = redrawn.pop("before")
    # Each run's own work was done (z is poisoned and a declared float range) ...
    assert first["poison_left"] >= 3 and first["bias_stats"] >= 3 and first["check"] >= 2
    # ... and none of it again when the findings are redrawn.
    assert redrawn == {"check": 0, "poison_left": 0, "bias_stats": 0}, redrawn
