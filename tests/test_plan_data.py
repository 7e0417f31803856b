"""Memset and copy launches in plans (kpair.plan, kpair.program): a plan carries
``{"kind": "memset", "dst": ..., "value", "element_size", "count"}`` and
``{"kind": "copy", "dst": ..., "src": ..., "size"}`` beside its kernels, bound to the range's
regions and scratch as pointer parameters are, checked before any launch (inside bounds, never
writing a live-in region), replayed as steps and timed: a timed execution covers every step,
so work done in a copy is not free."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import CSRC, mlp_arrays, record_mlp_range, run_json
from kpair.backends import Device
from kpair.errors import FormatError
from kpair.pipeline import RunOptions
from kpair.plan import Plan, PlanError, Target, TargetRegion, check_plan
from kpair.program import CopyStep, MemsetStep, Program, ProgramDevice, Step
from kpair.snapshot import Launch, Param
from kpair.toolchain import compile_shared

N = 256
TARGET = Target({"a": TargetRegion(64, "in"), "out": TargetRegion(64, "out")})
KERNEL = {"code": "k.so", "kernel": "k", "args": [
    {"bind": "region", "name": "a"}, {"bind": "region", "name": "out", "access": "write"}]}
LAYOUT = (Param(0, 8, "pointer", "a"), Param(8, 8, "pointer", "out"))


def _read(tmp_path: Path, launches: list, scratch=()) -> Plan:
    path = tmp_path / "opt.plan.json"
    path.write_text(json.dumps({"schema": "kpair.plan", "schema_version": 1,
                                "scratch": list(scratch), "launches": launches}))
    return Plan.read(path)


def _check(tmp_path: Path, data: dict, scratch=()) -> None:
    plan = _read(tmp_path, [data, KERNEL], scratch)
    check_plan(plan, TARGET, [None if x.data else LAYOUT for x in plan.launches])


def _memset(dst: dict, count: int = 16, element_size: int = 4, value: int = 0) -> dict:
    return {"kind": "memset", "dst": dst, "value": value, "element_size": element_size,
            "count": count}


def test_good_memsets_and_copies_are_accepted(tmp_path):
    _check(tmp_path, _memset({"bind": "region", "name": "out"}))
    _check(tmp_path, _memset({"bind": "scratch", "name": "t", "offset": 32}, count=8,
                             element_size=2, value=0xFFFF), [{"name": "t", "size": 48}])
    _check(tmp_path, {"kind": "copy", "dst": {"bind": "region", "name": "out", "offset": 32},
                      "src": {"bind": "region", "name": "a"}, "size": 32})


BAD = {
    "memset_writes_live_in": (_memset({"bind": "region", "name": "a"}),
                              r"launch 0 \(memset\) dst: region 'a' is live-in"),
    "memset_past_the_end": (_memset({"bind": "region", "name": "out", "offset": 4}),
                            r"launch 0 \(memset\) dst: reaches 64 bytes from offset 4, past "
                            r"the end of region 'out'"),
    "copy_writes_live_in": ({"kind": "copy", "dst": {"bind": "region", "name": "a"},
                             "src": {"bind": "region", "name": "out"}, "size": 8},
                            r"launch 0 \(copy\) dst: region 'a' is live-in"),
    "copy_reads_past_the_end": ({"kind": "copy", "dst": {"bind": "scratch", "name": "t"},
                                 "src": {"bind": "region", "name": "a", "offset": 40},
                                 "size": 32},
                                r"launch 0 \(copy\) src: reaches 32 bytes from offset 40"),
    "copy_overlaps_itself": ({"kind": "copy", "dst": {"bind": "region", "name": "out"},
                              "src": {"bind": "region", "name": "out", "offset": 8},
                              "size": 16},
                             r"launch 0 \(copy\): source and destination overlap in 'out'"),
    "memset_unknown_region": (_memset({"bind": "region", "name": "tmp"}),
                              r"the range has no region 'tmp'"),
    "memset_bytes_disagree": (_memset({"bind": "region", "name": "out", "bytes": 8}),
                              r"dst: binds 8 bytes, the memset moves 64"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_memset_or_copy_is_refused_naming_the_fault(tmp_path, case):
    data, message = BAD[case]
    with pytest.raises(PlanError, match=message):
        _check(tmp_path, data, [{"name": "t", "size": 64}])


BAD_FILES = {
    "memset_without_dst": ({"kind": "memset", "count": 4}, r"launches\[0\].dst"),
    "memset_with_a_kernel": ({**_memset({"bind": "region", "name": "out"}), "kernel": "k"},
                             r"launches\[0\].kind: a memset launch has no code object"),
    "memset_value_too_wide": (_memset({"bind": "region", "name": "out"}, element_size=1,
                                      value=256), r"launches\[0\].value"),
    "copy_without_src": ({"kind": "copy", "dst": {"bind": "region", "name": "out"},
                          "size": 8}, r"launches\[0\].src"),
    "element_size_3": (_memset({"bind": "region", "name": "out"}, element_size=3),
                       r"launches\[0\].element_size"),
    "kernel_without_name": ({"code": "k.so", "args": []}, r"launches\[0\].kernel"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_malformed_memset_or_copy_names_the_field(tmp_path, case):
    data, message = BAD_FILES[case]
    with pytest.raises(FormatError, match=message):
        _read(tmp_path, [data])


def test_a_plan_of_memsets_only_is_refused(tmp_path):
    plan = _read(tmp_path, [_memset({"bind": "region", "name": "out"})])
    with pytest.raises(PlanError, match="at least one kernel"):
        check_plan(plan, TARGET, [None])


# ------------------------------------------------------------------- timing covers every step


class _Slow(Device):
    """A device whose kernels take no time and whose copies and memsets take 30 ms; its
    window clock is a CPU-like clock that sees the kernels only (as host's does)."""

    backend, compares_in_place = "fake", False

    def __init__(self):
        self.log: list[str] = []

    def arch(self):
        return "fake"

    def load(self, *a, **k):
        raise NotImplementedError

    def map(self, *a, **k):
        raise NotImplementedError

    def stage(self, *a):
        raise NotImplementedError

    def read(self, address, size):
        return bytes(size)

    def write(self, address, data):
        raise NotImplementedError

    def fill(self, address, size, word):
        time.sleep(0.03)
        self.log.append("fill")

    def copy(self, dst, src, size):
        time.sleep(0.03)
        self.log.append("copy")

    def launch(self, kernel, launch, kernarg, params):
        self.log.append("kernel")

    def timed_launch(self, kernel, launch, kernarg, params):
        self.log.append("kernel")
        return 1e-6

    def window_clock(self):
        return 0.0

    def close(self):
        pass

    def environment(self):
        return {}

    def flush_cache(self):
        pass

    def restore(self):
        pass


def test_a_timed_execution_counts_its_memsets_and_copies():
    inner = _Slow()
    dev = ProgramDevice(inner)
    step = Step(object(), Launch((1, 1, 1), (1, 1, 1)), b"", ())
    program = Program("p", [MemsetStep(0x1000, 64, 0, 4), step, CopyStep(0x2000, 0x1000, 64)],
                      [])
    w0 = dev.window_clock()
    t = dev.timed_launch(program, Launch((1, 1, 1), (1, 1, 1)), b"", ())
    window = dev.window_clock() - w0
    assert inner.log == ["fill", "kernel", "copy"]   # every step, in order
    assert t >= 0.06            # the copy and the memset are not free
    assert window >= t - 1e-6   # a window on a CPU-like clock covers what the timer counts


class _Sequenced(_Slow):
    """A stream device (as CUDA is): one timed sequence, one event pair around all."""

    def timed_sequence(self, steps):
        self.log.append(steps)
        return 0.5


def test_a_stream_device_times_every_step_in_one_sequence():
    inner = _Sequenced()
    kernel = object()
    launch = Launch((2, 1, 1), (32, 1, 1))
    step = Step(kernel, launch, b"k", ())
    program = Program("p", [MemsetStep(0x1000, 64, 0xAB, 1), step,
                            CopyStep(0x2000, 0x1000, 64)], [])
    assert ProgramDevice(inner).timed_launch(program, launch, b"", ()) == 0.5
    assert inner.log == [[("memset", 0x1000, 64, 0xABABABAB),
                          ("kernel", kernel, launch, b"k", ()),
                          ("copy", 0x2000, 0x1000, 64)]]


# ------------------------------------------------------------------- judged end to end (host)


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("plandata")
    lib = compile_shared(CSRC / "range_ops.c", d / "ops.so", flags=("-O2", "-g"))
    record_mlp_range(lib, d / "snap", mlp_arrays(N), N)
    return {"dir": d, "lib": lib, "snap": d / "snap"}


def _fused_via_copy(dst_of_memset: str = "out") -> dict:
    """kp_fused writes a scratch buffer; a copy moves it to ``out``; a memset zeroes
    ``dst_of_memset`` first."""
    return {"schema": "kpair.plan", "schema_version": 1,
            "scratch": [{"name": "row", "size": N * 4}, {"name": "big", "size": N * N * 4}],
            "launches": [
                _memset({"bind": "region", "name": dst_of_memset}, count=N * N if
                        dst_of_memset == "out" else N),
                {"code": "ops.so", "kernel": "kp_fused", "args": [
                    {"bind": "scalar", "kind": "i32", "value": N},
                    {"bind": "region", "name": "bias"}, {"bind": "region", "name": "a"},
                    {"bind": "region", "name": "b"}, {"bind": "scratch", "name": "big"},
                    {"bind": "scratch", "name": "row"}]},
                {"kind": "copy", "dst": {"bind": "region", "name": "out"},
                 "src": {"bind": "scratch", "name": "big"}, "size": N * N * 4}]}


def _write(lab: dict, name: str, plan: dict) -> Path:
    d = lab["dir"] / f"plan-{name}"
    d.mkdir(exist_ok=True)
    (d / "ops.so").write_bytes(lab["lib"].read_bytes())
    (d / "opt.plan.json").write_text(json.dumps(plan))
    return d / "opt.plan.json"


def test_a_plan_with_a_memset_and_a_copy_passes(lab):
    from kpair.harness import create_harness

    h = create_harness(lab["snap"], lab["dir"] / "H", plan=_write(lab, "good",
                                                                    _fused_via_copy()))
    r = run_json(h.root, RunOptions(time_cap_s=2.0, max_blocks=32, timeout_s=300))
    assert r["status"] == "pass", r.get("correctness") or r.get("error")
    assert r["replay"]["plan_launches"] == 3
    assert all(t["passed"] is not False for t in r["trust"].values())


def test_a_plan_whose_memset_writes_a_live_in_region_is_refused(lab, tmp_path):
    path = _write(lab, "bias", _fused_via_copy("bias"))
    proc = subprocess.run([sys.executable, "-m", "kpair", "pair", str(lab["snap"]), "--plan",
                           str(path), "-o", str(tmp_path / "H")], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 3, proc.stderr
    assert "launch 0 (memset) dst: region 'bias' is live-in" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1   # one line, no traceback
    assert not (tmp_path / "H").exists()


def test_cuda_times_every_step_in_one_event_pair_on_its_stream():
    """On the fake CUDA driver of test_cuda_cpu: a memset, a kernel and a copy are enqueued
    between one pair of event records, and the copy moves the bytes on the device."""
    from kpair.backends.cuda import CudaDevice
    from test_cuda_cpu import MemoryDriver

    drv = MemoryDriver()
    dev = CudaDevice(drv)
    try:
        lo = 0x7F12_4020_0000
        dev.map([(lo, lo + 4096)])
        k = dev.load(b"cubin", "axpy", fmt="cubin")
        params = (Param(0, 8, "pointer"), Param(8, 8, "pointer"), Param(16, 4, "f32"),
                  Param(20, 4, "i32"))
        launch = Launch((1, 1, 1), (32, 1, 1))
        program = Program("p", [MemsetStep(lo, 64, 7, 4), Step(k, launch, bytes(24), params),
                                CopyStep(lo + 1024, lo, 64)], [])
        start = len(drv.calls)
        t = ProgramDevice(dev).timed_launch(program, launch, b"", ())
        names = [c[0] for c in drv.calls[start:]]
        timed = names[names.index("cuEventRecord"):
                      len(names) - names[::-1].index("cuEventRecord")]
        assert [n for n in timed if n in ("cuEventRecord", "cuMemsetD32Async",
                                          "cuLaunchKernelEx", "cuMemcpyDtoDAsync")] == [
            "cuEventRecord", "cuMemsetD32Async", "cuLaunchKernelEx", "cuMemcpyDtoDAsync",
            "cuEventRecord"]
        assert t == pytest.approx(0.25e-3)   # the fake's one elapsed time: one event pair
        assert dev.read(lo + 1024, 64) == (7).to_bytes(4, "little") * 16
    finally:
        dev.close()
