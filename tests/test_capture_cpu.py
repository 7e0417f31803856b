"""Capture without a GPU: struct layouts, launch decoding, region narrowing, the session end
to end on a fake driver, filters, names, code-object lookup, CUPTI location, the CLI."""

from __future__ import annotations

import ctypes
import json
import struct
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from kpair.capture import cupti
from kpair.capture.blobpool import BlobPool
from kpair.capture.child import child_command, status_of
from kpair.capture.filters import Filter
from kpair.capture.launches import KernargError, LaunchInfo, decode_launch, kernarg_bytes
from kpair.capture.modules import ModuleRegistry, elf_function_names
from kpair.capture.names import demangle, short_name
from kpair.capture.program import run_program
from kpair.capture.regions import (
    Block,
    BlockTable,
    allocator_blocks,
    plan_regions,
    pointer_words,
    segment_bytes,
)
from kpair.capture.session import CaptureSession, KernelInfo
from kpair.cli import main
from kpair.cli.capture import parse_size
from kpair.errors import BackendUnavailable, UsageError
from kpair.snapshot import Snapshot

DATA = Path(__file__).parent / "data"
CUBIN = (DATA / "kp_add_sm90.cubin").read_bytes()
FATBIN = (DATA / "kp_add_sm90.fatbin").read_bytes()
SEG = 0x7F00_0000_0000
MIB = 1 << 20


# ---------------------------------------------------------------- C layouts

def offsets(struct_type) -> dict[str, int]:
    return {name: getattr(struct_type, name).offset for name, *_ in struct_type._fields_}


def test_struct_layouts_match_the_cuda_13_headers():
    # Offsets printed by offsetof() against cupti_callbacks.h / generated_cuda_meta.h / cuda.h.
    assert offsets(cupti.CallbackData) == {
        "callbackSite": 0, "functionName": 8, "functionParams": 16, "functionReturnValue": 24,
        "symbolName": 32, "context": 40, "contextUid": 48, "correlationData": 56,
        "correlationId": 64}
    assert ctypes.sizeof(cupti.CallbackData) == 72
    assert offsets(cupti.ResourceData) == {"context": 0, "resourceHandle": 8,
                                           "resourceDescriptor": 16}
    assert offsets(cupti.ModuleResourceData) == {"moduleId": 0, "cubinSize": 8, "pCubin": 16}
    k = offsets(cupti.LaunchKernelParams)
    assert (k["f"], k["gridDimX"], k["blockDimZ"], k["sharedMemBytes"], k["hStream"],
            k["kernelParams"], k["extra"]) == (0, 8, 28, 32, 40, 48, 56)
    assert offsets(cupti.LaunchCooperativeParams)["kernelParams"] == 48
    assert offsets(cupti.LaunchKernelExParams) == {"config": 0, "f": 8, "kernelParams": 16,
                                                   "extra": 24}
    c = offsets(cupti.LaunchConfig)
    assert (c["sharedMemBytes"], c["hStream"], c["attrs"], c["numAttrs"]) == (24, 32, 40, 48)
    assert ctypes.sizeof(cupti.LaunchConfig) == 56
    assert offsets(cupti.LaunchAttributeEntry)["value"] == 8
    assert ctypes.sizeof(cupti.LaunchAttributeEntry) == 72


# ---------------------------------------------------------------- launches and kernargs

class HostArgs:
    """Kernel arguments in host memory, as a launch API receives them."""

    def __init__(self, *values: tuple[str, object]):
        self.cells = [getattr(ctypes, t)(v) for t, v in values]
        self.array = (ctypes.c_void_p * len(self.cells))(
            *[ctypes.addressof(c) for c in self.cells])
        self.layout, off = [], 0
        for c in self.cells:
            size = ctypes.sizeof(c)
            off = -(-off // size) * size
            self.layout.append((off, size))
            off += size

    @property
    def address(self) -> int:
        return ctypes.addressof(self.array)


def test_decode_cuLaunchKernel_and_rebuild_the_kernarg():
    args = HostArgs(("c_uint64", SEG), ("c_uint64", SEG + 4096), ("c_int32", 77))
    p = cupti.LaunchKernelParams(0xF00, 4, 2, 1, 128, 1, 1, 512, 0x5, args.address, None)
    launch = decode_launch(307, ctypes.addressof(p))
    assert (launch.api, launch.function, launch.grid, launch.block) == \
        ("cuLaunchKernel", 0xF00, (4, 2, 1), (128, 1, 1))
    assert (launch.dynamic_shared_bytes, launch.stream, launch.attributes) == (512, 5, ())
    blob, layout, how = kernarg_bytes(launch, args.layout)
    assert blob == struct.pack("<QQi", SEG, SEG + 4096, 77) and how == "kernelParams"
    assert layout == [(0, 8), (8, 8), (16, 4)]
    with pytest.raises(KernargError, match="layout is unknown"):
        kernarg_bytes(launch, None)


def test_decode_cuLaunchKernelEx_with_attributes_and_an_extra_buffer():
    buf = (ctypes.c_char * 16).from_buffer_copy(struct.pack("<Qi4x", SEG, 9))
    size = ctypes.c_size_t(16)
    extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(buf), 2, ctypes.addressof(size), 0)
    entries = (cupti.LaunchAttributeEntry * 3)()
    entries[0].id = 4
    struct.pack_into("<3I", entries[0].value, 0, 2, 1, 1)
    entries[1].id = 0            # IGNORE: skipped
    entries[2].id = 6
    entries[2].value[0] = 1
    config = cupti.LaunchConfig(8, 1, 1, 256, 1, 1, 0, 0x77, ctypes.addressof(entries), 3)
    p = cupti.LaunchKernelExParams(ctypes.addressof(config), 0xABC, None,
                                   ctypes.addressof(extra))
    launch = decode_launch(653, ctypes.addressof(p))
    assert launch.api == "cuLaunchKernelEx_ptsz" and launch.grid == (8, 1, 1)
    assert [(a.id, a.name) for a in launch.attributes] == \
        [(4, "CLUSTER_DIMENSION"), (6, "PROGRAMMATIC_STREAM_SERIALIZATION")]
    assert launch.attributes[0].value == struct.pack("<3I", 2, 1, 1).ljust(64, b"\0")
    blob, layout, how = kernarg_bytes(launch, [(0, 8), (8, 4)])
    assert blob == bytes(buf) and layout == [(0, 8), (8, 4)] and how == "extra buffer"
    blob, layout, how = kernarg_bytes(launch, None)
    assert layout == [(0, 16)] and how.endswith("(opaque)")


def test_cooperative_launches_record_the_cooperative_attribute():
    args = HostArgs(("c_uint64", SEG))
    p = cupti.LaunchCooperativeParams(0x1, 2, 1, 1, 32, 1, 1, 0, 0, args.address)
    launch = decode_launch(477, ctypes.addressof(p))
    assert [(a.id, a.value[:4]) for a in launch.attributes] == [(2, b"\1\0\0\0")]
    assert launch.extra == 0 and kernarg_bytes(launch, args.layout)[0] == struct.pack("<Q", SEG)


# ---------------------------------------------------------------- regions

def torch_snapshot() -> dict:
    """Two allocator segments as torch.cuda.memory._snapshot() reports them."""
    return {"segments": [
        {"address": SEG, "total_size": 2 * MIB, "blocks": [
            {"address": SEG, "size": 4096, "state": "active_allocated"},
            {"address": SEG + 4096, "size": 8192, "state": "active_allocated"},
            {"address": SEG + 12288, "size": 2 * MIB - 12288, "state": "inactive"}]},
        # an older snapshot format: no block addresses, derived from the sizes
        {"address": SEG + 64 * MIB, "total_size": 20 * MIB, "blocks": [
            {"size": 1024, "state": "active_allocated"},
            {"size": 20 * MIB - 1024, "state": "active_allocated"}]},
    ]}


def test_allocator_blocks_and_lookup():
    table = BlockTable(allocator_blocks(torch_snapshot()))
    assert [b.start - SEG for b in table.blocks] == [0, 4096, 12288, 64 * MIB, 64 * MIB + 1024]
    b = table.find(SEG + 4096 + 100)
    assert (b.start, b.size, b.segment_size, b.source) == (SEG + 4096, 8192, 2 * MIB,
                                                          "torch-block")
    assert table.find(SEG + 64 * MIB + 1023).size == 1024
    assert table.find(SEG - 1) is None and table.find(SEG + 84 * MIB) is None


def test_pointer_words_stay_inside_one_parameter():
    kernarg = struct.pack("<Qii", SEG, 0x7F00, 0) + struct.pack("<QQ", 5, SEG + 4096)
    words = pointer_words(kernarg, [(0, 8), (8, 4), (12, 4), (16, 16)])
    # the two ints at 8 and 12 are never read as one word; 5 is too small to be an address
    assert [(w.offset, w.param, w.param_offset) for w in words] == [(0, 0, 0), (24, 3, 8)]
    assert [w.offset for w in pointer_words(kernarg, None)] == [0, 24]


def test_plan_regions_narrows_to_blocks_and_falls_back_to_the_driver():
    table = BlockTable(allocator_blocks(torch_snapshot()))
    other = 0x7E00_0000_0000
    kernarg = struct.pack("<QQQQQ", SEG + 16, SEG + 4096, SEG + 5000, other + 8, 0xDEAD0000)

    def driver_range(p):
        return (other, 3 * MIB) if other <= p < other + 3 * MIB else None

    regions = plan_regions(pointer_words(kernarg, [(i * 8, 8) for i in range(5)]), table,
                           driver_range)
    assert [(r.start, r.size, r.source, r.name) for r in regions] == [
        (other, 3 * MIB, "driver-range", "arg3"),
        (SEG, 4096, "torch-block", "arg0"),
        (SEG + 4096, 8192, "torch-block", "arg1")]
    assert [w.offset for w in regions[2].words] == [8, 16]   # two pointers, one block
    # before narrowing: the whole 2 MiB segment plus the driver's range
    assert segment_bytes(regions) == 2 * MIB + 3 * MIB
    assert sum(r.size for r in regions) == 3 * MIB + 12288


def test_overlapping_extents_are_merged():
    blocks = BlockTable([Block(SEG, 100, SEG, 4096, "torch-block")])

    def driver_range(p):
        return (SEG + 50, 200) if SEG + 100 <= p < SEG + 250 else None

    words = pointer_words(struct.pack("<QQ", SEG + 120, SEG + 8), [(0, 8), (8, 8)])
    [r] = plan_regions(words, blocks, driver_range)
    assert (r.start, r.size, r.source, r.name) == (SEG, 250, "merged", "arg0")


# ---------------------------------------------------------------- code objects and names

def test_elf_symbol_index_and_registry():
    assert elf_function_names(CUBIN) == {"kp_add", "_Z8kp_scaleIfEvPT_S0_i"}
    assert elf_function_names(b"not an elf") is None
    reg = ModuleRegistry()
    reg.add(1, b"\x7fELF" + bytes(60))
    reg.add(2, CUBIN)
    assert reg.find("kp_missing") is None
    found = reg.find("_Z8kp_scaleIfEvPT_S0_i")
    assert (found.module_id, found.how) == (2, "symbol name")
    reg.add(3, FATBIN)  # not ELF: searched byte-wise
    reg.bind(0xBEEF, 3)
    found = reg.find("kp_add", (None, 0xBEEF))
    assert (found.module_id, found.how) == (3, "module handle")
    found = reg.find("kp_add")  # the cubin and the fatbin both hold it: differing bytes
    assert found.module_id == 3 and found.how.startswith("symbol name (ambiguous: 2")


def test_demangle_and_short_names():
    assert demangle("_Z8kp_scaleIfEvPT_S0_i") == "void kp_scale<float>(float*, float, int)"
    assert demangle("triton_poi_fused_add_0") == "triton_poi_fused_add_0"
    assert short_name("void at::native::(anonymous namespace)::vectorized_elementwise_kernel"
                      "<4, at::native::AddFunctor<float>>(int, at::native::AddFunctor<float>)"
                      ) == "vectorized_elementwise_kernel"
    assert short_name("triton_poi_fused_add_0") == "triton_poi_fused_add_0"


# ---------------------------------------------------------------- filters

def test_filter_regex_nth_max_distinct():
    f = Filter("softmax", nth=2, max=2)
    picks = [f.consider(n, n) for n in ["softmax_a", "gemm", "softmax_a", "softmax_b",
                                        "softmax_c"]]
    assert picks == [False, False, True, True, False] and f.done and f.matches == 3
    d = Filter(None, max=None, distinct=True)
    assert [d.consider(n, n) for n in "aabac"] == [True, False, True, False, True]
    assert Filter("void kp_scale<float>").consider("_Z8kp", "void kp_scale<float>(float*)")
    with pytest.raises(UsageError, match="regular expression"):
        Filter("(")
    with pytest.raises(UsageError):
        Filter(None, nth=0)


# ---------------------------------------------------------------- the session on a fake driver

class FakeDriver:
    """Device memory as host bytearrays: what CaptureSession needs from CudaDriver."""

    def __init__(self, allocations: dict[int, int]):
        self.memory = {base: bytearray(bytes(range(256)) * (size // 256))
                       for base, size in allocations.items()}

    def _find(self, address: int, size: int = 1) -> tuple[int, bytearray]:
        for base, mem in self.memory.items():
            if base <= address and address + size <= base + len(mem):
                return base, mem
        raise RuntimeError(f"CUDA_ERROR_INVALID_VALUE reading {address:#x}")

    def read(self, address, size):
        base, mem = self._find(address, size)
        return bytearray(mem[address - base:address - base + size])

    def write(self, address, data):
        base, mem = self._find(address, len(data))
        mem[address - base:address - base + len(data)] = data

    def address_range(self, pointer):
        try:
            base, mem = self._find(pointer)
        except RuntimeError:
            return None
        return base, len(mem)

    def synchronize(self):
        return 0

    def error_name(self, code):
        return f"CUDA_ERROR_{code}"

    def stream_capturing(self, stream):
        return False

    def current_device(self):
        return 0

    def device_facts(self, device):
        return {"name": "Fake GPU", "arch": "sm_90", "sm_count": 132}


def make_session(tmp_path, **kw) -> tuple[CaptureSession, FakeDriver]:
    driver = FakeDriver({SEG: 2 * MIB, SEG + 64 * MIB: 20 * MIB})
    reg = ModuleRegistry()
    reg.add(7, CUBIN)
    blocks = BlockTable(allocator_blocks(torch_snapshot()))
    session = CaptureSession(tmp_path / "cap", kw.pop("filter", Filter(None, max=None)),
                             driver=driver, registry=reg, blocks=lambda: blocks,
                             command=["python", "prog.py"], **kw)
    return session, driver


def add_launch(args: HostArgs) -> tuple[LaunchInfo, KernelInfo]:
    p = cupti.LaunchKernelParams(0xF00, 4, 1, 1, 256, 1, 1, 0, 0, args.address, None)
    launch = decode_launch(307, ctypes.addressof(p))
    return launch, KernelInfo(0xF00, "kp_add", "kp_add", args.layout, "cuFuncGetParamInfo")


def test_session_writes_replayable_snapshots_and_a_summary(tmp_path):
    session, driver = make_session(tmp_path)
    args = HostArgs(("c_uint64", SEG), ("c_uint64", SEG + 4096 + 64),
                    ("c_uint64", SEG + 64 * MIB), ("c_int32", 1024))
    launch, kernel = add_launch(args)
    for corr in (1, 2):
        session.launch_enter(launch, kernel, corr)
        driver.write(SEG + 64 * MIB, b"\xAA" * 1024)      # the "kernel" writes c
        session.launch_exit(corr, 0)
    summary = session.close(exit_status=0)

    snap = Snapshot.open(tmp_path / "cap" / "0001_kp_add")
    snap.verify()
    m = snap.manifest
    assert (m.backend, m.arch, m.complete, m.code.kernel_name, m.code.format) == \
        ("cuda", "sm_90", True, "kp_add", "cubin")
    assert snap.code_object() == CUBIN
    assert [(r.name, r.address - SEG, r.size) for r in m.regions] == \
        [("arg0", 0, 4096), ("arg1", 4096, 8192), ("arg2", 64 * MIB, 1024)]
    assert [p.kind for p in m.kernarg.params] == ["pointer", "pointer", "pointer", "bytes"]
    assert snap.post(2) == b"\xAA" * 1024 and snap.pre(2) != snap.post(2)
    assert snap.pre(0) == snap.post(0)
    assert m.provenance["regions"][2]["segment_size"] == 20 * MIB

    d1, d2 = summary["dispatches"]
    assert (d1["status"], d1["region_bytes"], d1["segment_bytes"]) == \
        ("captured", 4096 + 8192 + 1024, 22 * MIB)
    # the second dispatch finds its code object, inputs and output already in the pool
    assert d2["stored_bytes"] < d1["stored_bytes"] and d2["deduped_bytes"] >= len(CUBIN)
    assert summary["captured"] == 2 and summary["launches_seen"] == 2
    assert summary["kernels_seen"] == {"kp_add": 2}
    on_disk = json.loads((tmp_path / "cap" / "capture.json").read_text())
    assert on_disk["exit_status"] == 0 and on_disk["totals"]["region_bytes"] == 2 * 13312
    # one copy on disk: the snapshot's blob is a hard link into the pool
    blob = next((tmp_path / "cap" / "0002_kp_add" / "blobs").iterdir())
    assert blob.stat().st_nlink >= 2


def test_region_cap_marks_the_snapshot_incomplete(tmp_path, capsys):
    session, _ = make_session(tmp_path, max_region_bytes=5000)
    args = HostArgs(("c_uint64", SEG), ("c_uint64", SEG + 4096), ("c_uint64", SEG + 64 * MIB),
                    ("c_int32", 1))
    launch, kernel = add_launch(args)
    session.launch_enter(launch, kernel, 1)
    session.launch_exit(1, 0)
    m = Snapshot.open(tmp_path / "cap" / "0001_kp_add").manifest
    assert m.complete is False and [r.name for r in m.regions] == ["arg0", "arg2"]
    assert "region arg1" in capsys.readouterr().err
    assert m.provenance["omitted_regions"][0]["size"] == 8192


def test_failures_are_recorded_not_raised(tmp_path):
    session, _ = make_session(tmp_path)
    args = HostArgs(("c_uint64", SEG))
    launch, _ = add_launch(args)
    unknown = KernelInfo(0xF01, "not_loaded", "not_loaded", args.layout, "x")
    session.launch_enter(launch, unknown, 1)
    session.launch_exit(1, 0)
    add = KernelInfo(0xF00, "kp_add", "kp_add", args.layout, "x")
    session.launch_enter(launch, add, 2)
    session.launch_exit(2, 719)                # the launch itself failed
    summary = session.close()
    reasons = [d["reason"] for d in summary["dispatches"]]
    assert "no loaded code object holds this kernel" in reasons[0]
    assert "CUDA_ERROR_719" in reasons[1] and summary["captured"] == 0


def test_capture_json_reads_back_as_the_record_it_was_written_from(tmp_path, capsys):
    from kpair.capture.summary import CaptureSummary, read_summary
    from kpair.errors import FormatError

    session, driver = make_session(tmp_path, max_region_bytes=5000)
    args = HostArgs(("c_uint64", SEG), ("c_uint64", SEG + 4096), ("c_uint64", SEG + 64 * MIB),
                    ("c_int32", 1))
    launch, kernel = add_launch(args)
    session.launch_enter(launch, kernel, 1)      # captured, one region left out
    session.launch_exit(1, 0)
    session.launch_enter(launch, kernel, 2)      # the launch fails
    session.launch_exit(2, 719)
    session.launch_enter(launch, kernel, 3)      # never returns
    written = session.close(exit_status=0)
    capsys.readouterr()

    path = tmp_path / "cap" / "capture.json"
    on_disk = json.loads(path.read_text())
    record = read_summary(tmp_path / "cap")
    assert isinstance(record, CaptureSummary) and record.to_json() == on_disk == written
    first, failed, lost = record.dispatches
    assert first.omitted_regions[0].address == SEG + 4096 and first.complete is False
    assert "CUDA_ERROR_719" in failed.reason and lost.reason == "the launch never returned"
    assert record.totals.pool_bytes > 0 and record.filter.max is None

    on_disk["dispatches"][0]["surprise"] = 1
    path.write_text(json.dumps(on_disk))
    with pytest.raises(FormatError, match=r"dispatches\[0\]\.surprise.*unknown"):
        read_summary(path)
    path.write_text(json.dumps({**written, "schema_version": 2}))
    with pytest.raises(FormatError, match="schema_version.*not supported"):
        read_summary(path)


def test_a_filter_that_matches_nothing_says_so(tmp_path):
    session, _ = make_session(tmp_path, filter=Filter("softmax"))
    args = HostArgs(("c_uint64", SEG))
    launch, kernel = add_launch(args)
    session.launch_enter(launch, kernel, 1)
    session.launch_exit(1, 0)
    summary = session.close(0)
    assert summary["notes"] == ["no launch matched --kernel 'softmax' (1 launches of 1 "
                                "distinct kernels seen)"]


def test_capture_refuses_a_non_empty_directory(tmp_path):
    (tmp_path / "cap").mkdir()
    (tmp_path / "cap" / "x").write_text("mine")
    with pytest.raises(UsageError, match="not empty"):
        make_session(tmp_path)


def test_blob_pool_dedupes_across_snapshots(tmp_path):
    pool = BlobPool(tmp_path / "blobs")
    w1, w2 = pool.writer(tmp_path / "a"), pool.writer(tmp_path / "b")
    ref1, ref2 = w1.put(b"x" * 1000), w2.put(b"x" * 1000)
    assert ref1 == ref2 and w2.new_bytes == 0 and w2.deduped_bytes == 1000
    assert (tmp_path / "b" / ref2.path).read_bytes() == (tmp_path / "a" / ref1.path).read_bytes()


# ---------------------------------------------------------------- finding CUPTI

def test_cupti_candidates_and_choice(tmp_path):
    site = tmp_path / "site"
    for sub in ("nvidia/cu13/lib/libcupti.so.13", "nvidia/cuda_cupti/lib/libcupti.so.12"):
        (site / sub).parent.mkdir(parents=True)
        (site / sub).write_bytes(b"")
    home = tmp_path / "cuda"
    (home / "extras/CUPTI/lib64").mkdir(parents=True)
    (home / "extras/CUPTI/lib64/libcupti.so").write_bytes(b"")
    found = cupti.candidate_paths({"CUDA_HOME": str(home)}, [str(site)], ldconfig="")
    assert [Path(p).relative_to(tmp_path).as_posix() for p in found[:3]] == [
        "site/nvidia/cu13/lib/libcupti.so.13", "site/nvidia/cuda_cupti/lib/libcupti.so.12",
        "cuda/extras/CUPTI/lib64/libcupti.so"]
    # a CUDA 12 driver cannot serve CUPTI 13: the 12 comes first, 13 last
    assert [cupti.soname_major(p) for p in cupti.choose(found[:3], 12)] == [12, None, 13]
    explicit = cupti.candidate_paths({"KPAIR_CUPTI_LIB": "/x/libcupti.so"}, [], ldconfig="")
    assert explicit[0] == "/x/libcupti.so"


def test_missing_cupti_names_the_install_command(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cupti, "candidate_paths", lambda: [])
    with pytest.raises(BackendUnavailable, match="pip install nvidia-cuda-cupti"):
        cupti.find_cupti()
    code = main(["capture", "-o", str(tmp_path / "o"), "--", "python", "prog.py"])
    assert code == 4
    assert "pip install nvidia-cuda-cupti" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------- the command line

def test_child_command_inserts_the_runner_after_interpreter_options():
    run = ["-m", "kpair.capture.program"]
    assert child_command(["python", "prog.py", "-x"]) == ["python", *run, "prog.py", "-x"]
    assert child_command(["python3.12", "-u", "-X", "dev", "-m", "pkg.mod", "a"]) == \
        ["python3.12", "-u", "-X", "dev", *run, "-m", "pkg.mod", "a"]
    assert child_command(["python", "-c", "print(1)"]) == ["python", *run, "-c", "print(1)"]
    with pytest.raises(UsageError, match="Python interpreter"):
        child_command(["./a.out"])
    with pytest.raises(UsageError, match="names no program"):
        child_command(["python", "-u"])
    with pytest.raises(UsageError, match="no command"):
        child_command([])


def test_sizes_and_statuses():
    assert parse_size("512MiB") == 512 * MIB and parse_size("2G") == 2 << 30
    assert parse_size("4096") == 4096
    assert status_of(3) == 3 and status_of(-11) == 139


@pytest.mark.parametrize("argv, message", [
    (["capture", "-o", "OUT"], "no command given"),
    (["capture", "-o", "OUT", "--max", "-1", "--", "python", "p.py"], "--max"),
    (["capture", "-o", "OUT", "--nth", "0", "--", "python", "p.py"], "--nth"),
])
def test_bad_command_lines_are_usage_errors(argv, message, tmp_path, capsys):
    argv = [str(tmp_path / "o") if a == "OUT" else a for a in argv]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


FAKE_CHILD = textwrap.dedent("""
    import json, os, sys
    sys.path[:0] = [{tests!r}]
    from test_capture_cpu import make_session_at
    settings = json.loads(os.environ["KPAIR_CAPTURE"])
    assert os.environ["CUDA_MODULE_LOADING"] == "EAGER"
    session = make_session_at(settings)
    print("the program ran")
    session.close(exit_status=3)
    sys.exit(3)
""")


def make_session_at(settings: dict) -> CaptureSession:
    """The fake child's session: a real CaptureSession on the fake driver, no launches."""
    driver = FakeDriver({SEG: 4096})
    return CaptureSession(settings["out"], Filter(settings["kernel"]), driver=driver,
                          registry=ModuleRegistry(), command=settings["command"])


def test_cli_returns_the_program_status_and_says_when_nothing_matched(monkeypatch, tmp_path,
                                                                       capsys):
    import kpair.capture.workflow as cli_capture

    child = tmp_path / "child.py"
    child.write_text(FAKE_CHILD.format(tests=str(Path(__file__).parent)))
    monkeypatch.setattr(cupti, "find_cupti", lambda *a: "/fake/libcupti.so")
    monkeypatch.setattr(cli_capture, "child_command", lambda cmd: [sys.executable, str(child)])
    code = main(["capture", "-o", str(tmp_path / "o"), "--kernel", "softmax", "--",
                 "python", "prog.py"])
    assert code == 3
    err = capsys.readouterr().err
    assert "0 dispatches captured" in err and "program exit status 3" in err
    assert "no launch matched --kernel 'softmax'" in err
    assert json.loads((tmp_path / "o" / "capture.json").read_text())["exit_status"] == 3


# ---------------------------------------------------------------- the runner

def test_run_program_runs_scripts_modules_and_code(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    script = tmp_path / "prog.py"
    script.write_text("import sys\nprint('args', sys.argv[1:])\nsys.exit(int(sys.argv[1]))\n")
    assert run_program([str(script), "7"]) == 7
    assert "args ['7']" in capsys.readouterr().out
    assert run_program(["-c", "raise ValueError('boom')"]) == 1
    assert "ValueError: boom" in capsys.readouterr().err
    assert run_program(["-c", "import sys; sys.exit('bad news')"]) == 1
    assert run_program(["-m", "json.tool", "--help"]) == 0
    assert run_program(["-c", "x = 1"]) == 0


def test_runner_without_a_driver_exits_4_before_the_program(tmp_path):
    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("a CUDA driver is present here")
    except OSError:
        pass
    env = {"KPAIR_CAPTURE": json.dumps({"out": str(tmp_path / "o")}),
           "PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    proc = subprocess.run([sys.executable, "-m", "kpair.capture.program", "-c", "print('ran')"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 4 and "ran" not in proc.stdout
    assert "kpair capture:" in proc.stderr


# ---------------------------------------------------------------- the tracer's callback glue

class FakeKernelDriver(FakeDriver):
    """FakeDriver plus the per-function queries the tracer makes."""

    def function_name(self, handle):
        return "kp_add", "function"

    def param_layout(self, handle, kernel_first=False):
        return [(0, 8), (8, 8), (16, 8), (24, 4)], "cuFuncGetParamInfo"

    def function_module(self, handle):
        return 0xC0DE

    def kernel_library(self, handle):
        raise AssertionError("not asked when the module is known")


def test_tracer_callbacks_feed_modules_and_launches_to_the_session(tmp_path):
    from kpair.capture.tracer import Tracer

    tracer = Tracer.__new__(Tracer)   # no CUPTI here: drive the callback by hand
    tracer.driver = FakeKernelDriver({SEG: 2 * MIB, SEG + 64 * MIB: 20 * MIB})
    tracer.registry, tracer.errors, tracer._kernels = ModuleRegistry(), [], {}
    tracer._tls, tracer._lock = threading.local(), threading.RLock()
    blocks = BlockTable(allocator_blocks(torch_snapshot()))
    tracer.session = CaptureSession(tmp_path / "cap", Filter(None, max=None),
                                    driver=tracer.driver, registry=tracer.registry,
                                    blocks=lambda: blocks)

    # cuModuleLoadData: ENTER, MODULE_LOADED inside it, EXIT filling *module = 0xC0DE
    handle = ctypes.c_void_p(0)
    load_params = (ctypes.c_void_p * 2)(ctypes.addressof(handle), 0)
    ok = ctypes.c_int(0)
    data = cupti.CallbackData(callbackSite=cupti.API_ENTER,
                              functionParams=ctypes.addressof(load_params),
                              functionReturnValue=ctypes.addressof(ok))
    tracer._on_callback(None, cupti.DOMAIN_DRIVER_API, 19, ctypes.addressof(data))
    image = ctypes.create_string_buffer(CUBIN, len(CUBIN))
    module = cupti.ModuleResourceData(42, len(CUBIN), ctypes.addressof(image))
    res = cupti.ResourceData(0, 0, ctypes.addressof(module))
    tracer._on_callback(None, cupti.DOMAIN_RESOURCE, cupti.CBID_MODULE_LOADED,
                        ctypes.addressof(res))
    handle.value = 0xC0DE
    data.callbackSite = cupti.API_EXIT
    tracer._on_callback(None, cupti.DOMAIN_DRIVER_API, 19, ctypes.addressof(data))
    assert tracer.registry.images[42] == CUBIN and tracer.registry.handles == {0xC0DE: 42}

    args = HostArgs(("c_uint64", SEG), ("c_uint64", SEG + 4096), ("c_uint64", SEG + 64 * MIB),
                    ("c_int32", 5))
    p = cupti.LaunchKernelParams(0xF00, 1, 1, 1, 32, 1, 1, 0, 0, args.address, None)
    launch = cupti.CallbackData(callbackSite=cupti.API_ENTER,
                                functionParams=ctypes.addressof(p),
                                functionReturnValue=ctypes.addressof(ok), correlationId=9)
    tracer._on_callback(None, cupti.DOMAIN_DRIVER_API, 307, ctypes.addressof(launch))
    launch.callbackSite = cupti.API_EXIT
    tracer._on_callback(None, cupti.DOMAIN_DRIVER_API, 307, ctypes.addressof(launch))
    assert tracer.errors == []
    summary = tracer.session.close()
    [d] = summary["dispatches"]
    assert d["status"] == "captured" and d["code_object_match"] == "module handle"
    assert Snapshot.open(tmp_path / "cap" / d["snapshot"]).manifest.regions[2].size == 1024


def test_an_inductor_autotuners_configs_are_recorded_for_the_retuner(monkeypatch):
    """The frame walk finds Inductor's autotuner above the launch and records every config it
    was given (the retuner's seeds) beside the one it compiled. The objects stand in for
    Inductor's: only their attributes are read."""
    from types import SimpleNamespace

    from kpair.capture import triton_meta

    monkeypatch.setitem(sys.modules, "triton", SimpleNamespace())  # "triton was imported"

    fn = SimpleNamespace(__name__="triton_poi_fused_add_0", src="def triton_poi_fused_add_0"
                         "(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):\n    pass\n")
    def config(x, w):
        return SimpleNamespace(kwargs={"XBLOCK": x}, num_warps=w, num_stages=1, num_ctas=1,
                               maxnreg=None)

    given = [config(1024, 4), config(256, 2), config(2048, 8)]
    autotuner = SimpleNamespace(fn=fn, triton_meta={"signature": {"in_ptr0": "*fp32"}},
                                inductor_meta={"kernel_name": fn.__name__}, configs=given,
                                launchers=[SimpleNamespace(config=given[1])])

    def launch(tuner):  # the CUPTI callback runs below the launching frame
        return triton_meta.triton_metadata(0x1234, "triton_poi_fused_add_0")

    info = launch(autotuner)
    assert info["launched_by"] == "SimpleNamespace" and info["source"].startswith("def ")
    assert [c["kwargs"]["XBLOCK"] for c in info["autotune_configs"]] == [1024, 256, 2048]
    assert info["launcher_configs"] == [{"kwargs": {"XBLOCK": 256}, "num_warps": 2,
                                         "num_stages": 1, "num_ctas": 1, "maxnreg": None}]
