"""Profiling without a GPU: kernel activity records built with ``struct`` in the layout of
CUDA 13's ``CUpti_ActivityKernel10`` are walked, decoded and aggregated through the real
ctypes callbacks (a stand-in CUPTI hands them over as the library would); the profile file,
its table and ``top``; the ``names`` capture filter; ``kpair profile`` and
``kpair capture --top`` end to end with stand-in children."""

from __future__ import annotations

import ctypes
import hashlib
import json
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from kpair.capture import activity, cupti
from kpair.capture.filters import Filter
from kpair.capture.modules import ModuleRegistry
from kpair.capture.profile import (
    KernelTimes,
    Profile,
    format_table,
    read_profile,
    top,
)
from kpair.capture.profiler import KernelProfiler
from kpair.capture.session import CaptureSession
from kpair.capture.summary import read_summary
from kpair.cli import main
from kpair.errors import FormatError, UsageError
from kpair.formats import convert, write

TESTS = Path(__file__).parent
GEMM = "_Z11gemm_kernelPfS_S_i"
ADD = "_Z10add_kernelPfS_i"
TRITON = "triton_poi_fused_add_0"

# ---------------------------------------------------------------- records as CUPTI writes them

#: CUpti_ActivityKernel10: the 112-byte prefix kpair reads, then the fields it steps over
#: (reserved0, queued, submitted, launchType..padding, sharedMemoryExecuted, graphNodeId,
#: shmemLimitConfig, graphId, pAccessPolicyWindow, channelID, channelType, cluster X/Y/Z,
#: clusterSchedulingPolicy, localMemoryTotal_v2, maxPotentialClusterSize,
#: maxActiveClusters, isDeviceLaunched, padding3[7]) — 216 bytes in all.
KERNEL10_TAIL = struct.Struct("<QQQBBBBIQIIQIIIIIIQIIB7x")
KERNEL10_SIZE = 216
#: CUpti_ActivityMemcpy6 is 80 bytes; only its kind matters here (it must be skipped).
MEMCPY_KIND, MEMCPY_SIZE = 1, 80


class Names:
    """C strings at stable addresses, as CUPTI's shared kernel names are."""

    def __init__(self, *names: str):
        self._buffers = {n: ctypes.create_string_buffer(n.encode()) for n in names}

    def __getitem__(self, name: str) -> int:
        return ctypes.addressof(self._buffers[name])


def kernel10(name_address: int, start: int, end: int, *, correlation: int = 1,
             kind: int = activity.KIND_CONCURRENT_KERNEL, grid=(128, 1, 1),
             block=(256, 1, 1)) -> bytes:
    prefix = struct.pack("<IBBHIIQQQIII3i3iiiIIIqQ", kind, 0, 0, 40, 0, 0, start, end,
                         end + 10, 0, 1, 7, *grid, *block, 0, 4096, 0, 0, correlation,
                         correlation + 1000, name_address)
    tail = KERNEL10_TAIL.pack(0, max(start - 500, 0), max(start - 100, 0), 1, 0, 0, 0, 4096,
                              0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    record = prefix + tail
    assert len(record) == KERNEL10_SIZE
    return record


def memcpy_record() -> bytes:
    return struct.pack("<I", MEMCPY_KIND) + bytes(MEMCPY_SIZE - 4)


def test_the_kernel_prefix_has_the_offsets_of_cupti_activity_h():
    # offsetof() against CUDA 13.0's cupti_activity.h, equal for CUpti_ActivityKernel4..10.
    assert activity.KERNEL_PREFIX.size == 112
    raw = bytearray(112)
    # kind, start, end, deviceId, contextId, streamId, gridX, correlationId, gridId, name
    for i, off in enumerate((0, 16, 24, 40, 44, 48, 52, 92, 96, 104)):
        raw[off] = i + 1
    r = activity.decode_kernel(raw)
    assert (r.kind, r.start, r.end, r.device, r.context, r.stream, r.grid[0], r.correlation,
            r.grid_id, r.name_address) == tuple(range(1, 11))


HEADER_PROBE = r"""
#include <stdio.h>
#include <stddef.h>
#include <cupti_activity.h>
#define P(T) printf("%zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu\n", sizeof(T), \
  offsetof(T, kind), offsetof(T, start), offsetof(T, end), offsetof(T, deviceId), \
  offsetof(T, contextId), offsetof(T, streamId), offsetof(T, gridX), offsetof(T, blockX), \
  offsetof(T, correlationId), offsetof(T, gridId), offsetof(T, name));
int main(void) { P(CUpti_ActivityKernel9) P(CUpti_ActivityKernel10)
  printf("%d %d %d %d\n", CUPTI_ACTIVITY_KIND_KERNEL, CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
         CUPTI_ACTIVITY_FLAG_FLUSH_FORCED, CUPTI_ERROR_MAX_LIMIT_REACHED); return 0; }
"""


def test_offsets_against_the_installed_cupti_header(tmp_path):
    headers = sorted(Path("/usr/local").glob("cuda*/include/cupti_activity.h"))
    cc = shutil.which("cc") or shutil.which("gcc")
    if not headers or cc is None:
        pytest.skip("no CUDA toolkit with cupti_activity.h and a C compiler here")
    src = tmp_path / "probe.c"
    src.write_text(HEADER_PROBE)
    exe = tmp_path / "probe"
    subprocess.run([cc, "-I", str(headers[-1].parent), str(src), "-o", str(exe)], check=True)
    lines = subprocess.run([str(exe)], capture_output=True, text=True,
                           check=True).stdout.split("\n")
    k9, k10 = ([int(x) for x in line.split()] for line in lines[:2])
    prefix = [0, 16, 24, 40, 44, 48, 52, 64, 92, 96, 104]
    assert k9[1:] == prefix and k10[1:] == prefix and k10[0] == KERNEL10_SIZE
    assert [int(x) for x in lines[2].split()] == [
        activity.KIND_KERNEL, activity.KIND_CONCURRENT_KERNEL, activity.FLUSH_FORCED,
        activity.ERROR_MAX_LIMIT_REACHED]


def test_decode_a_kernel10_record():
    names = Names(GEMM)
    raw = memcpy_record() + kernel10(names[GEMM], 1_000_000, 1_250_000, correlation=9,
                                     grid=(64, 2, 1), block=(128, 1, 1))
    assert activity.record_kind(raw, 0) == MEMCPY_KIND
    r = activity.decode_kernel(raw, MEMCPY_SIZE)
    assert r.kind == activity.KIND_CONCURRENT_KERNEL and r.duration == 250_000 and r.complete
    assert (r.grid, r.block, r.registers, r.dynamic_shared, r.correlation, r.grid_id,
            r.stream) == ((64, 2, 1), (128, 1, 1), 40, 4096, 9, 1009, 7)
    assert r.name_address == names[GEMM]
    assert not activity.decode_kernel(kernel10(names[GEMM], 5, 0)).complete  # end unknown
    assert not activity.decode_kernel(kernel10(names[GEMM], 0, 0)).complete


# ---------------------------------------------------------------- a stand-in libcupti

class _Entry:
    """A stand-in C entry point: callable, and takes ``argtypes``/``restype`` as ctypes'
    functions do."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args):
        return self.fn(*args)


class FakeCuptiLib:
    """The activity entry points, behaving as libcupti's do: buffers are requested through
    the registered callback, filled with the queued records, handed back on flush and
    walked record by record (each kind with its own size)."""

    SIZES = {activity.KIND_CONCURRENT_KERNEL: KERNEL10_SIZE, activity.KIND_KERNEL:
             KERNEL10_SIZE, MEMCPY_KIND: MEMCPY_SIZE}

    def __init__(self, dropped: int = 0):
        self.queued: list[bytes] = []
        self.enabled: set[int] = set()
        self.dropped = dropped
        self.calls: list[str] = []
        self.cuptiGetResultString = lambda code, out: 1
        for name in dir(self):
            if name.startswith("cuptiActivity"):
                setattr(self, name, _Entry(getattr(self, name)))

    def cuptiActivityRegisterCallbacks(self, request, complete):
        self.request, self.complete = request, complete
        return 0

    def cuptiActivityEnable(self, kind):
        self.enabled.add(kind)
        return 0

    def cuptiActivityDisable(self, kind):
        self.enabled.discard(kind)
        return 0

    def cuptiActivityFlushAll(self, flag):
        self.calls.append(f"flush {flag}")
        if self.queued:
            buf, size, most = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_size_t()
            self.request(ctypes.byref(buf), ctypes.byref(size), ctypes.byref(most))
            data = b"".join(self.queued)
            assert len(data) <= size.value and buf.value % activity.ALIGNMENT == 0
            ctypes.memmove(buf.value, data, len(data))
            self.queued = []
            self.complete(None, 0, buf.value, size.value, len(data))
        return 0

    def cuptiActivityGetNextRecord(self, buffer, valid, record_ref):
        record = record_ref._obj
        offset = 0 if record.value is None else \
            record.value - buffer + self.SIZES[ctypes.c_uint32.from_address(record.value).value]
        if offset >= valid:
            return activity.ERROR_MAX_LIMIT_REACHED
        record.value = buffer + offset
        return 0

    def cuptiActivityGetNumDroppedRecords(self, context, stream, out_ref):
        out_ref._obj.value, self.dropped = self.dropped, 0
        return 0


def fake_cupti(lib: FakeCuptiLib) -> cupti.Cupti:
    c = cupti.Cupti.__new__(cupti.Cupti)
    c.path, c.lib = "/fake/libcupti.so.13", lib
    return c


class FakeDriver:
    def __init__(self, sync: int = 0):
        self.sync = sync

    def synchronize(self):
        return self.sync

    def error_name(self, code):
        return {700: "CUDA_ERROR_ILLEGAL_ADDRESS"}.get(code, f"CUresult {code}")

    def current_device(self):
        return None

    def driver_version(self):
        return 13000


def test_activity_buffers_go_through_the_real_callbacks():
    names = Names(GEMM, ADD)
    lib = FakeCuptiLib(dropped=3)
    got = []
    act = activity.KernelActivity(fake_cupti(lib), lambda rs, name_of: got.extend(
        (name_of(r.name_address), r.duration) for r in rs))
    act.start()
    assert lib.enabled == {activity.KIND_CONCURRENT_KERNEL}  # never KERNEL: it serialises
    lib.queued = [kernel10(names[GEMM], 100, 900), memcpy_record(),
                  kernel10(names[ADD], 1000, 1010), kernel10(names[GEMM], 2000, 2700)]
    act.stop()
    assert lib.calls == [f"flush {activity.FLUSH_FORCED}"] and not lib.enabled
    assert got == [(GEMM, 800), (ADD, 10), (GEMM, 700)]
    assert act.dropped == 3 and act.buffers == 1 and act.errors == []
    assert act._buffers == {}  # the buffer is released once CUPTI hands it back


def test_a_failing_sink_is_recorded_not_raised_into_cupti(capsys):
    names = Names(GEMM)
    lib = FakeCuptiLib()

    def sink(records, name_of):
        raise RuntimeError("boom")

    act = activity.KernelActivity(fake_cupti(lib), sink)
    act.start()
    lib.queued = [kernel10(names[GEMM], 1, 2)]
    act.stop()
    assert "boom" in act.errors[0] and "internal error" in capsys.readouterr().err


# ---------------------------------------------------------------- aggregation and the file

def synthetic_times() -> KernelTimes:
    times = KernelTimes()
    for d in (900, 1000, 1100, 5000):
        times.add(GEMM, d)       # total 8000, median 1050
    for d in (10, 30, 20):
        times.add(ADD, d)        # total 60, median 20
    times.add(TRITON, 1940)      # total 1940
    return times


def test_kernel_times_math():
    kernels = synthetic_times().kernels()
    assert [k.name for k in kernels] == [GEMM, TRITON, ADD]
    g, t, a = kernels
    assert (g.launches, g.total_ns, g.median_ns, g.min_ns, g.max_ns) == (4, 8000, 1050.0, 900,
                                                                          5000)
    assert (a.launches, a.total_ns, a.median_ns, a.min_ns, a.max_ns) == (3, 60, 20.0, 10, 30)
    assert g.share == pytest.approx(0.8) and t.share == pytest.approx(0.194)
    assert sum(k.share for k in kernels) == pytest.approx(1.0)
    assert g.demangled == "gemm_kernel(float*, float*, float*, int)"
    assert t.demangled == TRITON
    assert KernelTimes().kernels() == []


def test_incomplete_records_are_counted_not_timed():
    names = Names(GEMM)
    times = KernelTimes()
    recs = [activity.decode_kernel(kernel10(names[GEMM], s, e)) for s, e in
            ((10, 20), (30, 0), (0, 0))]
    times.add_records(recs, lambda a: ctypes.string_at(a).decode())
    assert times.incomplete == 2 and [k.launches for k in times.kernels()] == [1]


def make_profile(times: KernelTimes | None = None, **kw) -> Profile:
    kernels = (times or synthetic_times()).kernels()
    fields = dict(kpair_version="0.1", command=["python", "prog.py"],
                  started="2026-12-01T00:00:00+00:00", wall_s=1.5, exit_status=0,
                  method="cupti-activity:concurrent_kernel", environment={"backend": "cuda"},
                  launches=sum(k.launches for k in kernels),
                  kernel_time_ns=sum(k.total_ns for k in kernels), incomplete_records=0,
                  dropped_records=0, notes=[], kernels=kernels)
    fields.update(kw)
    return Profile(**fields)


def test_profile_json_round_trips_and_the_reader_is_strict(tmp_path):
    profile = make_profile()
    write(tmp_path / "profile.json", profile)
    assert read_profile(tmp_path) == profile
    doc = json.loads((tmp_path / "profile.json").read_text())
    assert doc["schema"] == "kpair.profile" and doc["schema_version"] == 1
    assert doc["kernels"][0]["name"] == GEMM
    doc["kernels"][1]["share"] = 1.5
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(FormatError, match=r"kernels\[1\]\.share"):
        read_profile(tmp_path / "bad.json")
    doc["kernels"][1]["share"] = 0.1
    doc["extra"] = 1
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(FormatError, match="extra"):
        read_profile(tmp_path / "bad.json")


def test_table_and_top():
    profile = make_profile(notes=["CUPTI dropped 3 records"])
    table = format_table(profile, 2)
    lines = table.splitlines()
    assert lines[0].split()[:6] == ["#", "share", "total", "launches", "median", "max"]
    assert lines[1].split()[:5] == ["1", "80.0%", "8.0", "µs", "4"]
    assert "gemm_kernel(float*" in lines[1] and TRITON in lines[2]
    assert "(1 more kernels: 0.6% of kernel time)" in lines[3]
    assert "10.00 µs" in table or "kernel time 10.0 µs" in table
    assert "note: CUPTI dropped 3 records" in table
    assert [t.name for t in top(profile, 2)] == [GEMM, TRITON]
    assert [t.name for t in top(profile, 5)] == [GEMM, TRITON, ADD]
    assert [t.name for t in top(profile, 1, kernel=r"add")] == [TRITON]
    assert [t.name for t in top(profile, 2, kernel=r"add_kernel\(")] == [ADD]
    with pytest.raises(UsageError, match="--top"):
        top(profile, 0)
    with pytest.raises(UsageError, match="regular expression"):
        top(profile, 1, kernel="(")


def test_profiler_finish_builds_the_profile_with_notes():
    names = Names(GEMM, ADD)
    lib = FakeCuptiLib(dropped=2)
    prof = KernelProfiler(driver=FakeDriver(sync=700), lib=fake_cupti(lib)).start()
    lib.queued = [kernel10(names[GEMM], 0 + 100, 1100), kernel10(names[ADD], 2000, 2010),
                  kernel10(names[ADD], 3000, 0)]
    profile = prof.finish(["python", "p.py"], 3)
    assert profile.exit_status == 3 and profile.launches == 2
    assert profile.kernel_time_ns == 1010 and profile.incomplete_records == 1
    assert profile.dropped_records == 2 and profile.environment["cupti"].endswith(".so.13")
    assert [k.name for k in profile.kernels] == [GEMM, ADD]
    notes = " | ".join(profile.notes)
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in notes and "dropped 2" in notes
    assert "1 kernel records had no end time" in notes
    empty = KernelProfiler(driver=FakeDriver(sync=201), lib=fake_cupti(FakeCuptiLib())).start()
    assert empty.finish(["python", "p.py"]).notes == [
        "no kernel ran on the GPU in this process (kernels of processes the program started "
        "are not profiled)"]


# ---------------------------------------------------------------- the names filter

def test_names_filter_takes_the_first_dispatch_of_each_name():
    f = Filter(names=[GEMM, "add_kernel(float*, float*, int)"], distinct=True, max=2)
    assert not f.consider(TRITON, TRITON)
    assert f.consider(GEMM, "gemm_kernel(float*, float*, float*, int)")
    assert not f.consider(GEMM, "gemm_kernel(float*, float*, float*, int)")  # not twice
    assert f.seen_names() == {GEMM}
    assert f.consider(ADD, "add_kernel(float*, float*, int)")             # by demangled name
    assert f.done and f.to_json()["names"] == [GEMM, "add_kernel(float*, float*, int)"]
    assert "names" not in Filter().to_json()
    with pytest.raises(UsageError, match="empty"):
        Filter(names=[])


def test_session_notes_chosen_kernels_that_never_ran(tmp_path):
    session = CaptureSession(tmp_path / "cap", Filter(names=[GEMM, ADD], distinct=True, max=2),
                             driver=FakeDriver(), registry=ModuleRegistry())
    session.filter.consider(GEMM, GEMM)
    summary = session.close(0)
    assert summary["notes"] == [f"1 of the 2 chosen kernels were not launched in this run: "
                                f"{ADD}"]
    none = CaptureSession(tmp_path / "none", Filter(names=[GEMM], distinct=True),
                          driver=FakeDriver(), registry=ModuleRegistry())
    assert "no launch of the chosen kernels was seen" in none.close(0)["notes"][0]


# ---------------------------------------------------------------- the command line

PROFILE_CHILD = textwrap.dedent("""
    import sys
    sys.path[:0] = [{tests!r}]
    from test_profile_cpu import run_fake_profiler
    sys.exit(run_fake_profiler())
""")

CAPTURE_CHILD = textwrap.dedent("""
    import sys
    sys.path[:0] = [{tests!r}]
    from test_profile_cpu import run_fake_capture
    sys.exit(run_fake_capture())
""")


def run_fake_profiler() -> int:
    """The real ``kpair.capture.profiler.main`` with a stand-in CUPTI queueing three kernels
    (the program itself runs for real)."""
    import kpair.capture.profiler as profiler

    names = Names(GEMM, ADD, TRITON)
    lib = FakeCuptiLib()
    lib.queued = [kernel10(names[GEMM], 10**9, 10**9 + 8000),
                  kernel10(names[ADD], 10**9, 10**9 + 60),
                  kernel10(names[TRITON], 10**9, 10**9 + 1940)]
    real = profiler.KernelProfiler
    profiler.KernelProfiler = lambda: real(driver=FakeDriver(), lib=fake_cupti(lib))
    return profiler.main()


def run_fake_capture() -> int:
    """A capture child that checks the settings ``--top`` sent and writes capture.json as the
    real runner's session would, with the chosen kernels each launched once."""
    import os

    from kpair.capture.summary import ProfileUse

    settings = json.loads(os.environ.pop("KPAIR_CAPTURE"))
    assert settings["distinct"] and settings["kernel"] is None and settings["nth"] == 1
    f = Filter(settings["kernel"], settings["nth"], settings["max"], settings["distinct"],
               settings["names"])
    session = CaptureSession(settings["out"], f, driver=FakeDriver(),
                             registry=ModuleRegistry(), command=settings["command"],
                             profile=convert(settings["profile"], ProfileUse))
    for name in (ADD, GEMM, GEMM, TRITON):
        f.consider(name, name)
    session.close(0)
    return 0


@pytest.fixture
def fake_children(monkeypatch, tmp_path):
    import kpair.capture.profiler as profiler
    import kpair.capture.workflow as cli_capture

    prof, cap = tmp_path / "prof_child.py", tmp_path / "cap_child.py"
    prof.write_text(PROFILE_CHILD.format(tests=str(TESTS)))
    cap.write_text(CAPTURE_CHILD.format(tests=str(TESTS)))
    monkeypatch.setattr(cupti, "find_cupti", lambda *a: "/fake/libcupti.so")

    def profile_child(command, **kw):
        assert kw["runner"] == "kpair.capture.profiler"
        return [sys.executable, str(prof), *command[1:]]

    monkeypatch.setattr(profiler, "child_command", profile_child)
    monkeypatch.setattr(cli_capture, "child_command", lambda cmd: [sys.executable, str(cap)])
    monkeypatch.chdir(tmp_path)
    return SimpleNamespace(tmp=tmp_path)


def test_kpair_profile_writes_the_file_prints_the_table_and_returns_the_status(
        fake_children, capsys):
    out = fake_children.tmp / "p.json"
    code = main(["profile", "-o", str(out), "--top", "2", "--", "python", "-c",
                 "import sys; print('the program ran'); sys.exit(7)"])
    assert code == 7
    captured = capsys.readouterr()
    assert "the program ran" not in captured.err
    profile = read_profile(out)
    assert profile.exit_status == 7 and [k.name for k in profile.kernels] == [GEMM, TRITON, ADD]
    assert profile.command == ["python", "-c", "import sys; print('the program ran'); "
                               "sys.exit(7)"]
    assert "80.0%" in captured.err and "(1 more kernels" in captured.err
    assert f"3 kernels written to {out}" in captured.err


def test_kpair_profile_when_the_program_crashes_before_writing(fake_children, monkeypatch,
                                                               capsys):
    import kpair.capture.profiler as profiler

    monkeypatch.setattr(profiler, "child_command", lambda command, **kw: [
        sys.executable, "-c", "import os; os._exit(9)"])
    assert main(["profile", "--", "python", "prog.py"]) == 9
    assert "no profile was written" in capsys.readouterr().err
    assert not (fake_children.tmp / "profile.json").exists()
    (fake_children.tmp / "profile.json").write_text("mine")
    assert main(["profile", "--", "python", "prog.py"]) == 2  # never overwritten
    assert "exists; kpair does not replace it (pass --force" in capsys.readouterr().err
    assert (fake_children.tmp / "profile.json").read_text() == "mine"


@pytest.mark.parametrize("argv, message", [
    (["profile"], "no command given: kpair profile"),
    (["profile", "--", "./a.out"], "kpair profile runs Python programs"),
    (["profile", "--top", "0", "--", "python", "p.py"], "--top: must be an integer in [1,"),
    (["capture", "-o", "OUT", "--top", "0", "--", "python", "p.py"],
     "--top: must be an integer in [1,"),
    (["capture", "-o", "OUT", "--top", "2", "--max", "3", "--", "python", "p.py"],
     "does not combine"),
    (["capture", "-o", "OUT", "--top", "2", "--distinct", "--", "python", "p.py"],
     "does not combine"),
])
def test_bad_profile_command_lines_are_usage_errors(argv, message, tmp_path, capsys,
                                                    monkeypatch):
    monkeypatch.setattr(cupti, "find_cupti", lambda *a: "/fake/libcupti.so")
    argv = [str(tmp_path / "o") if a == "OUT" else a for a in argv]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_capture_top_profiles_then_captures_the_chosen_kernels(fake_children, capsys):
    out = fake_children.tmp / "cap"
    code = main(["capture", "-o", str(out), "--top", "2", "--", "python", "-c", "pass"])
    assert code == 0
    err = capsys.readouterr().err
    assert "the 2 most expensive kernels take 99.4%" in err
    summary = read_summary(out)
    assert summary.filter.names == [GEMM, TRITON] and summary.filter.max == 2
    used = summary.profile
    assert [(c.rank, c.name) for c in used.chosen] == [(1, GEMM), (2, TRITON)]
    assert used.top == 2 and used.file == "profile.json"
    data = (out / "profile.json").read_bytes()
    assert used.sha256 == hashlib.sha256(data).hexdigest()
    assert read_profile(out).kernels[0].name == GEMM
    assert summary.matched == 2 and summary.notes == []


def test_capture_top_with_a_kernel_pattern_chooses_among_its_matches(fake_children, capsys):
    out = fake_children.tmp / "cap"
    assert main(["capture", "-o", str(out), "--top", "5", "--kernel", "add", "--",
                 "python", "-c", "pass"]) == 0
    summary = read_summary(out)
    assert summary.filter.names == [TRITON, ADD] and summary.profile.kernel == "add"
    assert summary.filter.kernel is None  # the pattern chose the names; capture needs no more
    assert main(["capture", "-o", str(fake_children.tmp / "none"), "--top", "1", "--kernel",
                 "softmax", "--", "python", "-c", "pass"]) == 0
    assert "no kernel matched --kernel 'softmax'" in capsys.readouterr().err
