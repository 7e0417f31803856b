"""The cuda backend without a GPU: code-object facts, placement arithmetic, launch layouts,
and the device's decisions driven by a scripted stand-in for ``cuda.bindings.driver``.

What needs the real driver (byte-exact replay, placement in a fresh process, timing) is in
tests/gpu/. nvcc-built cubins are checked here when nvcc is on PATH.
"""

from __future__ import annotations

import ctypes
import enum
import shutil
import struct
import sys
import types
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from conftest import plain_answers_left
from kpair.backends import open_device
from kpair.backends._cuda_driver import (
    ATTRIBUTE_BYTES,
    GIB,
    ParamArray,
    attribute_bytes,
    cubin_arch,
    plan_span,
    ptx_target,
    replayed_attributes,
)
from kpair.backends.base import byte_diff, digest64, fill_bytes, mask_bytes
from kpair.backends.cuda import CudaDevice
from kpair.errors import (
    ArchitectureMismatch,
    BackendUnavailable,
    DriverError,
    SnapshotFormatError,
    SymbolNotFound,
    UsageError,
)
from kpair.placement import patch_pointers
from kpair.snapshot import Launch, LaunchAttribute, Param, detect_format
from kpair.toolchain import compile_cuda

CUDA_SRC = Path(__file__).parent / "cuda"
MIB = 1 << 20
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


# --------------------------------------------------------------------------- code objects


@needs_nvcc
@pytest.mark.parametrize("source", sorted(p.name for p in CUDA_SRC.glob("*.cu")))
def test_test_kernels_build_as_sm90_cubins(tmp_path, source):
    out = compile_cuda(CUDA_SRC / source, tmp_path / "k.cubin", arch="sm_90")
    image = out.read_bytes()
    assert detect_format(image) == "cubin"
    assert cubin_arch(image) == "sm_90"


@needs_nvcc
def test_arch_and_formats_of_nvcc_outputs(tmp_path):
    src = CUDA_SRC / "elementwise.cu"
    assert cubin_arch(compile_cuda(src, tmp_path / "a.cubin", arch="sm_80").read_bytes()) \
        == "sm_80"
    ptx = compile_cuda(src, tmp_path / "a.ptx", arch="sm_90", kind="ptx").read_bytes()
    assert detect_format(ptx) == "ptx" and ptx_target(ptx) == "sm_90"
    fat = compile_cuda(src, tmp_path / "a.fatbin", arch="sm_90", kind="fatbin").read_bytes()
    assert detect_format(fat) == "fatbin" and cubin_arch(fat) is None


def test_cubin_arch_reads_both_elf_abi_versions():
    def header(abi: int, flags: int) -> bytes:
        h = bytearray(64)
        h[:4], h[4], h[5], h[8] = b"\x7fELF", 2, 1, abi
        struct.pack_into("<H", h, 18, 190)
        struct.pack_into("<I", h, 48, flags)
        return bytes(h)

    assert cubin_arch(header(8, 0x06005A04)) == "sm_90"     # CUDA 12.8+ toolchains
    assert cubin_arch(header(7, 0x005A055A)) == "sm_90"     # older toolchains
    assert cubin_arch(header(7, 0x00500550)) == "sm_80"
    assert cubin_arch(b"\x7fELF" + bytes(60)) is None       # not a CUDA ELF
    assert cubin_arch(b"not an elf") is None


# --------------------------------------------------------------------------- placement


def test_plan_span_reserves_from_the_gib_below_the_lowest_range():
    lo = 0x7F00_4000_0000 + 0x123456
    plan = plan_span([(lo + 5 * MIB, lo + 6 * MIB), (lo, lo + 100)], 2 * MIB)
    assert plan.base == lo // GIB * GIB and plan.base % GIB == 0
    assert plan.size % GIB == 0 and plan.base + plan.size >= plan.spans[-1][1]
    assert plan.spans == ((lo // (2 * MIB) * 2 * MIB, lo // (2 * MIB) * 2 * MIB + 2 * MIB),
                          ((lo + 5 * MIB) // (2 * MIB) * 2 * MIB,
                           -(-(lo + 6 * MIB) // (2 * MIB)) * 2 * MIB))
    assert plan.mapped_bytes == 4 * MIB


def test_plan_span_crossing_a_gib_boundary_and_far_ranges():
    base = 3 * GIB
    plan = plan_span([(base - 4096, base + 4096), (base + 5 * GIB, base + 5 * GIB + 1)],
                     2 * MIB)
    assert plan.base == 2 * GIB and plan.size == 7 * GIB  # up to 8 GiB + 2 MiB
    assert plan.spans[0] == (base - 2 * MIB, base + 2 * MIB)
    with pytest.raises(ValueError):
        plan_span([(0, 1)], 3 * MIB)
    with pytest.raises(ValueError):
        plan_span([], 2 * MIB)


def test_relocation_by_a_gib_multiple_moves_pointers_and_keeps_alignment():
    lo, hi = 0x7F00_4000_0100, 0x7F00_4000_9000
    delta = 5 * GIB - plan_span([(lo, hi)], 2 * MIB).base % GIB - 2 * GIB
    kernarg = struct.pack("<QQiiQ", lo, hi - 8, 7, 8, 0x1234)
    patched, count = patch_pointers(kernarg, 0, lo, hi, delta)
    a, b, i, j, other = struct.unpack("<QQiiQ", patched)
    assert (a, b, i, j, other, count) == (lo + delta, hi - 8 + delta, 7, 8, 0x1234, 2)
    assert delta % GIB == 0 and (lo + delta) % 256 == lo % 256


# --------------------------------------------------------------------------- launch inputs


def test_param_array_points_at_each_parameter_offset():
    kernarg = struct.pack("<QQi4xd", 0xAAAA, 0xBBBB, -3, 2.5)
    params = [Param(0, 8, "pointer"), Param(8, 8, "pointer"), Param(16, 4, "i32"),
              Param(24, 8, "f64")]
    pa = ParamArray(kernarg, params)
    ptrs = (ctypes.c_void_p * 4).from_address(pa.address)
    assert [ctypes.string_at(ptrs[k], p.size) for k, p in enumerate(params)] == \
        [kernarg[p.offset:p.offset + p.size] for p in params]
    assert pa.extra == 0


def test_param_array_without_layout_passes_the_blob_through_extra():
    pa = ParamArray(b"\x01" * 12, [])
    assert pa.address == 0 and pa.extra
    words = (ctypes.c_void_p * 5).from_address(pa.extra)
    assert words[0] == 1 and words[2] == 2 and not words[4]
    assert ctypes.string_at(words[1], 12) == b"\x01" * 12
    assert ctypes.c_size_t.from_address(words[3]).value == 12
    with pytest.raises(SnapshotFormatError):
        ParamArray(b"\0" * 4, [Param(0, 8)])


def test_launch_attribute_bytes_and_dropped_handles():
    cluster = LaunchAttribute(4, "CLUSTER_DIMENSION", struct.pack("<3I", 2, 1, 1))
    raw = attribute_bytes(cluster)
    assert len(raw) == ATTRIBUTE_BYTES
    assert struct.unpack_from("<I4x3I", raw) == (4, 2, 1, 1) and raw[20:] == bytes(52)
    window = LaunchAttribute(1, "ACCESS_POLICY_WINDOW", struct.pack("<QQ", 0x5000, 64))
    assert struct.unpack_from("<Q", attribute_bytes(window, lo=0x4000, hi=0x6000,
                                                    delta=GIB), 8)[0] == 0x5000 + GIB
    assert struct.unpack_from("<Q", attribute_bytes(window, lo=0, hi=0x100, delta=GIB),
                              8)[0] == 0x5000
    with pytest.raises(SnapshotFormatError):
        attribute_bytes(LaunchAttribute(4, "X", bytes(65)))
    kept = replayed_attributes([cluster, LaunchAttribute(7, "PROGRAMMATIC_EVENT", bytes(64)),
                                LaunchAttribute(6, "PROGRAMMATIC_STREAM_SERIALIZATION",
                                                b"\1")])
    assert [a.id for a in kept] == [4, 6]


# --------------------------------------------------------------------------- the device


def test_missing_bindings_name_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda", None)
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    with pytest.raises(BackendUnavailable, match=r"pip install 'kpair\[cuda\]'"):
        open_device("cuda")
    with pytest.raises(UsageError, match="unknown cuda backend option"):
        open_device("cuda", colour="red")


class R(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209
    CUDA_ERROR_NOT_FOUND = 500
    CUDA_ERROR_ILLEGAL_ADDRESS = 700
    CUDA_ERROR_NOT_SUPPORTED = 801


class _AnyEnum:
    """Any enum member the device asks for, with a ``value``."""

    def __getattr__(self, name):
        return types.SimpleNamespace(name=name, value=0)


class _Struct:
    def __init__(self):
        self._raw = ctypes.create_string_buffer(ATTRIBUTE_BYTES)

    def getPtr(self):  # noqa: N802 - the bindings' name
        return ctypes.addressof(self._raw)


class FakeDriver:
    """A scripted ``cuda.bindings.driver``: a GPU of cc 9.0, VMM, modules, failures on cue."""

    CUresult = R
    CUstream_flags = CUevent_flags = CUstreamWaitValue_flags = _AnyEnum()
    CUmemAllocationGranularity_flags = CUfunction_attribute = _AnyEnum()
    CUmemLocationType = CUmemAllocationType = CUmemAccess_flags = _AnyEnum()
    CUdevice_attribute = enum.IntEnum("A", "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR "
                                      "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR "
                                      "CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE "
                                      "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT "
                                      "CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS")
    CUmemLocation = CUmemAllocationProp = CUmemAccessDesc = CUlaunchConfig = _Struct
    CUlaunchAttribute = _Struct

    def __init__(self):
        self.calls: list[tuple] = []
        self.taken: set[int] = set()
        self.anywhere = 0x7F00_0000_0000
        self.fail: dict[str, R] = {}      # call name → result it returns
        self.sticky: R | None = None
        self.layouts = {b"axpy": [(0, 8), (8, 8), (16, 4), (20, 4)]}

    def __getattr__(self, name):
        if not name.startswith("cu"):
            raise AttributeError(name)

        def call(*args):
            self.calls.append((name, *args))
            return (self._result(name),)
        return call

    def _result(self, name: str) -> R:
        if self.sticky is not None and name not in ("cuGetErrorName", "cuGetErrorString"):
            return self.sticky
        return self.fail.get(name, R.CUDA_SUCCESS)

    def _out(self, name, value, *args):
        self.calls.append((name, *args))
        return (self._result(name), value)

    def cuGetErrorName(self, err):
        return (R.CUDA_SUCCESS, R(err).name.encode())

    def cuGetErrorString(self, err):
        return (R.CUDA_SUCCESS, b"explained")

    def cuDeviceGetCount(self):
        return self._out("cuDeviceGetCount", 1)

    def cuDeviceGetAttribute(self, attr, dev):
        values = {1: 9, 2: 0, 3: 50 * MIB, 4: 132, 5: 0}
        return self._out("cuDeviceGetAttribute", values[int(attr)], attr)

    def cuMemGetAllocationGranularity(self, prop, option):
        return self._out("cuMemGetAllocationGranularity", 2 * MIB)

    def cuMemAddressReserve(self, size, align, addr, flags):
        if not addr or addr in self.taken:
            addr = self.anywhere
            self.anywhere += 64 * GIB
        self.taken.add(addr)
        return self._out("cuMemAddressReserve", addr, size, align)

    def cuModuleLoadData(self, image):
        if image.startswith(b"sm80"):
            return (R.CUDA_ERROR_NO_BINARY_FOR_GPU, None)
        return self._out("cuModuleLoadData", "module")

    def cuModuleGetFunction(self, module, name):
        if name not in self.layouts:
            return (R.CUDA_ERROR_NOT_FOUND, None)
        return self._out("cuModuleGetFunction", name)

    def cuFuncGetParamInfo(self, f, i):
        layout = self.layouts[f]
        if layout is None:
            return (R.CUDA_ERROR_NOT_SUPPORTED, None, None)
        if i >= len(layout):
            return (R.CUDA_ERROR_INVALID_VALUE, None, None)
        return (R.CUDA_SUCCESS, *layout[i])

    def cuMemAlloc(self, size):
        return self._out("cuMemAlloc", 0x1000_0000 + len(self.calls) * 0x10000, size)

    def cuEventElapsedTime(self, a, b):
        return self._out("cuEventElapsedTime", 0.25)

    def __getattribute__(self, name):
        # the bindings' one-value getters, answered with an opaque handle
        if name in ("cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuStreamCreate",
                    "cuEventCreate", "cuMemCreate"):
            return lambda *args: object.__getattribute__(self, "_out")(name, f"h-{name}",
                                                                       *args)
        return object.__getattribute__(self, name)


@pytest.fixture()
def fake():
    drv = FakeDriver()
    dev = CudaDevice(drv)
    yield drv, dev
    dev.close()


def test_fake_device_facts_and_captured_placement(fake):
    drv, dev = fake
    assert dev.arch() == "sm_90" and dev.flush_bytes == 100 * MIB and dev.gated
    lo = 0x7F12_4020_0000
    m = dev.map([(lo, lo + 4096), (lo + 5 * MIB, lo + 5 * MIB + 8)])
    assert m.mode == "captured" and m.delta == 0
    assert m.detail["reserved"] == hex(lo // GIB * GIB) and m.detail["spans"] == 2
    mapped = [c for c in drv.calls if c[0] == "cuMemMap"]
    assert [(c[1], c[2]) for c in mapped] == [(lo, 2 * MIB), (lo + 4 * MIB, 2 * MIB)]


def test_fake_device_relocates_by_gib_multiples(fake):
    drv, dev = fake
    lo = 0x7F12_4020_0000
    drv.taken.add(lo // GIB * GIB)          # someone holds the captured address
    m = dev.map([(lo, lo + 64)])
    assert m.mode == "relocated" and m.delta % GIB == 0 and m.delta != 0
    assert "granted" in m.detail["reason"]


def test_fake_device_forced_relocation_never_keeps_the_captured_address(fake):
    drv, dev = fake
    drv.anywhere = 0            # "anywhere" would first hand back the captured base, 0
    m = dev.map([(4096, 8192)], relocate=True)
    assert m.mode == "relocated" and m.delta != 0 and m.detail["reason"] == "forced"
    assert any(c[0] == "cuMemAddressFree" and c[1] == 0 for c in drv.calls)


def test_fake_device_load_errors_and_layout(fake):
    drv, dev = fake
    k = dev.load(b"cubin", "axpy", fmt="cubin")
    assert k.param_layout() == [(0, 8), (8, 8), (16, 4), (20, 4)]
    drv.layouts[b"cutlass"] = None
    assert dev.load(b"cubin", "cutlass", fmt="cubin").param_layout() is None
    with pytest.raises(SymbolNotFound, match="'nope'"):
        dev.load(b"cubin", "nope", fmt="cubin")
    sm80 = bytearray(b"sm80" + bytes(60))
    with pytest.raises(ArchitectureMismatch, match="sm_90.*NO_BINARY_FOR_GPU"):
        dev.load(bytes(sm80), "axpy", fmt="cubin")
    with pytest.raises(ArchitectureMismatch, match="hsaco"):
        dev.load(b"x", "axpy", fmt="hsaco")


def test_fake_device_launch_sets_big_dynamic_smem_once_and_fault_names_the_error(fake):
    drv, dev = fake
    k = dev.load(b"cubin", "axpy", fmt="cubin")
    launch = Launch((4, 1, 1), (256, 1, 1), 96 << 10)
    params = [Param(0, 8, "pointer"), Param(8, 8, "pointer"), Param(16, 4, "f32"),
              Param(20, 4, "i32")]
    for _ in range(2):
        dev.launch(k, launch, bytes(24), params)
    assert sum(c[0] == "cuFuncSetAttribute" for c in drv.calls) == 1
    assert sum(c[0] == "cuLaunchKernelEx" for c in drv.calls) == 2
    assert dev.timed_launch(k, launch, bytes(24), params) == pytest.approx(0.25e-3)

    drv.fail["cuStreamSynchronize"] = R.CUDA_ERROR_ILLEGAL_ADDRESS
    with pytest.raises(DriverError) as e:
        dev.launch(k, launch, bytes(24), params)
    assert e.value.code == "CUDA_ERROR_ILLEGAL_ADDRESS" and "axpy" in str(e.value)


def test_fake_device_timing_gate_opens_even_when_the_launch_fails(fake):
    drv, dev = fake
    k = dev.load(b"cubin", "axpy", fmt="cubin")
    drv.fail["cuLaunchKernelEx"] = R.CUDA_ERROR_ILLEGAL_ADDRESS
    with pytest.raises(DriverError, match="cuLaunchKernelEx"):
        dev.timed_launch(k, Launch(), bytes(24), [Param(0, 8)])
    assert drv.calls[-1][0] == "cuStreamWriteValue32"


def test_fake_device_close_after_a_sticky_error_neither_raises_nor_repeats(fake):
    drv, dev = fake
    dev.map([(0x7F00_0000_0000, 0x7F00_0000_1000)])
    dev.stage(0x7F00_0000_0000, b"abc")
    drv.sticky = R.CUDA_ERROR_ILLEGAL_ADDRESS
    with pytest.raises(DriverError):
        dev.restore()
    dev.close()
    n = len(drv.calls)
    dev.close()
    assert len(drv.calls) == n
    assert any(c[0] == "cuDevicePrimaryCtxRelease" for c in drv.calls)


def test_fake_device_trust_capabilities(fake):
    drv, dev = fake
    lo = 0x7F12_4000_0000
    dev.map([(lo, lo + 4096)])
    assert dev.mapped_ranges() == [(lo, lo + 2 * MIB)]
    dev.fill(lo, 64, 0xDEADBEEF)        # stream-ordered: no wait of its own
    assert drv.calls[-1][:4] == ("cuMemsetD32Async", lo, 0xDEADBEEF, 16)
    dev.fill(lo + 1, 6, 0xDEADBEEF)      # unaligned: through write(), on the replay stream
    copy, wait = drv.calls[-2:]          # and waited for: a legacy-stream copy could land late
    assert copy[0] == "cuMemcpyHtoDAsync" and copy[2] == bytes.fromhex("efbeaddeefbe")
    assert copy[4] is dev.stream and wait == ("cuStreamSynchronize", dev.stream)
    n = len(drv.calls)   # a fresh timed input: small copies, ordered on the stream, no waits
    dev.patch([(lo + 8, b"\x01\x02\x03\x04"), (lo + 64, b"\x05" * 8)])
    assert [(c[0], c[1], c[4]) for c in drv.calls[n:]] == [
        ("cuMemcpyHtoDAsync", lo + 8, dev.stream), ("cuMemcpyHtoDAsync", lo + 64, dev.stream)]
    dev.synchronize()
    assert drv.calls[-1][0] == "cuCtxSynchronize"
    assert dev.measure_bandwidth(1 << 20) == pytest.approx((1 << 20) / 0.25e-3)
    assert drv.calls[-1][0] == "cuMemFree"


def test_c_strings_from_the_bindings_end_at_the_first_nul():
    from kpair.backends._cuda_driver import c_string
    assert c_string(b"NVIDIA H200" + b"\0" * 50 + b" " * 100) == "NVIDIA H200"
    assert c_string(b"0000:00:06.0\0" + b" " * 19) == "0000:00:06.0"
    assert c_string("plain") == "plain"


# --------------------------------------------------------------------------- checks in place


class MemoryDriver(FakeDriver):
    """FakeDriver with memory: allocations and mapped spans hold bytes, copies and memsets
    move them, and the check kernels (kp_diff, kp_fill, kp_copy) run as their host reference
    (byte_diff, digest64): what the device does around them is then tested for real."""

    def __init__(self, *, broken: bool = False):
        super().__init__()
        self.mem: dict[int, bytearray] = {}
        self.next = 0x5000_0000_0000
        self.broken = broken          # kp_diff miscounts: the self-test must notice
        self.d2h = 0                  # bytes read back to the host
        self.layouts.update({b"kp_diff": None, b"kp_copy": None, b"kp_fill": None})

    def _at(self, address: int, size: int) -> memoryview:
        for base, buf in self.mem.items():
            if base <= address and address + size <= base + len(buf):
                return memoryview(buf)[address - base:address - base + size]
        raise AssertionError(f"unmapped access {hex(address)}+{size}")

    def cuMemAlloc(self, size):
        ptr, self.next = self.next, self.next + (-(-size // 4096) + 1) * 4096
        self.mem[ptr] = bytearray(size)
        return self._out("cuMemAlloc", ptr, size)

    def cuMemFree(self, ptr):
        del self.mem[ptr]
        return self._out("cuMemFree", None, ptr)[:1]

    def cuMemMap(self, address, size, offset, handle, flags):
        self.mem[address] = bytearray(size)
        return self._out("cuMemMap", None, address, size)[:1]

    def cuMemcpyHtoDAsync(self, dst, data, size, stream):
        self._at(dst, size)[:] = bytes(data)[:size]
        return self._out("cuMemcpyHtoDAsync", None, dst, bytes(data), size)[:1]

    def cuMemcpyDtoH(self, out, src, size):
        if isinstance(out, int):     # a host address (what CudaDevice.read gives large reads)
            ctypes.memmove(out, bytes(self._at(src, size)), size)
        else:
            out[:size] = self._at(src, size)
        self.d2h += size
        return self._out("cuMemcpyDtoH", None, src, size)[:1]

    def cuMemcpyDtoDAsync(self, dst, src, size, stream):
        self._at(dst, size)[:] = bytes(self._at(src, size))
        return self._out("cuMemcpyDtoDAsync", None, dst, src, size)[:1]

    def cuMemsetD32Async(self, ptr, word, count, stream):
        self._at(ptr, 4 * count)[:] = word.to_bytes(4, "little") * count
        return self._out("cuMemsetD32Async", None, ptr, word, count)[:1]

    def cuMemsetD8Async(self, ptr, value, count, stream):
        self._at(ptr, count)[:] = bytes([value]) * count
        return self._out("cuMemsetD8Async", None, ptr, value, count)[:1]

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        ptrs = (ctypes.c_void_p * 6).from_address(params)

        def arg(i, ctype=ctypes.c_uint64):
            return ctype.from_address(ptrs[i]).value

        if f == b"kp_copy":
            table = self._at(arg(0), 32 * gy)
            for i in range(gy):
                dst, src, n, mask = struct.unpack_from("<QQQQ", table, 32 * i)
                if n:
                    self._at(dst, n)[:] = _xor(bytes(self._at(src, n)), mask)
        elif f == b"kp_fill":
            table, word = self._at(arg(0), 16 * gy), arg(1, ctypes.c_uint32)
            for i in range(gy):
                dst, n = struct.unpack_from("<QQ", table, 16 * i)
                if n:
                    self._at(dst, n)[:] = fill_bytes(word, n)
        else:
            rows = bytes(self._at(arg(0), 48 * gy))
            for i in range(gy):
                a, b, word, n, key, mask = struct.unpack_from("<QQQQQQ", rows, 48 * i)
                out = arg(1) + 24 * i
                got = bytes(self._at(a, n)) if n else b""
                other = bytes(self._at(b, n)) if b and n else fill_bytes(word, n)
                count, first = byte_diff(got, _xor(other, mask))
                count += self.broken
                h = digest64(other if b else got, key)
                c0, f0, h0 = struct.unpack_from("<QQQ", self._at(out, 24))
                self._at(out, 24)[:] = struct.pack(
                    "<QQQ", c0 + count, min(f0, 2**64 - 1 if first is None else first),
                    (h0 + h) % 2**64)
        return self._out("cuLaunchKernel", None, f, gx, gy)[:1]


def _xor(data: bytes, mask: int) -> bytes:
    """``data`` masked (or unmasked) under ``mask`` as kp_copy and kp_diff do; 0: as is."""
    if not mask or not data:
        return data
    return (np.frombuffer(data, np.uint8) ^ np.frombuffer(mask_bytes(mask, len(data)),
                                                           np.uint8)).tobytes()


def _memory_device(**kw):
    drv = MemoryDriver(**kw)
    return drv, CudaDevice(drv)


def test_reads_small_and_large_are_fresh_bytes_with_the_device_contents():
    from kpair.backends._stream import _DIRECT_READ

    drv, dev = _memory_device()
    try:
        lo = 0x7F12_4000_0000
        dev.map([(lo, lo + 2 * MIB)])
        data = np.random.default_rng(3).bytes(_DIRECT_READ + 7)
        dev.write(lo, data)
        for size in (0, 1, 2, _DIRECT_READ - 1, _DIRECT_READ, _DIRECT_READ + 7):
            first, second = dev.read(lo, size), dev.read(lo, size)
            assert type(first) is bytes and first == data[:size] == second
            assert size < 2 or first is not second   # two reads never share one object
        dev.write(lo, bytes(len(data)))
        assert first == data and dev.read(lo, len(data)) == bytes(len(data))
    finally:
        dev.close()


def test_checks_in_place_compare_fill_digest_and_held_copies():
    drv, dev = _memory_device()
    try:
        assert dev.compares_in_place
        assert dev._checks_status == "kernels (kp_diff, kp_fill, kp_copy)"
        lo = 0x7F12_4000_0000
        dev.map([(lo, lo + 3 * MIB)])
        data = bytes(range(256)) * 4096 + b"tail!"
        a = lo + 3                                  # not 16-byte aligned
        dev.write(a, data)
        held = dev.keep(a, len(data))
        assert dev.fetch(held) == data and dev.compare(a, len(data), held) == (0, None)
        dev.write(a + 1000, b"\0\0")
        assert dev.compare(a, len(data), held) == byte_diff(dev.read(a, len(data)), data)
        assert dev.compare(a, len(data), held)[1] == 1000
        dev.put(a, held)                            # device to device
        assert dev.read(a, len(data)) == data
        assert dev.digest(a, len(data), key=7) == digest64(data, 7)
        # A held copy something overwrote: "unknown", never "equal".
        drv._at(held.ptr, 1)[:] = bytes([data[0] ^ 1])
        assert dev.compare(a, len(data), held) is None
        dev.fill(a, 64, 0xDEADBEEF)
        dev.write(a + 64, b"\xef\xbe\xad\xde\xef\x00")
        assert dev.check_fills([(a, 64), (a, 70), (a + 4, 8)], 0xDEADBEEF) == \
            [(0, None), (1, 69), (0, None)]
        # Held buffers are reused once dropped; copies of host bytes too.
        dev.drop(held)
        again = dev.hold(data)
        assert again.ptr == held.ptr and dev.fetch(again) == data
    finally:
        dev.close()


def test_restore_copies_every_staged_region_in_one_launch():
    drv, dev = _memory_device()
    try:
        lo = 0x7F12_4000_0000
        dev.map([(lo, lo + 100), (lo + 4096 + 5, lo + 4096 + 5 + 33)])
        dev.stage(lo, b"a" * 100)
        dev.stage(lo + 4101, b"b" * 33)
        dev.write(lo, b"x" * 100)
        dev.write(lo + 4101, b"y" * 33)
        assert dev.compares_in_place            # loads and self-tests the kernels
        n = len(drv.calls)
        dev.restore()
        assert dev.read(lo, 100) == b"a" * 100 and dev.read(lo + 4101, 33) == b"b" * 33
        restore = drv.calls[n:]
        assert [c[0] for c in restore].count("cuLaunchKernel") == 1
        assert not any(c[0] == "cuMemcpyDtoDAsync" for c in restore)
        # The table of copies, rewritten on the device since, is uploaded again.
        drv._at(dev._table, 48)[:] = bytes(48)
        dev.write(lo, b"z" * 100)
        dev.restore()
        assert dev.read(lo, 100) == b"a" * 100
    finally:
        dev.close()


def test_many_ranges_are_filled_and_checked_in_one_launch_each():
    """What the armor does around every launch (canaries into each guard band, then a check
    of each): one upload and one launch to fill them all, one upload, one launch and one read
    to check them all, however many bands there are; the rows are uploaded afresh each time
    (a table kept on the device could be rewritten by the kernel launched in between)."""
    drv, dev = _memory_device()
    try:
        lo = 0x7F12_4000_0000
        dev.map([(lo, lo + MIB)])
        assert dev.compares_in_place
        spans = [(lo + 4096 * i + i, 100 + 7 * i) for i in range(12)]   # unaligned too
        dev.write(lo, bytes(MIB))
        n = len(drv.calls)
        dev.fill_many(spans, 0xC0FFEE11)
        assert [c[0] for c in drv.calls[n:]] == ["cuMemcpyHtoDAsync", "cuLaunchKernel"]
        memory = dev.read(lo, MIB)
        for a, size in spans:
            assert memory[a - lo:a - lo + size] == fill_bytes(0xC0FFEE11, size)
        assert memory[spans[0][0] - lo + spans[0][1]] == 0          # nothing past a span
        dev.write(spans[5][0] + 3, b"\0")                            # a kernel wrote a band
        n = len(drv.calls)
        found = dev.check_fills(spans, 0xC0FFEE11)
        assert [c[0] for c in drv.calls[n:]] == ["cuMemcpyHtoDAsync", "cuLaunchKernel",
                                                 "cuStreamSynchronize", "cuMemcpyDtoH",
                                                 "cuMemsetD8Async"]
        # no key, no digest left behind for the next kernel to find
        assert not any(drv._at(dev._counters, 72 * len(spans)))
        assert found == [(0, None)] * 5 + [(1, 3)] + [(0, None)] * 6
        # A kernel launched in between rewrites the tables the check kernels read (it can
        # write anywhere): the next fill and check upload theirs again and are not misled.
        for table, size in ((dev._fill_rows, 16 * len(spans)), (dev._counters, 64 * 12)):
            drv._at(table, size)[:] = bytes(size)
        dev.fill_many(spans, 0xC0FFEE12)
        assert dev.check_fills(spans, 0xC0FFEE12) == [(0, None)] * 12
        memory = dev.read(lo, MIB)
        assert all(memory[a - lo:a - lo + n] == fill_bytes(0xC0FFEE12, n) for a, n in spans)
    finally:
        dev.close()


def test_a_fresh_input_of_many_runs_is_one_upload_and_one_copy_launch_then_cleared():
    from kpair.policy.mutation import Patch

    drv, dev = _memory_device()
    try:
        lo = 0x7F12_4000_0000
        dev.map([(lo, lo + MIB)])
        assert dev.compares_in_place
        before = bytes(dev.read(lo + 5, 4096))
        offsets = np.arange(0, 4000, 256, dtype=np.int64) + 5   # 16 runs, unaligned
        p = Patch(offsets, 6, bytes(range(96)))
        dev.scatter([(lo, Patch(offsets, 6, bytes(96)))])      # the first one allocates
        n = len(drv.calls)
        dev.scatter([(lo, p)])
        calls = [c[0] for c in drv.calls[n:]]
        assert calls == ["cuMemcpyHtoDAsync", "cuLaunchKernel", "cuMemsetD8Async"]
        want = bytearray(before)
        for at, data in p.writes(-5):
            want[at:at + 6] = data
        assert dev.read(lo + 5, 4096) == bytes(want)
        # what changed where is not left on the device for the next launch to find
        assert not any(drv._at(dev._scratch[0], dev._scratch[1]))
        dev.scatter([(lo, Patch(offsets[:2], 6, bytes(12)))])  # a few runs: a copy each
        assert [c[0] for c in drv.calls[-2:]] == ["cuMemcpyHtoDAsync"] * 2
    finally:
        dev.close()


def test_check_kernels_that_fail_their_self_test_or_load_are_not_used():
    drv, dev = _memory_device(broken=True)
    try:
        assert not dev.compares_in_place
        assert "self-test (compare)" in dev._checks_status or \
            "self-test (digest)" in dev._checks_status
        lo = 0x7F12_4000_0000
        dev.map([(lo, lo + 64)])
        held = dev.keep(lo, 64)                     # the read-back default
        assert held.data == bytes(64) and dev.compare(lo, 64, held) == (0, None)
    finally:
        dev.close()
    drv = MemoryDriver()
    drv.fail["cuModuleLoadData"] = R.CUDA_ERROR_NO_BINARY_FOR_GPU
    dev = CudaDevice(drv)
    try:
        assert not dev.compares_in_place
        assert "cannot load" in dev._checks_status
    finally:
        dev.close()


class KernelDriver(MemoryDriver):
    """MemoryDriver that also runs two "cubin" kernels on the host: ``axpbyz`` (z = a*x + y
    over float32) and ``nowrite`` (a cheat that leaves z alone)."""

    def __init__(self):
        super().__init__()
        self.layouts.update({b"axpbyz": [(0, 8), (8, 8), (16, 8), (24, 4), (28, 4)],
                             b"nowrite": [(0, 8), (8, 8), (16, 8), (24, 4), (28, 4)]})

    def cuLaunchKernelEx(self, config, f, params, extra):
        ptrs = (ctypes.c_void_p * 5).from_address(params)
        x, y, z = (ctypes.c_uint64.from_address(ptrs[i]).value for i in range(3))
        a = ctypes.c_float.from_address(ptrs[3]).value
        n = ctypes.c_int32.from_address(ptrs[4]).value
        if f == b"axpbyz":
            xs, ys = (np.frombuffer(bytes(self._at(p, 4 * n)), np.float32) for p in (x, y))
            self._at(z, 4 * n)[:] = (np.float32(a) * xs + ys).astype(np.float32).tobytes()
        return self._out("cuLaunchKernelEx", None, f)[:1]


def _axpbyz_snapshot(tmp_path: Path, n: int = 16384) -> Path:
    from kpair.snapshot import CodeObject, Kernarg, Manifest, Region, SnapshotWriter

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(n, np.float32), rng.standard_normal(n, np.float32)
    z = (np.float32(1.5) * x + y).astype(np.float32)
    lo = 0x7F12_4000_0000
    at = {"x": lo, "y": lo + 8 * n, "z": lo + 16 * n}
    w = SnapshotWriter(tmp_path / "snap")
    pre = {"x": x.tobytes(), "y": y.tobytes(), "z": bytes(4 * n)}
    post = {**pre, "z": z.tobytes()}
    regions = tuple(Region(k, at[k], 4 * n, w.put(pre[k]), w.put(post[k]), "float32")
                    for k in at)
    params = (Param(0, 8, "pointer"), Param(8, 8, "pointer"), Param(16, 8, "pointer"),
              Param(24, 4, "f32"), Param(28, 4, "i32"))
    kernarg = struct.pack("<QQQfi", at["x"], at["y"], at["z"], 1.5, n)
    w.finish(Manifest(backend="cuda", arch="sm_90", code=CodeObject(w.put(b"cubin"), "cubin",
                                                                    "axpbyz"),
                      launch=Launch((n // 256, 1, 1), (256, 1, 1)),
                      kernarg=Kernarg(w.put(kernarg), params), regions=regions))
    return tmp_path / "snap"


@pytest.mark.parametrize("opt_name", ["axpbyz", "nowrite"])
def test_checked_run_reads_back_only_what_a_verdict_needs(tmp_path, opt_name):
    from kpair.policy import Policy
    from kpair.replay import Replay
    from kpair.snapshot import Snapshot
    from kpair.trust.audit import Audit

    snap = Snapshot.open(_axpbyz_snapshot(tmp_path))
    drv = KernelDriver()
    dev = CudaDevice(drv)
    try:
        replay = Replay(dev, snap)
        hints = {r.name: "float32" for r in snap.manifest.regions}
        audit = Audit(replay, Policy(), hints, seed=3)
        ref, opt = dev.load(b"cubin", "axpbyz"), dev.load(b"cubin", opt_name)
        launch = snap.manifest.launch
        audit.baseline(ref, launch)
        audit.discover(ref, launch)
        audit.mutate(ref, launch)
        assert set(audit.armor.plan) == {"z"}
        region = 4 * 16384
        before = drv.d2h
        verdict = audit.run_opt(opt, launch)
        for _ in range(8):
            audit.time_one(opt, launch, "opt")
        found = audit.findings()
        if opt_name == "nowrite":
            assert found["poisoned_outputs"].failed and not verdict.passed
            assert "still hold the poison" in found["poisoned_outputs"].reason
            return
        # An honest opt: three checked runs and every ABBA launch judged, no region read;
        # four blocks, each on a fresh input: one upload of a table and the changed bytes of
        # 4 elements in every 256 bytes of x and y (256 runs each), and one copy launch.
        assert verdict.passed and audit.timed["checked"] == 8 and not audit.timed["failed"]
        assert audit._fresh and audit._block == (4, False)
        uploads = [c for c in drv.calls if c[0] == "cuMemcpyHtoDAsync"
                   and c[3] == 2 * 256 * (32 + 16)]
        assert len(uploads) >= 8   # every launch
        assert drv.d2h - before < region // 4
        audit.differential(opt, launch)
        assert audit.diff_runs and all(r.verdict.passed for r in audit.diff_runs)
        assert not audit.failure(), audit.failure()
        assert all(f.passed is not False for f in audit.findings().values())
    finally:
        dev.close()


@contextmanager
def _judged_axpbyz(tmp_path: Path):
    """axpbyz against itself on the stand-in driver, through ref's stages and opt's
    correctness runs (passed): (driver, device, replay, audit, ref, opt, launch)."""
    from kpair.policy import Policy
    from kpair.replay import Replay
    from kpair.snapshot import Snapshot
    from kpair.trust.audit import Audit

    snap = Snapshot.open(_axpbyz_snapshot(tmp_path))
    drv = KernelDriver()
    dev = CudaDevice(drv)
    try:
        replay = Replay(dev, snap)
        audit = Audit(replay, Policy(), {r.name: "float32" for r in snap.manifest.regions},
                      seed=3)
        ref, opt = dev.load(b"cubin", "axpbyz"), dev.load(b"cubin", "axpbyz")
        launch = snap.manifest.launch
        audit.baseline(ref, launch)
        audit.discover(ref, launch)
        audit.mutate(ref, launch)
        assert audit.run_opt(opt, launch).passed
        yield drv, dev, replay, audit, ref, opt, launch
    finally:
        dev.close()


def test_no_device_buffer_of_kpair_holds_an_answer_or_a_key_in_plain(tmp_path):
    """After every stage of a checked run (setup, discovery, ref on mutated inputs, opt,
    timed blocks on fresh inputs, differential runs), a kernel reading kpair's own device
    buffers finds none of ref's answers: every held copy is masked under its own key, and no
    key is left in a table. The copies still give the answers back to kpair."""
    with _judged_axpbyz(tmp_path) as (drv, dev, replay, audit, ref, opt, launch):
        audit.differential(opt, launch)
        audit.timing(ref, launch, opt, launch)
        for role in ("ref", "opt", "opt", "ref") * 2:
            audit.time_one(ref if role == "ref" else opt, launch, role)
        # (timing_integrity set aside: the stand-in's event timer says 250 us, whatever ran)
        assert [n for n, f in audit.findings().items()
                if f.passed is False and n != "timing_integrity"] == []
        assert audit.timed["windows"] == 5 and audit.timed["checked"] == 4
        assert len(audit.variants) > 2 and audit.variants[0][2]["z"] == replay.expected["z"]
        assert plain_answers_left(dev, drv._at, audit, "z") == []
        held = replay.known.find("z", replay.expected["z"])
        assert bytes(drv._at(held.ptr, held.size)) != replay.expected["z"]
        assert dev.fetch(held) == replay.expected["z"]
        assert dev.intact(held)                      # masked again, as it was


def test_philox_keystream_matches_random123_known_answers():
    """The mask's keystream is Philox4x32-10: Random123's known-answer vectors (tests/
    kat_vectors, the three philox4x32 10 lines)."""
    from kpair.backends.base import philox4x32

    vectors = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
               ((2**32 - 1,) * 4, (2**32 - 1,) * 2,
                (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
               ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
                (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
    for ctr, key, want in vectors:
        assert philox4x32(np.array([ctr], np.uint32), key)[0].tolist() == list(want)
    # byte j: byte j % 16 of the block of counter j // 16, whatever the length asked for
    stream = mask_bytes(0x1234_5678_9ABC_DEF1, 100)
    assert mask_bytes(0x1234_5678_9ABC_DEF1, 37) == stream[:37]
    block = philox4x32(np.array([(6, 0, 0, 0)], np.uint32), (0x9ABCDEF1, 0x12345678))
    assert stream[96:100] == block.astype("<u4").tobytes()[:4]
    assert mask_bytes(0x1234_5678_9ABC_DEF3, 100) != stream


def test_renewed_memory_is_other_pages_at_the_same_addresses_and_runs_stay_judged(tmp_path):
    """A replicate's fresh placement: new physical memory under the same addresses (all new
    handles taken before an old one goes), zeroed; every launch after it restores, checks and
    passes as before."""
    with _judged_axpbyz(tmp_path) as (drv, dev, replay, audit, ref, opt, launch):
        mapped, z = dev.mapped_ranges(), replay.address_of("z")
        dev.flush_cache()
        flush = dev._flush_ptr
        n_before = len(drv.calls)
        assert dev.renew_memory()
        calls = [c[0] for c in drv.calls[n_before:]]
        creates = [i for i, c in enumerate(calls) if c == "cuMemCreate"]
        unmaps = [i for i, c in enumerate(calls) if c == "cuMemUnmap"]
        # A spacer of a random number of granules first, given back last: each renewal
        # lands somewhere else among the free pages, not on the pages the last one freed.
        spacer = drv.calls[n_before + creates[0]]
        assert spacer[1] % dev.granularity == 0 and 0 < spacer[1] <= 256 * dev.granularity
        assert len(creates) == len(mapped) + 1 == len(unmaps) + 1
        assert max(creates) < min(unmaps)
        releases = [c for c in drv.calls[n_before:] if c[0] == "cuMemRelease"]
        assert len(releases) == len(mapped) + 1
        # The flush buffer moved as well: the new one taken before the old one was freed.
        assert dev._flush_ptr != flush
        assert calls.index("cuMemAlloc") < calls.index("cuMemFree")
        assert [c[1] for c in drv.calls[n_before:] if c[0] == "cuMemFree"] == [flush]
        assert dev.mapped_ranges() == mapped and replay.address_of("z") == z
        assert dev.read(z, 16) == bytes(16)          # other pages, zeroed
        for _ in range(8):
            audit.time_one(opt, launch, "opt")
            audit.time_one(ref, launch, "ref")
        assert audit.timed["checked"] == 8 and not audit.timed["failed"]
        audit.differential(opt, launch)
        assert not audit.failure(), audit.failure()
        # The spacer's size does not depend on the regions': with 2 MiB granules these
        # regions span a few dozen, and the spacers still spread over 256 (40 draws all within
        # the regions' own size: odds of 8^-40).
        dev.granularity = 2 << 20
        region_granules = -(-sum(end - start for start, end in mapped) // dev.granularity)
        sizes = []
        for _ in range(40):
            k = len(drv.calls)
            assert dev.renew_memory()
            sizes.append(next(c[1] for c in drv.calls[k:] if c[0] == "cuMemCreate"))
        assert region_granules <= 32 and max(sizes) > 32 * dev.granularity
        assert all(0 < s <= 256 * dev.granularity and s % dev.granularity == 0 for s in sizes)
        # No room for a second copy: the placement stays, and says so.
        drv.fail["cuMemCreate"] = R.CUDA_ERROR_OUT_OF_MEMORY
        assert not dev.renew_memory() and dev.mapped_ranges() == mapped
        # No room for new pages beside the spacer: the spacer goes, and they are taken alone.
        del drv.fail["cuMemCreate"]
        made, result = [], drv._result

        def full_once(name):
            made.extend([name] if name == "cuMemCreate" else [])
            return R.CUDA_ERROR_OUT_OF_MEMORY if len(made) == 2 and name == "cuMemCreate" \
                else result(name)
        drv._result = full_once
        assert dev.renew_memory() and len(made) == 2 + len(mapped)


def test_shipped_check_ptx_is_built_from_the_shipped_source(tmp_path):
    """kernels/checks.ptx names the sha256 of the source it came from; with nvcc here, a
    rebuild gives the same PTX."""
    import hashlib
    import subprocess

    from kpair.backends import _cuda_checks as checks

    assert checks.ptx_source_sha256() == hashlib.sha256(checks.source().encode()).hexdigest()
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH: the rebuild is not checked")
    cu = tmp_path / "checks.cu"
    cu.write_text(checks.source())
    subprocess.run([*checks.NVCC, str(cu), "-o", str(tmp_path / "c.ptx")], check=True)
    assert (tmp_path / "c.ptx").read_text() == checks.ptx().split("\n", 1)[1]
