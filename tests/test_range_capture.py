"""Range capture's pure parts on the CPU: the range state machine (kpair.capture.ranges) fed
with synthetic NVTX/mark events, launches, memsets and copies against a FAKE driver that
serves device memory from a dict. None of this is GPU behaviour: the fake stands in for
libcuda so the ordering, region union, pre-state timing, roles, scratch and refusal reasons
can be checked here; tests/gpu/test_range_capture.py runs the real thing on a GPU.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import struct
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import kpair
from kpair import marks
from kpair.capture import cupti
from kpair.capture.launches import LaunchInfo
from kpair.capture.ranges import MemoryOp, RangeSession, allocated, merge_extents
from kpair.capture.regions import Block, BlockTable
from kpair.capture.session import KernelInfo
from kpair.capture.summary import read_summary
from kpair.describe import describe_snapshot
from kpair.program import CopyStep, MemsetStep, Program, ProgramDevice, Step
from kpair.snapshot import CodeObject, Kernarg, Manifest, Region, Snapshot

SEG = 0x7F0000000000
X, W, Y, T, C = SEG, SEG + 0x100, SEG + 0x400, SEG + 0x800, SEG + 0xC00
SIZE = 0x100
THREAD = threading.get_ident()


def _cubin(tag: bytes) -> bytes:
    head = bytearray(64)
    head[:4], head[4], head[5] = b"\x7fELF", 2, 1
    struct.pack_into("<H", head, 18, 190)   # EM_CUDA: detect_format says cubin
    return bytes(head) + tag


class FakeDriver:
    """Device memory as a dict of allocations; every call capture makes, answered."""

    def __init__(self):
        self.mem: dict[int, bytearray] = {}
        self.capturing: set[int] = set()
        self.syncs = 0
        self.reads: list[tuple[int, int]] = []

    def alloc(self, base: int, data: bytes) -> None:
        self.mem[base] = bytearray(data)

    def _find(self, address: int):
        for base, m in self.mem.items():
            if base <= address < base + len(m):
                return base, m
        return None

    def read(self, address: int, size: int) -> bytearray:
        base, m = self._find(address)
        assert address - base + size <= len(m), "read past an allocation"
        self.reads.append((address, size))
        return bytearray(m[address - base:address - base + size])

    def poke(self, address: int, data: bytes) -> None:   # what a kernel would write
        base, m = self._find(address)
        m[address - base:address - base + len(data)] = data

    def synchronize(self) -> int:
        self.syncs += 1
        return 0

    def address_range(self, pointer: int):
        found = self._find(pointer)
        return (found[0], len(found[1])) if found else None

    def stream_capturing(self, stream: int) -> bool:
        return stream in self.capturing

    def error_name(self, code: int) -> str:
        return f"CUresult {code}"

    def current_device(self):
        return None


class FakeRegistry:
    images: dict = {}
    total_bytes = 0

    def find(self, name, handles):
        return SimpleNamespace(image=_cubin(name.encode()), module_id=7, how="test")


class World:
    """A session over a fake device: one segment with blocks x, w, y, tmp, c."""

    def __init__(self, tmp_path, **options):
        self.driver = FakeDriver()
        self.driver.alloc(SEG, random.Random(47).randbytes(0x1000))   # one 4 KiB segment
        self.states = {X: "active_allocated", W: "active_allocated", Y: "active_allocated",
                       T: "active_allocated", C: "active_allocated"}
        self.keep: list = []
        self.out = tmp_path / "cap"
        options.setdefault("max_region_bytes", 1 << 20)
        self.session = RangeSession(self.out, options.pop("ranges", ["fwd"]),
                                    driver=self.driver, registry=FakeRegistry(),
                                    blocks=self.blocks, command=["python", "prog.py"],
                                    **options)
        self.correlation = 0

    def blocks(self) -> BlockTable:
        return BlockTable(Block(a, SIZE, SEG, 0x1000, "torch-block", s)
                          for a, s in self.states.items())

    def launch(self, name: str, pointers: list[int], stream: int = 0x51) -> None:
        values = [ctypes.c_uint64(p) for p in pointers]
        array = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        self.keep.append((values, array))
        info = LaunchInfo("cuLaunchKernel", hash(name) & 0xFFFF, (1, 1, 1), (64, 1, 1), 0,
                          stream, ctypes.addressof(array), 0)
        kernel = KernelInfo(hash(name) & 0xFFFF, name, name,
                            [(8 * i, 8) for i in range(len(pointers))], "test")
        self.correlation += 1
        self.session.launch_enter(info, kernel, self.correlation)
        self.session.launch_exit(self.correlation, 0)

    def summary(self) -> dict:
        return json.loads((self.out / "capture.json").read_text())


def _forward(w: World, outputs=()) -> None:
    """memset y; k1(x, w, tmp): tmp written; copy x -> c; k2(tmp, y); tmp freed."""
    s, d = w.session, w.driver
    s.range_begin("fwd", THREAD, "mark")
    s.memory_op(MemoryOp("cuMemsetD32Async", "memset", Y, 0, SIZE, 0, 4, 0x51))
    d.poke(Y, bytes(SIZE))
    w.launch("k1", [X, W, T])
    d.poke(T, b"\x11" * SIZE)
    s.memory_op(MemoryOp("cuMemcpyDtoDAsync_v2", "copy", C, X, SIZE, stream=0x52))
    d.poke(C, bytes(d.read(X, SIZE)))
    w.launch("k2", [T, Y])
    d.poke(Y, b"\x22" * SIZE)
    w.states[T] = "inactive"   # tmp freed inside the range
    s.range_end("fwd", THREAD, list(outputs))


def test_a_range_holds_every_operation_in_order_with_roles_and_scratch(tmp_path):
    w = World(tmp_path)
    original = bytes(w.driver.mem[SEG])
    _forward(w, outputs=[(Y, SIZE)])
    w.session.close(0)
    snap = Snapshot.open(w.out / "fwd")
    m = snap.manifest
    assert [o.kind for o in m.ops] == ["memset", "kernel", "copy", "kernel"]
    assert [o.label for o in m.ops] == ["memset", "k1", "copy", "k2"]
    assert m.code.kernel_name == "k1"          # the first kernel is the top-level one
    assert (m.ops[0].dst, m.ops[0].size, m.ops[0].element_size) == (Y, SIZE, 4)
    assert (m.ops[2].dst, m.ops[2].src, m.ops[2].stream) == (C, X, 0x52)
    roles = {r.address: r.role for r in m.regions}
    # Y is the declared output; c, written whole by the copy before anything read it and no
    # declared output, is scratch (issue 47's rule), as is tmp (freed inside).
    assert roles == {X: "in", W: "in", Y: "out"}
    assert sorted((s.address, s.size) for s in m.scratch_regions) == sorted([(C, SIZE), (T, SIZE)])
    pre = {r.address: b for r, (b, _) in zip(m.regions, snap.regions_data(), strict=True)}
    post = {r.address: b for r, (_, b) in zip(m.regions, snap.regions_data(), strict=True)}
    # pre-state: each byte as it was when the range first named it (y before the memset)
    assert pre[Y] == original[Y - SEG:Y - SEG + SIZE]
    assert post[Y] == b"\x22" * SIZE
    k2 = m.ops[3]
    assert [p.kind for p in k2.kernarg.params] == ["pointer", "pointer"]
    assert struct.unpack("<QQ", snap.read_blob(k2.kernarg.blob)) == (T, Y)
    snap.verify()   # every blob the manifest names (a memset's and a copy's: none)
    _, lines = describe_snapshot(snap)
    assert "4 operations: memset ; k1 ; copy ; k2" in "\n".join(lines)
    summary = w.summary()
    read_summary(w.out)   # capture.json is valid
    (r,) = summary["ranges"]
    assert r["status"] == "captured" and r["snapshot"] == "fwd" and r["source"] == "mark"
    assert (r["ops"], r["kernels"], r["memsets"], r["copies"], r["streams"]) == (4, 2, 1, 1, 2)
    assert r["roles"] == {"in": 2, "out": 1, "scratch": 2}
    assert r["region_bytes"] == 3 * SIZE and r["scratch_bytes"] == 2 * SIZE
    assert summary["captured"] == 1 and summary["totals"]["region_bytes"] == 3 * SIZE
    assert m.provenance["process"] and m.provenance["pid"] > 0


def test_without_declared_outputs_a_written_live_region_is_inout(tmp_path):
    w = World(tmp_path)
    _forward(w)
    w.session.close(0)
    snap = Snapshot.open(w.out / "fwd")
    m = snap.manifest
    roles = {r.address: r.role for r in m.regions}
    assert roles[Y] == "inout" and roles[C] == "inout"   # every written live region
    post = {r.address: b for r, (_, b) in zip(m.regions, snap.regions_data(), strict=True)}
    assert post[C] == bytes(w.driver.read(X, SIZE))


def test_pre_state_is_read_before_each_first_naming_operation_only(tmp_path):
    w = World(tmp_path)
    _forward(w)
    # x, w, tmp read at k1; c at the copy (x already held); y at the memset: each once,
    # then every region once more at the end (post-state).
    pre_reads = [a for a, _ in w.driver.reads[:4]]
    assert pre_reads == [Y, X, W, T] and (C, SIZE) in w.driver.reads[4:5]
    assert w.driver.syncs >= 4


@pytest.mark.parametrize("event, reason", [
    (MemoryOp("cuMemcpyHtoDAsync_v2", "htod", Y, 0x1234, 64), "host-to-device copy"),
    (MemoryOp("cuGraphLaunch", "unsupported"), "cuGraphLaunch inside the range"),
    (MemoryOp("cuMemsetD8Async", "memset", SEG + 0x10000, 0, 4, 0, 1),
     "not device memory"),
    (MemoryOp("cuMemsetD32Async", "memset", Y, 0, 2 * 0x1000, 0, 4), "past the end"),
])
def test_operations_a_snapshot_cannot_replay_refuse_the_range(tmp_path, event, reason):
    w = World(tmp_path)
    w.session.range_begin("fwd", THREAD)
    w.launch("k1", [X, Y])
    w.session.memory_op(event)
    w.launch("k2", [Y])
    w.session.range_end(None, THREAD)
    w.session.close(0)
    (r,) = w.summary()["ranges"]
    assert r["status"] == "refused" and reason in r["reason"], r
    assert not (w.out / "fwd").exists()


def test_a_copy_to_the_host_is_left_out_and_counted(tmp_path):
    w = World(tmp_path)
    w.session.range_begin("fwd", THREAD)
    w.launch("k1", [X, Y])
    w.session.memory_op(MemoryOp("cuMemcpyDtoHAsync_v2", "dtoh", 0x1000, Y, 64))
    w.session.range_end(None, THREAD)
    m = Snapshot.open(w.out / "fwd").manifest
    assert len(m.ops) == 1 and m.provenance["left_out"] == {"cuMemcpyDtoHAsync_v2": 1}


def test_a_range_over_the_size_cap_is_refused_with_its_size(tmp_path):
    w = World(tmp_path, max_region_bytes=2 * SIZE)
    w.session.range_begin("fwd", THREAD)
    w.launch("k1", [X, W])
    w.launch("k2", [Y])
    w.session.range_end(None, THREAD)
    (r,) = w.summary()["ranges"]
    assert r["status"] == "refused" and f"{3 * SIZE} bytes" in r["reason"]
    assert "--max-region-bytes" in r["reason"]


def test_a_stream_being_captured_refuses_the_range(tmp_path):
    w = World(tmp_path)
    w.driver.capturing.add(0x51)
    w.session.range_begin("fwd", THREAD)
    w.launch("k1", [X])
    w.session.range_end(None, THREAD)
    assert "CUDA graph" in w.summary()["ranges"][0]["reason"]


def test_a_range_of_memsets_only_is_refused(tmp_path):
    w = World(tmp_path)
    w.session.range_begin("fwd", THREAD)
    w.session.memory_op(MemoryOp("cuMemsetD8Async", "memset", Y, 0, 16, 0, 1))
    w.session.range_end(None, THREAD)
    assert w.summary()["ranges"][0]["reason"] == \
        "the range launched no kernel (1 memsets/copies only)"


def test_nvtx_nesting_nth_occurrence_open_and_unseen_ranges(tmp_path):
    w = World(tmp_path, ranges=["fwd", "bwd", "never"], nth=2)
    s = w.session
    for i in range(2):
        s.range_begin("outer", THREAD)          # a range nobody asked for
        s.range_begin("fwd", THREAD)
        w.launch(f"k{i}", [X, Y])
        s.range_end(None, THREAD)               # NVTX pop: the innermost (fwd)
        w.launch("after", [W])                  # outside fwd: not in it
        s.range_end(None, THREAD)
    s.range_begin("bwd", THREAD)
    s.range_end(None, THREAD)
    s.range_begin("bwd", THREAD)                # the 2nd bwd never ends
    w.launch("k9", [X])
    s.close(3)
    ranges = {r["name"]: r for r in w.summary()["ranges"]}
    m = Snapshot.open(w.out / "fwd").manifest
    assert [o.label for o in m.operations] == ["k1"]   # the 2nd occurrence's launch only
    assert ranges["fwd"]["status"] == "captured"
    assert ranges["bwd"]["reason"] == "the range was still open when the program ended"
    assert ranges["never"]["status"] == "not-seen"
    assert "never opened" in ranges["never"]["reason"]
    assert w.summary()["exit_status"] == 3


def test_a_mark_whose_block_raised_is_refused(tmp_path):
    w = World(tmp_path)
    w.session.range_begin("fwd", THREAD, "mark")
    w.launch("k1", [X])
    w.session.range_end("fwd", THREAD, [], failed=True)
    assert "raised an exception" in w.summary()["ranges"][0]["reason"]


def test_merge_extents_and_allocated():
    assert merge_extents([(10, 20, "b"), (0, 12, "a"), (20, 30, "c")]) == \
        [(0, 20, "b"), (20, 30, "c")]   # overlap merged (first named wins), touching kept
    table = BlockTable([Block(0, 10, 0, 40, "torch-block", "active_allocated"),
                        Block(10, 10, 0, 40, "torch-block", "inactive")])
    assert allocated(table, 0, 10) and not allocated(table, 10, 20)
    assert allocated(table, 100, 110)        # memory the allocator does not know
    assert allocated(BlockTable(), 10, 20)


# ---------------------------------------------------------------- kpair.mark


class Listener:
    def __init__(self):
        self.events = []

    def range_begin(self, name, thread):
        self.events.append(("begin", name))

    def range_end(self, name, thread, outputs, *, failed=False):
        self.events.append(("end", name, outputs, failed))

    def quiet_nvtx(self, on):
        self.events.append(("quiet", on))


class Tensor:
    def __init__(self, ptr, nbytes):
        self._ptr, self.nbytes = ptr, nbytes

    def data_ptr(self):
        return self._ptr


def test_mark_tells_the_listener_with_its_outputs(monkeypatch):
    listener = Listener()
    monkeypatch.setattr(marks, "_listener", listener)
    with kpair.mark("fwd", outputs=[Tensor(0x1000, 64)]) as m:
        m.outputs(Tensor(0x2000, 8))
    assert [e for e in listener.events if e[0] != "quiet"] == [
        ("begin", "fwd"), ("end", "fwd", [(0x1000, 64), (0x2000, 8)], False)]
    with pytest.raises(RuntimeError), kpair.mark("bad"):
        raise RuntimeError("boom")
    assert listener.events[-1] == ("end", "bad", [], True)


def test_mark_without_a_tracer_does_nothing(monkeypatch):
    monkeypatch.setattr(marks, "_listener", None)
    with kpair.mark("fwd") as m:
        m.outputs(object())   # not even checked: nobody listens
    with pytest.raises(ValueError):
        kpair.mark("")


def test_mark_refuses_outputs_that_are_not_tensors(monkeypatch):
    monkeypatch.setattr(marks, "_listener", Listener())
    with pytest.raises(TypeError, match="must be tensors"), kpair.mark("fwd", outputs=[3]):
        pass


# ---------------------------------------------------------------- the tracer's decoding


class Recorder:
    def __init__(self):
        self.events = []

    def range_begin(self, name, thread, source="nvtx"):
        self.events.append(("begin", name, source))

    def range_end(self, name, thread, outputs=(), *, failed=False):
        self.events.append(("end", name))

    def memory_op(self, op):
        self.events.append(op)


def _tracer(session):
    from kpair.capture.tracer import Tracer

    t = Tracer.__new__(Tracer)   # no libcuda/libcupti here: only the decoding is exercised
    t.session, t._tls, t.errors = session, threading.local(), []
    return t


def _callback(params) -> cupti.CallbackData:
    data = cupti.CallbackData()
    data.callbackSite = cupti.API_ENTER
    data.functionParams = ctypes.addressof(params)
    return data


def test_tracer_decodes_memsets_and_copies_from_their_param_structs():
    rec = Recorder()
    t = _tracer(rec)
    # cuMemsetD8Async: the byte value sits in a 8-byte slot whose padding is garbage
    memset = cupti.DataParams(0x7F00, 0xDEADBE00 | 0x7, 100, 0x99)
    t._on_data(216, _callback(memset))
    copy = cupti.DataParams(0x7F00, 0x8F00, 4096, 0x98)
    t._on_data(281, _callback(copy))
    t._on_data(280, _callback(cupti.DataParams(1, 2, 3, 0x1234)))   # sync: no stream
    t._on_data(514, _callback(copy))
    a, b, c, d = rec.events
    assert (a.kind, a.dst, a.size, a.value, a.element_size, a.stream) == \
        ("memset", 0x7F00, 100, 7, 1, 0x99)
    assert (b.kind, b.dst, b.src, b.size, b.stream) == ("copy", 0x7F00, 0x8F00, 4096, 0x98)
    assert c.stream == 0 and (d.kind, d.api) == ("unsupported", "cuGraphLaunch")
    word = cupti.DataParams(0x7F00, 0xFFFF0000ABCD, 8, 0)
    t._on_data(430, _callback(word))   # cuMemsetD32Async_ptsz
    assert (rec.events[-1].value, rec.events[-1].size) == (0xABCD, 32)


def test_tracer_reads_nvtx_push_names_and_ignores_a_marks_own_push():
    rec = Recorder()
    t = _tracer(rec)
    message = ctypes.create_string_buffer(b"forward")
    params = ctypes.c_void_p(ctypes.addressof(message))
    data = cupti.NvtxData(b"nvtxRangePushA", ctypes.addressof(params), None)
    t._on_nvtx(cupti.NVTX_PUSH_A, ctypes.addressof(data))
    attrs = cupti.NvtxEventAttributes(messageType=cupti.NVTX_MESSAGE_ASCII,
                                      message=ctypes.addressof(message))
    ex = ctypes.c_void_p(ctypes.addressof(attrs))
    data_ex = cupti.NvtxData(b"nvtxRangePushEx", ctypes.addressof(ex), None)
    t._on_nvtx(cupti.NVTX_PUSH_EX, ctypes.addressof(data_ex))
    pop = cupti.NvtxData(b"nvtxRangePop", None, None)
    t._on_nvtx(cupti.NVTX_POP, ctypes.addressof(pop))
    t.quiet_nvtx(True)
    t._on_nvtx(cupti.NVTX_PUSH_A, ctypes.addressof(data))
    t.quiet_nvtx(False)
    assert rec.events == [("begin", "forward", "nvtx"), ("begin", "forward", "nvtx"),
                          ("end", None)]


# ---------------------------------------------------------------- replay steps


class Memory:
    """A device of one bytearray at address 0, for ProgramDevice's memset/copy steps."""

    def __init__(self, size):
        self.buf = bytearray(size)
        self.launched = []

    def fill(self, address, size, word):
        from kpair.backends.base import fill_bytes

        self.buf[address:address + size] = fill_bytes(word, size)

    def read(self, address, size):
        return bytes(self.buf[address:address + size])

    def write(self, address, data):
        self.buf[address:address + len(data)] = data

    def synchronize(self):
        pass

    def launch(self, kernel, launch, kernarg, params):
        self.launched.append(kernel)


@pytest.mark.parametrize("element, value, expect", [
    (1, 0xAB, b"\xab" * 6), (2, 0x1234, b"\x34\x12" * 3), (4, 0x01020304, b"\x04\x03\x02\x01")])
def test_memset_and_copy_steps_run_in_order(element, value, expect):
    inner = Memory(64)
    inner.buf[32:40] = b"12345678"
    kernel = SimpleNamespace(name="k")
    size = len(expect)
    program = Program("p", [MemsetStep(8, size, value, element),
                            Step(kernel, None, b"", ()), CopyStep(48, 32, 8)], [])
    ProgramDevice(inner).launch(program, None, b"", ())
    assert inner.buf[8:8 + size] == expect and inner.buf[8 + size] == 0
    assert inner.buf[48:56] == b"12345678" and inner.launched == [kernel]
    assert program.kernels == [kernel]


# ---------------------------------------------------------------- the GPU driver, on a CPU

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "range_capture_gpu.py"


def _bench(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}   # no device, even on a GPU machine
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True,
                          text=True, timeout=300, env=env)


def test_range_capture_gpu_driver_parses_and_refuses_cleanly_without_cuda(tmp_path):
    assert _bench("--help").returncode == 0
    bad = _bench("--out", str(tmp_path / "o"), "--runs", "0")
    assert bad.returncode == 2 and "--runs must be 1 to 1000" in bad.stderr
    proc = _bench("--out", str(tmp_path / "o"))
    assert proc.returncode == 4, proc.stderr
    (line,) = proc.stderr.strip().splitlines()    # one line, no traceback
    assert line.startswith("range_capture_gpu: ") and proc.stdout == ""
    assert not (tmp_path / "o").exists()


def test_range_does_not_combine_with_single_dispatch_filters(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kpair", "capture", "-o", str(tmp_path / "o"),
                           "--range", "fwd", "--kernel", "softmax", "--", sys.executable, "-c",
                           "pass"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "--range captures whole ranges" in line and not (tmp_path / "o").exists()
    from kpair.capture.workflow import capture_program
    from kpair.errors import UsageError

    with pytest.raises(UsageError, match="non-empty range name"):
        capture_program([sys.executable, "-c", "pass"], tmp_path / "o", ranges=[""])
    with pytest.raises(UsageError, match="does not combine"):
        capture_program([sys.executable, "-c", "pass"], tmp_path / "o", ranges=["a"], top=2)


# ---------------------------------------------------------------- memset/copy replay (host)


def _with_data_ops(src: Path, dst: Path, order: str = "right") -> None:
    """``src`` (a recorded host range: kp_bias(c, bias), kp_relu(d)) rewritten as a
    captured range would hold it: memset c to 1.0f, kp_bias, copy c -> d, kp_relu(d); the
    post-states computed here in numpy. ``order="swapped"``: the copy before the memset (the
    stored post-states stay those of the right order)."""
    from kpair.snapshot import Op, SnapshotWriter

    snap = Snapshot.open(src)
    m = snap.manifest
    regions = {r.name: r for r in m.regions}
    c, d = regions["c"], regions["d"]
    n = int(np.sqrt(c.size // 4))
    b = np.frombuffer(snap.pre(list(regions).index("bias")), np.float32)
    want_c = (np.ones((n, n), np.float32) + b[None, :]).astype(np.float32)
    want = {"c": want_c.tobytes(), "d": np.maximum(want_c, 0).tobytes()}
    w = SnapshotWriter(dst)
    ops = []
    for op in m.ops:
        ops.append(Op(CodeObject(w.put(snap.read_blob(op.code.blob)), op.code.format,
                                 op.code.kernel_name), op.launch,
                      Kernarg(w.put(snap.read_blob(op.kernarg.blob)), op.kernarg.params)))
    memset = Op(kind="memset", dst=c.address, size=c.size, value=0x3F800000, element_size=4)
    copy = Op(kind="copy", dst=d.address, src=c.address, size=c.size)
    seq = [memset, ops[0], copy, ops[1]] if order == "right" else \
        [copy, memset, ops[0], ops[1]]
    new_regions = []
    for i, r in enumerate(m.regions):
        pre = snap.pre(i)
        post = want.get(r.name, pre)
        role = "in" if post == pre else "inout"
        new_regions.append(Region(r.name, r.address, r.size, w.put(pre), w.put(post),
                                  r.dtype, role))
    first = ops[0]
    w.finish(Manifest(backend=m.backend, arch=m.arch, code=first.code, launch=first.launch,
                      kernarg=first.kernarg, regions=tuple(new_regions),
                      environment=m.environment, provenance={"range": "data_ops"},
                      ops=tuple(seq), scratch=()))


@pytest.fixture(scope="module")
def data_range(tmp_path_factory) -> Path:
    from conftest import CSRC
    from kpair.record import Recorder
    from kpair.toolchain import compile_shared

    root = tmp_path_factory.mktemp("data_ops")
    lib = compile_shared(CSRC / "range_ops.c", root / "ops.so", flags=("-O2", "-g"))
    n = 64
    rng = np.random.default_rng(3)
    c = rng.standard_normal((n, n), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32) * 2
    d = np.abs(rng.standard_normal((n, n), dtype=np.float32)) + 1   # relu leaves it alone
    with Recorder(root / "rec", names={"c": c, "bias": bias, "d": d}) as r:
        r.call(lib, "kp_bias", [c, bias, np.int32(n)])
        r.call(lib, "kp_relu", [d, np.int32(n)])
    return root


def test_a_range_with_a_memset_and_a_copy_replays_byte_exact_on_the_host(data_range):
    from kpair.backends import open_device
    from kpair.replay import reproduce

    _with_data_ops(data_range / "rec", data_range / "right")
    snap = Snapshot.open(data_range / "right")
    assert [o.label for o in snap.manifest.ops] == ["memset", "kp_bias", "copy", "kp_relu"]
    with open_device("host") as dev:
        got = reproduce(dev, snap, runs=2)
    assert got.status == "byte-exact" and got.ops == 4, got


def test_memset_and_copy_in_the_wrong_order_do_not_reproduce(data_range):
    from kpair.backends import open_device
    from kpair.replay import reproduce

    _with_data_ops(data_range / "rec", data_range / "swapped", order="swapped")
    with open_device("host") as dev:
        got = reproduce(dev, Snapshot.open(data_range / "swapped"), runs=1)
    assert got.status == "mismatch" and got.differing_regions == ["d"], got


# ---------------------------------------------------------------- ids and structs vs headers


def _header(name: str) -> str:
    import glob

    for path in sorted(glob.glob(f"/usr/local/cuda*/include/{name}"), reverse=True) + \
            sorted(glob.glob(f"/usr/local/cuda*/extras/CUPTI/include/{name}"), reverse=True):
        return Path(path).read_text(errors="replace")
    pytest.skip(f"{name} (CUDA toolkit headers) not installed here")


def test_callback_ids_and_param_structs_match_the_cuda_headers():
    import re

    ids = dict(re.findall(r"CUPTI_DRIVER_TRACE_CBID_(\w+)\s*=\s*(\d+)",
                          _header("cupti_driver_cbid.h")))
    table = {**{c: v[0] for c, v in cupti.DATA_CBIDS.items()},
             **{c: v.split(" ")[0] for c, v in cupti.UNSUPPORTED_CBIDS.items()},
             **cupti.LAUNCH_CBIDS}
    for cbid, api in table.items():
        assert int(ids[api]) == cbid, api
    meta = _header("generated_cuda_meta.h")
    for api, kind, element, has_stream in cupti.DATA_CBIDS.values():
        body = re.search(rf"typedef struct {api}_params_st \{{(.*?)\}}", meta, re.S).group(1)
        types = [line.strip().rsplit(" ", 1)[0] for line in body.strip().splitlines()]
        assert types[0] == "CUdeviceptr", api          # 64-bit, at offset 0
        assert types[1] == {1: "unsigned char", 2: "unsigned short", 4: "unsigned int"}[
            element] if kind == "memset" else types[1] in ("CUdeviceptr", "const void"), api
        assert types[2] == "size_t" and (types[3:] == ["CUstream"]) == has_stream, api
    nvtx = dict(re.findall(r"CUPTI_CBID_NVTX_(\w+)\s*=\s*(\d+)", _header("cupti_nvtx_cbid.h")))
    for cbid, api in cupti.NVTX_CBIDS.items():
        assert int(nvtx[api]) == cbid, api


def test_tracer_routes_cupti_callbacks_and_marks_to_a_range_session(monkeypatch):
    rec = Recorder()
    t = _tracer(rec)
    message = ctypes.create_string_buffer(b"fwd")
    params = ctypes.c_void_p(ctypes.addressof(message))
    nvtx = cupti.NvtxData(b"nvtxRangePushA", ctypes.addressof(params), None)
    t._on_callback(None, cupti.DOMAIN_NVTX, cupti.NVTX_PUSH_A, ctypes.addressof(nvtx))
    memset = cupti.DataParams(0x7F00, 0xFF, 16, 0)
    data = _callback(memset)
    t._on_callback(None, cupti.DOMAIN_DRIVER_API, 249, ctypes.addressof(data))
    data.callbackSite = cupti.API_EXIT   # an exit says nothing new
    t._on_callback(None, cupti.DOMAIN_DRIVER_API, 249, ctypes.addressof(data))
    monkeypatch.setattr(marks, "_listener", t)
    with kpair.mark("m", outputs=[Tensor(0x5000, 4)]):
        pass
    assert rec.events[0] == ("begin", "fwd", "nvtx")
    assert (rec.events[1].api, rec.events[1].value, rec.events[1].size) == \
        ("cuMemsetD8_v2", 0xFF, 16)
    assert rec.events[2:] == [("begin", "m", "mark"), ("end", "m")] and not t.errors
    t.session = SimpleNamespace()   # a single-dispatch session: ranges are not its business
    with kpair.mark("m"):
        t._on_callback(None, cupti.DOMAIN_NVTX, cupti.NVTX_PUSH_A, ctypes.addressof(nvtx))
    assert len(rec.events) == 4 and not t.errors


# ---------------------------------------------------------------- issue 47, first GPU run


def _second_pass(w: World, name: str, outputs=(), *, temp: int = T, out: int = Y,
                 zero: int | None = None) -> None:
    """The same forward a second time, as PyTorch runs it after a warm-up pass: the caching
    allocator hands out again the blocks the warm-up freed (``temp``, ``out``), which still
    hold what the warm-up wrote there, so every kernel writes the bytes already in place.
    k1(x, w, temp); k2(temp, out); ``zero``: a memset of a block already zero (Inductor
    zeroing a buffer before an atomic reduction); temp freed inside the range."""
    s = w.session
    w.states[temp] = w.states[out] = "inactive"       # freed after the warm-up
    if zero is not None:
        w.driver.poke(zero, bytes(SIZE))
    s.range_begin(name, THREAD, "mark")
    w.states[temp] = w.states[out] = "active_allocated"   # handed out again
    if zero is not None:
        s.memory_op(MemoryOp("cuMemsetD32Async", "memset", zero, 0, SIZE, 0, 4, 0x51))
    w.launch("k1", [X, W, temp])
    w.launch("k2", [temp, out])
    w.states[temp] = "inactive"
    s.range_end(name, THREAD, list(outputs))


def test_a_second_pass_writing_what_the_warm_up_left_still_writes_its_blocks(tmp_path):
    # The H100 run's MLP and softmax: every region came out "in" (pre-state == post-state).
    w = World(tmp_path)
    before = bytes(w.driver.mem[SEG])
    _second_pass(w, "fwd", outputs=[(Y + 0x10, 0xC0)])   # the tensor inside its block
    assert bytes(w.driver.mem[SEG]) == before             # no byte changed
    w.session.close(0)
    snap = Snapshot.open(w.out / "fwd")
    m = snap.manifest
    assert {r.address: r.role for r in m.regions} == {X: "in", W: "in", Y: "out"}
    assert [(s.address, s.size) for s in m.scratch_regions] == [(T, SIZE)]
    (o,) = m.output_spans   # the declared tensor's bytes, not the allocator block
    assert (m.region(o.region).address, o.offset, o.size) == (Y, 0x10, 0xC0)
    assert json.loads((w.out / "fwd" / "snapshot.json").read_text())["outputs"] == [
        {"region": o.region, "offset": 0x10, "size": 0xC0}]
    snap.verify()
    (r,) = w.summary()["ranges"]
    assert r["roles"] == {"in": 2, "out": 1, "scratch": 1}


def test_without_declared_outputs_a_block_handed_out_inside_the_range_is_inout(tmp_path):
    w = World(tmp_path)
    _second_pass(w, "fwd")
    m = Snapshot.open(w.out / "fwd").manifest
    assert {r.address: r.role for r in m.regions} == {X: "in", W: "in", Y: "inout"}
    assert m.output_spans == () and "outputs" not in json.loads(
        (w.out / "fwd" / "snapshot.json").read_text())


def test_a_memset_writing_zeros_over_zeros_still_writes(tmp_path):
    w = World(tmp_path)
    _second_pass(w, "fwd", outputs=[(Y, SIZE)], zero=C)
    m = Snapshot.open(w.out / "fwd").manifest
    # c: memset first, no declared output -> scratch, never a live-in region
    assert {r.address: r.role for r in m.regions} == {X: "in", W: "in", Y: "out"}
    assert sorted(s.address for s in m.scratch_regions) == sorted([C, T])


def test_a_declared_output_whose_bytes_did_not_change_is_out(tmp_path):
    w = World(tmp_path)   # every block live before the range: nothing is fresh
    s = w.session
    s.range_begin("fwd", THREAD, "mark")
    w.launch("k1", [X, Y])            # writes into y what y already holds
    s.range_end("fwd", THREAD, [(Y, SIZE)])
    m = Snapshot.open(w.out / "fwd").manifest
    assert {r.address: r.role for r in m.regions} == {X: "in", Y: "out"}
    assert [(o.offset, o.size) for o in m.output_spans] == [(0, SIZE)]


def test_an_eager_and_a_compiled_pass_name_the_same_inputs(tmp_path):
    # The H100 run's KernelBench pairs: the compiled range "read" a weight-sized and a
    # bias-sized buffer SNAP had no region for ("op1.arg1: no counterpart"). They are the
    # compiled forward's own buffers, made inside its range and holding its warm-up's bytes:
    # written (scratch), so every live-in region of the compiled range is one of eager's.
    from kpair.bind import bind_capture

    w = World(tmp_path, ranges=["eager", "compiled"])
    Z, B = SEG + 0x200, SEG + 0x600           # the compiled forward's own output, buffer
    w.states[Z] = w.states[B] = "active_allocated"
    _second_pass(w, "eager", outputs=[(Y, SIZE)])
    _second_pass(w, "compiled", outputs=[(Z, SIZE)], out=Z, temp=B, zero=T)
    w.session.close(0)
    eager, compiled = (Snapshot.open(w.out / n) for n in ("eager", "compiled"))
    me, mc = eager.manifest, compiled.manifest
    inputs = [r for r in mc.regions if r.role == "in"]
    assert {r.address for r in inputs} == {X, W}
    assert all(any(e.address <= r.address and r.end <= e.end and e.role == "in"
                   for e in me.regions) for r in inputs)
    assert sorted(s.address for s in mc.scratch_regions) == sorted([B, T])
    assert [mc.region(o.region).address for o in mc.output_spans] == [Z]
    bound = {b.region: (b.to, b.why) for b in bind_capture(eager, compiled).bindings}
    names = {r.address: r.name for r in (*mc.regions, *mc.scratch_regions)}
    assert bound[names[Z]] == ("region", "declared output")
    assert {bound[names[a]][0] for a in (X, W)} == {"region"}
    assert {bound[names[a]][0] for a in (B, T)} == {"scratch"}


def test_outputs_must_lie_in_an_out_region():
    from kpair.snapshot import BlobRef, LaunchAttribute, OutputSpan  # noqa: F401
    from kpair.snapshot.model import Invalid

    blob = BlobRef("blobs/" + "0" * 64 + ".zst", SIZE, "0" * 64)
    code = CodeObject(BlobRef("blobs/" + "1" * 64 + ".zst", 8, "1" * 64), "cubin", "k")
    kernarg = Kernarg(BlobRef("blobs/" + "2" * 64 + ".zst", 8, "2" * 64), ())
    from kpair.snapshot import Launch, Op

    op = Op(code, Launch(), kernarg)

    def manifest(role, span):
        return Manifest(backend="cuda", arch="sm_90", code=code, launch=Launch(),
                        kernarg=kernarg, ops=(op,), scratch=(),
                        regions=(Region("y", Y, SIZE, blob, blob, role=role),),
                        outputs=(OutputSpan(*span),))

    assert manifest("out", ("y", 0x10, SIZE - 0x10)).output_spans[0].offset == 0x10
    with pytest.raises(Invalid, match="reach past the end"):
        manifest("out", ("y", 0x10, SIZE))
    with pytest.raises(Invalid, match="role is 'in'"):
        manifest("in", ("y", 0, 8))
    with pytest.raises(Invalid, match="no region"):
        manifest("out", ("z", 0, 8))


def test_range_capture_gpu_shows_every_region_and_who_names_it(tmp_path):
    w = World(tmp_path)
    _second_pass(w, "fwd", outputs=[(Y + 0x10, 0xC0)], zero=C)
    proc = _bench("--show", str(w.out / "fwd"))
    assert proc.returncode == 0, proc.stderr
    rows = {int(r["address"], 16): r for r in json.loads(proc.stdout)[str(w.out / "fwd")]}
    assert {a: r["role"] for a, r in rows.items()} == {
        X: "in", W: "in", Y: "out", T: "scratch", C: "scratch"}
    assert rows[C]["named_by"] == ["op0.dst"] and rows[X]["named_by"] == ["op1.arg0"]
    assert rows[T]["named_by"] == ["op1.arg2", "op2.arg0"]
    assert rows[Y]["outputs"] == [[0x10, 0xC0]] and rows[Y]["size"] == SIZE
    assert rows[Y]["written"] == ["allocated inside", "declared output"]
    assert rows[C]["written"] == ["memset/copy"] and "written" not in rows[X]


def test_a_library_kernels_struct_parameter_names_every_pointer_in_it(tmp_path):
    # cuBLAS/cuDNN kernels take one parameter block by value: every 8-byte word in it that
    # points into an allocator block (at its start or inside it) names that block.
    w = World(tmp_path)
    blob = struct.pack("<iiQQQdQ", 3, 4, X, 0x1234, W + 0x40, 1.5, Y + 0x20)
    values = ctypes.create_string_buffer(blob, len(blob))
    array = (ctypes.c_void_p * 1)(ctypes.addressof(values))
    w.keep.append((values, array))
    info = LaunchInfo("cuLaunchKernelEx", 0x77, (1, 1, 1), (64, 1, 1), 0, 0x51,
                      ctypes.addressof(array), 0)
    s = w.session
    s.range_begin("fwd", THREAD, "mark")
    s.launch_enter(info, KernelInfo(0x77, "gemm", "gemm", [(0, len(blob))], "test"), 1)
    s.launch_exit(1, 0)
    w.driver.poke(Y, b"\x33" * SIZE)
    s.range_end("fwd", THREAD, [(Y + 0x20, 0x40)])
    m = Snapshot.open(w.out / "fwd").manifest
    assert {(r.name, r.address, r.role) for r in m.regions} == {
        ("op0.arg0.w8", X, "in"), ("op0.arg0.w24", W, "in"), ("op0.arg0.w40", Y, "out")}
    assert [(o.offset, o.size) for o in m.output_spans] == [(0x20, 0x40)]


# ---------------------------------------------------------------- dead bytes of a region


def test_memory_reused_inside_the_range_leaves_dead_bytes_zeroed(tmp_path):
    """An intermediate freed inside the range whose memory an output then reuses in part: the
    two extents merge into one region, and the bytes the allocator holds free at the end
    (the intermediate's, outside the declared output) are dead: listed, zeroed in the
    stored post-state, never judged. The output's own bytes are kept."""
    w = World(tmp_path)
    s, d = w.session, w.driver
    table = [Block(X, SIZE, SEG, 0x1000, "torch-block", "active_allocated"),
             Block(0x7F0000000800, 0x400, SEG, 0x1000, "torch-block", "inactive")]
    s.blocks = lambda: BlockTable(list(table))
    s.range_begin("fwd", THREAD, "mark")
    table[1:] = [Block(T, SIZE, SEG, 0x1000, "torch-block", "active_allocated"),   # tmp
                 Block(T + SIZE, 0x300, SEG, 0x1000, "torch-block", "inactive")]
    w.launch("k1", [X, T])
    d.poke(T, b"\x11" * SIZE)
    out = T + 0x80   # tmp freed; the output handed out over its second half and beyond
    table[1:] = [Block(T, 0x80, SEG, 0x1000, "torch-block", "inactive"),
                 Block(out, SIZE, SEG, 0x1000, "torch-block", "active_allocated"),
                 Block(out + SIZE, 0x280, SEG, 0x1000, "torch-block", "inactive")]
    w.launch("k2", [X, out])
    d.poke(out, b"\x22" * SIZE)
    s.range_end("fwd", THREAD, [(out, SIZE)])
    s.close(0)
    snap = Snapshot.open(w.out / "fwd")
    m = snap.manifest
    region = next(r for r in m.regions if r.address == T)
    assert (region.size, region.role) == (SIZE + 0x80, "out")
    assert [(dd.region, dd.offset, dd.size) for dd in m.dead_spans] == [(region.name, 0, 0x80)]
    assert [(o.offset, o.size) for o in m.output_spans] == [(0x80, SIZE)]
    post = dict(zip([r.name for r in m.regions], [b for _, b in snap.regions_data()],
                    strict=True))[region.name]
    assert post == bytes(0x80) + b"\x22" * SIZE   # dead bytes zeroed, the output kept
    again = Manifest.from_json(m.to_json())
    assert again.dead_spans == m.dead_spans
    doc = json.loads(json.dumps(m.to_json()))
    doc["dead"] = [{"region": region.name, "offset": 0x70, "size": 0x20}]   # into the output
    with pytest.raises(Exception, match="dead and a declared output"):
        Manifest.from_json(doc)


class TimedMemory(Memory):
    def timed_launch(self, kernel, launch, kernarg, params):
        self.launch(kernel, launch, kernarg, params)
        return 1e-6


def test_a_program_zeroes_its_dead_spans_after_every_execution():
    inner = TimedMemory(64)
    kernel = SimpleNamespace(name="k")
    program = Program("p", [MemsetStep(0, 64, 0x5A, 1), Step(kernel, None, b"", ())], [],
                      dead=[(8, 8), (40, 3)])
    dev = ProgramDevice(inner)
    want = b"\x5a" * 8 + bytes(8) + b"\x5a" * 24 + bytes(3) + b"\x5a" * 21
    dev.launch(program, None, b"", ())
    assert bytes(inner.buf) == want
    inner.buf[:] = b"\x01" * 64
    dev.timed_launch(program, None, b"", ())
    assert bytes(inner.buf) == want
