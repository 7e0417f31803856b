"""The hip backend without a GPU: its whole replay path driven against a *scripted stand-in*
for hip-python's ``hip`` module (``StandInHip`` below: no HIP code runs, it answers calls the
way the HIP runtime documents them), with real clang-built gfx942 code objects.

What needs the real runtime (byte-exact replay, placement at captured addresses, timing) is
in tests/hip/ under the ``hip`` marker, for someone with an MI300-class GPU.
"""

from __future__ import annotations

import ctypes
import enum
import struct
import sys
import types

import numpy as np
import pytest

from amd_kit import build, needs_llvm
from kpair.backends import open_device
from kpair.backends._cuda_driver import GIB
from kpair.backends._hip_runtime import KernargBuffer
from kpair.backends.hip import HipDevice
from kpair.errors import (
    AbiMismatch,
    ArchitectureMismatch,
    BackendUnavailable,
    DriverError,
    SymbolNotFound,
    UsageError,
)
from kpair.replay import Replay
from kpair.snapshot import (
    CodeObject,
    Kernarg,
    Launch,
    Manifest,
    Param,
    Region,
    SnapshotWriter,
)

MIB = 1 << 20


class E(enum.IntEnum):
    hipSuccess = 0
    hipErrorInvalidValue = 1
    hipErrorOutOfMemory = 2
    hipErrorInvalidImage = 200
    hipErrorNotFound = 500
    hipErrorIllegalAddress = 700
    hipErrorNotSupported = 801


class _AnyEnum:
    def __getattr__(self, name):
        return types.SimpleNamespace(name=name, value=0)


class _Location:
    type = id = None


class _Prop:
    def __init__(self):
        self.location = _Location()


class StandInHip:
    """A scripted stand-in for hip-python's ``hip`` module: one gfx942 device with 4 MiB of
    L2, a virtual memory API, host-side memory for reads and writes, failures on cue."""

    hipError_t = E
    hipMemAllocationType = hipMemLocationType = hipMemAccessFlags = _AnyEnum()
    hipMemAllocationGranularity_flags = _AnyEnum()
    hipStreamNonBlocking = 1
    hipMemAllocationProp = hipMemAccessDesc = _Prop

    def __init__(self, arch: str = "gfx942:sramecc+:xnack-"):
        self.arch = arch
        self.calls: list[tuple] = []
        self.fail: dict[str, E] = {}
        self.sticky: E | None = None
        self.taken: set[int] = set()
        self.anywhere = 0x7F00_0000_0000
        self.memory: dict[int, bytearray] = {}    # base → bytes (mapped spans and mallocs)
        self.next_malloc = 0x1000_0000
        self.launched: list[dict] = []

    # every call not defined below succeeds and returns nothing
    def __getattr__(self, name):
        if not name.startswith("hip"):
            raise AttributeError(name)
        return lambda *args: self._ret(name, None, *args)

    def _result(self, name: str) -> E:
        if self.sticky is not None and name not in ("hipGetErrorName", "hipGetErrorString"):
            return self.sticky
        return self.fail.get(name, E.hipSuccess)

    def _ret(self, name, value, *args):
        self.calls.append((name, *args))
        err = self._result(name)
        return (err,) if value is None else (err, value)

    def _at(self, address: int, size: int) -> memoryview:
        for base, buf in self.memory.items():
            if base <= address and address + size <= base + len(buf):
                return memoryview(buf)[address - base:address - base + size]
        raise AssertionError(f"access outside mapped memory: {hex(address)}+{size}")

    def hipGetErrorName(self, err):
        return (E(err).name.encode(),)

    def hipGetErrorString(self, err):
        return (b"explained by the stand-in",)

    def hipGetDeviceCount(self):
        return self._ret("hipGetDeviceCount", 1)

    def hipDeviceProp_t(self):
        return types.SimpleNamespace(
            gcnArchName=self.arch.encode() + b"\0" * 8, name=b"Stand-in MI300X\0",
            l2CacheSize=4 * MIB, multiProcessorCount=304, totalGlobalMem=192 << 30,
            pciDomainID=0, pciBusID=0x1b, pciDeviceID=0)

    def hipRuntimeGetVersion(self):
        return self._ret("hipRuntimeGetVersion", 60_241_134)

    def hipStreamCreateWithFlags(self, flags):
        return self._ret("hipStreamCreateWithFlags", "stream", flags)

    def hipEventCreate(self):
        return self._ret("hipEventCreate", f"event{len(self.calls)}")

    def hipEventElapsedTime(self, a, b):
        return self._ret("hipEventElapsedTime", 0.5, a, b)

    def hipMemGetAllocationGranularity(self, prop, option):
        return self._ret("hipMemGetAllocationGranularity", 2 * MIB)

    def hipMemAddressReserve(self, size, align, addr, flags):
        if not addr or addr in self.taken:
            addr = self.anywhere
            self.anywhere += 64 * GIB
        self.taken.add(addr)
        return self._ret("hipMemAddressReserve", addr, size, align)

    def hipMemCreate(self, size, prop, flags):
        return self._ret("hipMemCreate", f"handle-{size}", size)

    def hipMemMap(self, ptr, size, offset, handle, flags):
        self.memory[ptr] = bytearray(size)
        return self._ret("hipMemMap", None, ptr, size)

    def hipMalloc(self, size):
        ptr = self.next_malloc
        self.next_malloc += -(-size // (2 * MIB)) * 2 * MIB + 2 * MIB
        self.memory[ptr] = bytearray(size)
        return self._ret("hipMalloc", ptr, size)

    def hipMemcpyHtoDAsync(self, dst, src, size, stream):
        if self._result("hipMemcpyHtoDAsync") == E.hipSuccess:
            self._at(dst, size)[:] = bytes(src)[:size]
        return self._ret("hipMemcpyHtoDAsync", None, dst, bytes(src)[:size], size)

    def hipMemcpyDtoH(self, dst, src, size):
        if self._result("hipMemcpyDtoH") == E.hipSuccess:
            if isinstance(dst, int):   # a host address, as hip-python takes for a pointer
                ctypes.memmove(dst, bytes(self._at(src, size)), size)
            else:
                dst[:size] = self._at(src, size)
        return self._ret("hipMemcpyDtoH", None, src, size)

    def hipMemcpyDtoDAsync(self, dst, src, size, stream):
        if self._result("hipMemcpyDtoDAsync") == E.hipSuccess:
            self._at(dst, size)[:] = bytes(self._at(src, size))
        return self._ret("hipMemcpyDtoDAsync", None, dst, src, size)

    def hipMemsetD32Async(self, dst, value, count, stream):
        if self._result("hipMemsetD32Async") == E.hipSuccess and \
                any(b <= dst < b + len(m) for b, m in self.memory.items()):
            self._at(dst, 4 * count)[:] = struct.pack("<I", value) * count
        return self._ret("hipMemsetD32Async", None, dst, value, count)

    def hipModuleLoadData(self, image):
        return self._ret("hipModuleLoadData", f"module{len(self.calls)}", bytes(image[:4]))

    def hipModuleGetFunction(self, module, name):
        assert isinstance(name, bytes), "kernel names go to HIP as bytes"
        return self._ret("hipModuleGetFunction", ("function", name), module, name)

    def hipModuleLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        # Read the extra array as the runtime does: BUFFER_POINTER, ptr, BUFFER_SIZE, &size, END
        words = (ctypes.c_void_p * 5).from_address(extra)
        assert (words[0], words[2], words[4]) == (1, 2, 3) and params is None
        size = ctypes.c_size_t.from_address(words[3]).value
        self.launched.append({"function": f, "grid": (gx, gy, gz), "block": (bx, by, bz),
                              "shared": shared, "kernarg": ctypes.string_at(words[1], size)})
        return self._ret("hipModuleLaunchKernel", None, f)


@pytest.fixture()
def hip():
    fake = StandInHip()
    dev = HipDevice(fake)
    yield fake, dev
    dev.close()


@pytest.fixture(scope="module")
def cos(tmp_path_factory):
    d = tmp_path_factory.mktemp("co")
    return {"gfx942": build("elementwise", d).read_bytes(),
            "gfx90a": build("elementwise", d, "gfx90a").read_bytes(),
            "lds": build("lds", d).read_bytes()}


# --------------------------------------------------------------------------- opening


def test_missing_hip_python_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "hip", None)
    with pytest.raises(BackendUnavailable, match=r"pip install 'kpair\[hip\]'"):
        open_device("hip")
    with pytest.raises(UsageError, match="unknown hip backend option"):
        open_device("hip", colour="red")


def test_no_gpu_is_backend_unavailable():
    fake = StandInHip()
    fake.fail["hipInit"] = E.hipErrorNotSupported
    with pytest.raises(BackendUnavailable, match="hipInit failed: hipErrorNotSupported"):
        HipDevice(fake)


def test_device_facts(hip):
    fake, dev = hip
    assert dev.arch() == "gfx942" and str(dev.target) == "gfx942:sramecc+:xnack-"
    assert dev.flush_bytes == 2 * (4 * MIB + 256 * MIB)    # L2 + Infinity Cache, twice
    env = dev.environment()
    assert env["device"] == "Stand-in MI300X" and env["hip_runtime_version"] == "6.2.41134"
    assert env["target_id"] == "gfx942:sramecc+:xnack-" and "runtime" in \
        env["hidden_kernel_arguments"]


# --------------------------------------------------------------------------- load and checks


@needs_llvm
def test_load_reads_the_layout_from_the_metadata(hip, cos):
    fake, dev = hip
    k = dev.load(cos["gfx942"], "axpy", fmt="hsaco")
    assert k.param_layout() == [(0, 8), (8, 8), (16, 4), (20, 4)]
    assert ("hipModuleGetFunction", k.module, b"axpy") in fake.calls
    with pytest.raises(SymbolNotFound, match="'nope'.*axpy, scale_i64"):
        dev.load(cos["gfx942"], "nope", fmt="hsaco")
    with pytest.raises(ArchitectureMismatch, match="gfx90a.*gfx942"):
        dev.load(cos["gfx90a"], "axpy", fmt="hsaco")
    with pytest.raises(ArchitectureMismatch, match="not cubin"):
        dev.load(cos["gfx942"], "axpy", fmt="cubin")
    fake.fail["hipModuleLoadData"] = E.hipErrorInvalidImage
    with pytest.raises(ArchitectureMismatch, match="hipErrorInvalidImage"):
        dev.load(cos["gfx942"], "axpy", fmt="hsaco")


def _snapshot(tmp_path, image: bytes, *, arch="gfx942", params=None, kernarg=None,
              base=0x7F12_4020_0000):
    w = SnapshotWriter(tmp_path / "snap")
    n = 64
    x = np.arange(n, dtype=np.float32)
    y = np.ones(n, dtype=np.float32)
    params = params or (Param(0, 8, "pointer", "x"), Param(8, 8, "pointer", "y"),
                        Param(16, 4, "f32", "a"), Param(20, 4, "i32", "n"))
    # the captured segment: explicit arguments, then 256 bytes of hidden ones (kept as
    # evidence, not replayed)
    kernarg = kernarg or struct.pack("<QQfi", base, base + 4096, 2.0, n) + b"\xEE" * 256
    post = 2.0 * x + y
    m = Manifest(backend="hip", arch=arch, code=CodeObject(w.put(image), "hsaco", "axpy"),
                 launch=Launch((1, 1, 1), (64, 1, 1)), kernarg=Kernarg(w.put(kernarg),
                                                                       tuple(params)),
                 regions=(Region("x", base, x.nbytes, w.put(x.tobytes()), w.put(post.tobytes()),
                                 "float32"),
                          Region("y", base + 4096, y.nbytes, w.put(y.tobytes()),
                                 w.put(y.tobytes()), "float32")),
                 environment={}, provenance={})
    return w.finish(m)


@needs_llvm
def test_replay_path_at_captured_addresses(hip, cos, tmp_path):
    fake, dev = hip
    snap = _snapshot(tmp_path, cos["gfx942"])
    replay = Replay(dev, snap)
    assert replay.info.mapping.mode == "captured" and replay.info.patched_kernarg_words == 0
    kernel = dev.load(snap.code_object(), "axpy", fmt="hsaco")
    replay.check_abi(kernel, "ref")
    base = 0x7F12_4020_0000
    # the kernel "runs": the stand-in scribbles on x, restore must undo it before each launch
    fake._at(base, 4)[:] = b"\xFF\xFF\xFF\xFF"
    out = replay.run(kernel)
    assert out["x"][:4] == np.float32(0).tobytes()          # restored pre-state
    launch = fake.launched[-1]
    assert launch["grid"] == (1, 1, 1) and launch["block"] == (64, 1, 1)
    assert launch["kernarg"] == snap.kernarg()[:24]          # explicit bytes only
    names = [c[0] for c in fake.calls]
    last = len(names) - 1 - names[::-1].index("hipModuleLaunchKernel")
    assert "hipMemcpyDtoDAsync" in names[:last]
    t = replay.time_one(kernel)
    assert t == pytest.approx(0.5e-3)
    flush = [c for c in fake.calls if c[0] == "hipMemsetD32Async"][-1]
    assert flush[3] == dev.flush_bytes // 4
    after = names[last:] + [c[0] for c in fake.calls[len(names):]]
    assert "hipEventRecord" in after and "hipEventSynchronize" in after


@needs_llvm
def test_replay_relocates_when_the_address_is_taken(hip, cos, tmp_path):
    fake, dev = hip
    base = 0x7F12_4020_0000
    fake.taken.add(base // GIB * GIB)
    snap = _snapshot(tmp_path, cos["gfx942"])
    replay = Replay(dev, snap)
    m = replay.info.mapping
    assert m.mode == "relocated" and m.delta % GIB == 0 and m.delta
    assert replay.info.patched_kernarg_words == 2
    kernel = dev.load(snap.code_object(), "axpy", fmt="hsaco")
    replay.run(kernel)
    x, y = struct.unpack_from("<QQ", fake.launched[-1]["kernarg"])
    assert (x, y) == (base + m.delta, base + 4096 + m.delta)


@needs_llvm
def test_without_virtual_memory_regions_go_to_one_malloc(cos, tmp_path):
    fake = StandInHip()
    fake.fail["hipMemAddressReserve"] = E.hipErrorNotSupported
    with HipDevice(fake) as dev:
        replay = Replay(dev, _snapshot(tmp_path, cos["gfx942"]))
        m = replay.info.mapping
        assert m.mode == "relocated" and "hipMemAddressReserve refused" in m.detail["reason"]
        assert (0x7F12_4020_0000 + m.delta) % (2 * MIB) == 0
        kernel = dev.load(replay.snapshot.code_object(), "axpy", fmt="hsaco")
        assert replay.run(kernel)["y"] == np.ones(64, np.float32).tobytes()


@needs_llvm
def test_abi_and_arch_mismatches(hip, cos, tmp_path):
    fake, dev = hip
    snap = _snapshot(tmp_path, cos["gfx942"], params=(Param(0, 8, "pointer"),
                                                      Param(8, 8, "pointer")),
                     kernarg=bytes(16))
    replay = Replay(dev, snap)
    kernel = dev.load(snap.code_object(), "axpy", fmt="hsaco")
    with pytest.raises(AbiMismatch, match="axpy"):
        replay.check_abi(kernel, "opt")
    with pytest.raises(AbiMismatch, match="24 bytes of explicit arguments"):
        dev.launch(kernel, Launch(), bytes(16), [])
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(ArchitectureMismatch, match="gfx90a"):
        Replay(dev, _snapshot(other, cos["gfx90a"], arch="gfx90a"))


@needs_llvm
def test_a_fault_names_the_error_and_close_survives_a_sticky_error(cos, tmp_path):
    fake = StandInHip()
    dev = HipDevice(fake)
    snap = _snapshot(tmp_path, cos["gfx942"])
    replay = Replay(dev, snap)
    kernel = dev.load(snap.code_object(), "axpy", fmt="hsaco")
    fake.fail["hipStreamSynchronize"] = E.hipErrorIllegalAddress
    with pytest.raises(DriverError) as e:
        dev.launch(kernel, Launch(), snap.kernarg(), [])
    assert e.value.code == "hipErrorIllegalAddress" and "axpy" in str(e.value)
    assert e.value.explanation == "explained by the stand-in"
    fake.sticky = E.hipErrorIllegalAddress            # every later call fails
    with pytest.raises(DriverError):
        replay.run(kernel)
    dev.close()                                       # does not raise
    released = {c[0] for c in fake.calls}
    assert {"hipFree", "hipMemUnmap", "hipMemRelease", "hipMemAddressFree",
            "hipModuleUnload", "hipEventDestroy", "hipStreamDestroy"} <= released
    n = len(fake.calls)
    dev.close()
    assert len(fake.calls) == n                       # a second close does nothing


@needs_llvm
def test_trust_capabilities(hip, cos, tmp_path):
    fake, dev = hip
    replay = Replay(dev, _snapshot(tmp_path, cos["gfx942"]))
    lo = 0x7F12_4020_0000
    assert dev.mapped_ranges() == [(lo, lo + 2 * MIB)]
    dev.fill(lo, 64, 0xDEADBEEF)
    assert replay.read_all()["x"][:8] == bytes.fromhex("efbeaddeefbeadde")
    dev.synchronize()
    assert fake.calls[-1][0] == "hipDeviceSynchronize"
    assert dev.measure_bandwidth(1 << 20) == pytest.approx((1 << 20) / 0.5e-3)
    assert fake.calls[-1][0] == "hipFree"


def test_kernarg_buffer_is_the_extra_array_hip_expects():
    buf = KernargBuffer(b"\x01\x02\x03")
    words = (ctypes.c_void_p * 5).from_address(buf.address)
    assert (words[0], words[2], words[4]) == (1, 2, 3)      # HIP's END is 3, not CUDA's 0
    assert ctypes.string_at(words[1], 3) == b"\x01\x02\x03"
    assert ctypes.c_size_t.from_address(words[3]).value == 3


@needs_llvm
def test_record_call_on_hip_checks_the_layout(monkeypatch, cos, tmp_path):
    from kpair.record import record_call
    from kpair.snapshot import Snapshot

    fake = StandInHip()
    monkeypatch.setitem(sys.modules, "hip", types.SimpleNamespace(hip=fake))
    co = tmp_path / "k.co"
    co.write_bytes(cos["gfx942"])
    x, y = np.arange(64, dtype=np.float32), np.ones(64, dtype=np.float32)
    # isolate=False: the stand-in for hip-python lives in this process only.
    snap = record_call(co, "axpy", [x, y, np.float32(2), np.int32(64)], tmp_path / "s",
                       backend="hip", launch=Launch((1, 1, 1), (64, 1, 1)), isolate=False)
    m = Snapshot.open(tmp_path / "s").manifest
    assert (m.backend, m.arch, m.code.format) == ("hip", "gfx942", "hsaco")
    assert [(p.offset, p.size) for p in m.kernarg.params] == [(0, 8), (8, 8), (16, 4), (20, 4)]
    assert fake.launched[-1]["kernarg"] == snap.kernarg()
    with pytest.raises(AbiMismatch, match="axpy"):   # an int64 where the kernel takes 4 bytes
        record_call(co, "axpy", [x, y, np.float32(2), np.int64(64)], tmp_path / "t",
                    backend="hip", isolate=False)


def test_reads_small_and_large_return_the_device_bytes(hip):
    """Reads go through the shared stream device: a large one lands in the returned bytes
    through a host address (hip-python takes an int for a pointer), a small one through a
    buffer; both are fresh bytes with the device's contents."""
    from kpair.backends._stream import _DIRECT_READ

    fake, dev = hip
    ptr = dev._alloc(_DIRECT_READ + 7)
    data = np.random.default_rng(5).bytes(_DIRECT_READ + 7)
    dev.write(ptr, data)
    for size in (0, 1, _DIRECT_READ - 1, _DIRECT_READ, _DIRECT_READ + 7):
        got = dev.read(ptr, size)
        assert type(got) is bytes and got == data[:size]
    dev.close()
    assert ("hipFree", ptr) in fake.calls
