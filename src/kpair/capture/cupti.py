"""CUPTI's Callback API through ctypes: finding libcupti, the C structs, one subscriber.

Why ctypes and not cupti-python: its callback data hands ``p_cubin`` over as a string cut at
the first NUL byte, and a cubin is full of them; here the raw pointer is read instead.

CUPTI allows one subscriber per process (a profiler such as Nsight or compute-sanitizer is
one). Callback data is valid only inside the callback: everything is copied out there.
The struct layouts below are those of CUDA 13's ``cupti_callbacks.h`` and
``generated_cuda_meta.h`` (checked by tests against offsets taken from those headers).
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import subprocess
import sys
from collections.abc import Iterable

from ..errors import BackendUnavailable, DriverError

DOMAIN_DRIVER_API, DOMAIN_RESOURCE, DOMAIN_NVTX = 1, 3, 5
API_ENTER, API_EXIT = 0, 1
CBID_MODULE_LOADED = 6

#: Driver API callback ids of the launches that are captured.
LAUNCH_CBIDS = {
    307: "cuLaunchKernel", 442: "cuLaunchKernel_ptsz",
    652: "cuLaunchKernelEx", 653: "cuLaunchKernelEx_ptsz",
    477: "cuLaunchCooperativeKernel", 478: "cuLaunchCooperativeKernel_ptsz",
}
#: Loads whose first parameter is the ``CUmodule*`` / ``CUlibrary*`` they fill in: watching
#: them ties the module images that MODULE_LOADED delivers to the handles launches use.
LOAD_CBIDS = {
    18: "cuModuleLoad", 19: "cuModuleLoadData", 20: "cuModuleLoadDataEx",
    21: "cuModuleLoadFatBinary", 678: "cuLibraryLoadData", 679: "cuLibraryLoadFromFile",
}

#: NVTX callback ids (``cupti_nvtx_cbid.h``): the default domain's push/pop ranges, which
#: ``torch.cuda.nvtx.range`` uses. They arrive only when libnvToolsExt/NVTX3 loaded CUPTI as
#: its injection library (``NVTX_INJECTION64_PATH``; ``kpair.capture.install`` sets it).
NVTX_PUSH_A, NVTX_PUSH_EX, NVTX_POP = 8, 10, 11
NVTX_CBIDS = {NVTX_PUSH_A: "nvtxRangePushA", NVTX_PUSH_EX: "nvtxRangePushEx",
              NVTX_POP: "nvtxRangePop"}

#: Driver API memsets and copies a range capture watches: cbid → (API, kind, element size,
#: whether the params end with a stream). Every 64-bit 1D memset and copy variant (_v2, the
#: async memsets, per-thread _ptds/_ptsz) has the same parameter struct: (dst, value | src,
#: size[, stream]). The legacy entry points of 32-bit device pointers (cuMemsetD8,
#: cuMemcpyDtoD, ... without _v2; cuda.h redirects every call away from them) are refused.
#: Kinds: memset, copy (device to device), copy? (unified: the session asks which side is
#: device memory), htod and dtoh (only said; a host-to-device copy refuses the range).
DATA_CBIDS: dict[int, tuple[str, str, int, bool]] = {
    249: ("cuMemsetD8_v2", "memset", 1, False), 250: ("cuMemsetD16_v2", "memset", 2, False),
    251: ("cuMemsetD32_v2", "memset", 4, False),
    411: ("cuMemsetD8_v2_ptds", "memset", 1, False),
    412: ("cuMemsetD16_v2_ptds", "memset", 2, False),
    413: ("cuMemsetD32_v2_ptds", "memset", 4, False),
    216: ("cuMemsetD8Async", "memset", 1, True), 218: ("cuMemsetD16Async", "memset", 2, True),
    220: ("cuMemsetD32Async", "memset", 4, True),
    428: ("cuMemsetD8Async_ptsz", "memset", 1, True),
    429: ("cuMemsetD16Async_ptsz", "memset", 2, True),
    430: ("cuMemsetD32Async_ptsz", "memset", 4, True),
    280: ("cuMemcpyDtoD_v2", "copy", 1, False),
    399: ("cuMemcpyDtoD_v2_ptds", "copy", 1, False),
    281: ("cuMemcpyDtoDAsync_v2", "copy", 1, True),
    423: ("cuMemcpyDtoDAsync_v2_ptsz", "copy", 1, True),
    305: ("cuMemcpy", "copy?", 1, False), 408: ("cuMemcpy_ptds", "copy?", 1, False),
    306: ("cuMemcpyAsync", "copy?", 1, True), 418: ("cuMemcpyAsync_ptsz", "copy?", 1, True),
    276: ("cuMemcpyHtoD_v2", "htod", 1, False),
    397: ("cuMemcpyHtoD_v2_ptds", "htod", 1, False),
    277: ("cuMemcpyHtoDAsync_v2", "htod", 1, True),
    421: ("cuMemcpyHtoDAsync_v2_ptsz", "htod", 1, True),
}
#: Operations a range snapshot cannot hold: seeing one refuses the range, naming it.
UNSUPPORTED_CBIDS = {
    71: "cuMemsetD8 (32-bit legacy)", 73: "cuMemsetD16 (32-bit legacy)",
    75: "cuMemsetD32 (32-bit legacy)", 43: "cuMemcpyHtoD (32-bit legacy)",
    47: "cuMemcpyDtoD (32-bit legacy)", 60: "cuMemcpyHtoDAsync (32-bit legacy)",
    64: "cuMemcpyDtoDAsync (32-bit legacy)",
    56: "cuMemcpy2D", 57: "cuMemcpy2DUnaligned", 58: "cuMemcpy3D", 68: "cuMemcpy2DAsync",
    69: "cuMemcpy3DAsync", 287: "cuMemcpy2D_v2", 288: "cuMemcpy2DUnaligned_v2",
    289: "cuMemcpy2DAsync_v2", 290: "cuMemcpy3D_v2", 291: "cuMemcpy3DAsync_v2",
    318: "cuMemcpyPeer", 319: "cuMemcpyPeerAsync", 320: "cuMemcpy3DPeer",
    321: "cuMemcpy3DPeerAsync", 405: "cuMemcpy2D_v2_ptds", 406: "cuMemcpy2DUnaligned_v2_ptds",
    407: "cuMemcpy3D_v2_ptds", 409: "cuMemcpyPeer_ptds", 410: "cuMemcpy3DPeer_ptds",
    424: "cuMemcpy2DAsync_v2_ptsz", 425: "cuMemcpy3DAsync_v2_ptsz",
    426: "cuMemcpyPeerAsync_ptsz", 427: "cuMemcpy3DPeerAsync_ptsz",
    77: "cuMemsetD2D8", 79: "cuMemsetD2D16", 81: "cuMemsetD2D32", 222: "cuMemsetD2D8Async",
    224: "cuMemsetD2D16Async", 226: "cuMemsetD2D32Async", 252: "cuMemsetD2D8_v2",
    253: "cuMemsetD2D16_v2", 254: "cuMemsetD2D32_v2", 414: "cuMemsetD2D8_v2_ptds",
    415: "cuMemsetD2D16_v2_ptds", 416: "cuMemsetD2D32_v2_ptds",
    431: "cuMemsetD2D8Async_ptsz", 432: "cuMemsetD2D16Async_ptsz",
    433: "cuMemsetD2D32Async_ptsz", 514: "cuGraphLaunch", 515: "cuGraphLaunch_ptsz",
    776: "cuMemcpyBatchAsync", 777: "cuMemcpyBatchAsync_ptsz", 778: "cuMemcpy3DBatchAsync",
    779: "cuMemcpy3DBatchAsync_ptsz", 796: "cuMemcpyBatchAsync_v2",
    797: "cuMemcpyBatchAsync_v2_ptsz", 798: "cuMemcpy3DBatchAsync_v2",
    799: "cuMemcpy3DBatchAsync_v2_ptsz",
}

INSTALL_HINT = ("pip install nvidia-cuda-cupti   (CUDA 13; for CUDA 12: "
                "pip install nvidia-cuda-cupti-cu12), or set KPAIR_CUPTI_LIB=/path/to/libcupti.so")

_RESULTS = {1: "CUPTI_ERROR_INVALID_PARAMETER", 15: "CUPTI_ERROR_NOT_INITIALIZED",
            17: "CUPTI_ERROR_NOT_COMPATIBLE", 35: "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES",
            39: "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"}
_EXPLAIN = {39: "another CUPTI subscriber is active in this process (Nsight Systems or Compute, "
                "compute-sanitizer, torch.profiler): capture must be the only one",
            17: "this libcupti does not match the installed driver; install the CUPTI of the "
                "driver's CUDA version"}


class CallbackData(ctypes.Structure):
    """``CUpti_CallbackData``: what a DRIVER_API callback receives."""

    _fields_ = [("callbackSite", ctypes.c_int), ("functionName", ctypes.c_char_p),
                ("functionParams", ctypes.c_void_p), ("functionReturnValue", ctypes.c_void_p),
                ("symbolName", ctypes.c_char_p), ("context", ctypes.c_void_p),
                ("contextUid", ctypes.c_uint32), ("correlationData", ctypes.c_void_p),
                ("correlationId", ctypes.c_uint32)]


class ResourceData(ctypes.Structure):
    """``CUpti_ResourceData``: what a RESOURCE callback receives."""

    _fields_ = [("context", ctypes.c_void_p), ("resourceHandle", ctypes.c_void_p),
                ("resourceDescriptor", ctypes.c_void_p)]


class ModuleResourceData(ctypes.Structure):
    """``CUpti_ModuleResourceData``: the image of a module just loaded (MODULE_LOADED)."""

    _fields_ = [("moduleId", ctypes.c_uint32), ("cubinSize", ctypes.c_size_t),
                ("pCubin", ctypes.c_void_p)]


class NvtxData(ctypes.Structure):
    """``CUpti_NvtxData``: what an NVTX callback receives."""

    _fields_ = [("functionName", ctypes.c_char_p), ("functionParams", ctypes.c_void_p),
                ("functionReturnValue", ctypes.c_void_p)]


class NvtxEventAttributes(ctypes.Structure):
    """``nvtxEventAttributes_v2`` up to its message (``nvtxRangePushEx``'s argument)."""

    _fields_ = [("version", ctypes.c_uint16), ("size", ctypes.c_uint16),
                ("category", ctypes.c_uint32), ("colorType", ctypes.c_int32),
                ("color", ctypes.c_uint32), ("payloadType", ctypes.c_int32),
                ("reserved0", ctypes.c_int32), ("payload", ctypes.c_uint64),
                ("messageType", ctypes.c_int32), ("message", ctypes.c_void_p)]


NVTX_MESSAGE_ASCII = 1


class DataParams(ctypes.Structure):
    """The common shape of every 1D memset/copy ``*_params`` struct: ``cuMemsetD32Async``'s
    (dst, value, N, stream) and ``cuMemcpyDtoDAsync_v2``'s (dst, src, bytes, stream) alike;
    ``word`` is the value (its low 1, 2 or 4 bytes) or the source."""

    _fields_ = [("dst", ctypes.c_uint64), ("word", ctypes.c_uint64),
                ("count", ctypes.c_size_t), ("stream", ctypes.c_void_p)]


class LaunchKernelParams(ctypes.Structure):
    """``cuLaunchKernel_params`` (and the first fields of the cooperative variant)."""

    _fields_ = [("f", ctypes.c_void_p),
                ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint),
                ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("kernelParams", ctypes.c_void_p), ("extra", ctypes.c_void_p)]


class LaunchCooperativeParams(ctypes.Structure):
    """``cuLaunchCooperativeKernel_params``: cuLaunchKernel's without ``extra``."""

    _fields_ = LaunchKernelParams._fields_[:-1]


class LaunchKernelExParams(ctypes.Structure):
    """``cuLaunchKernelEx_params``."""

    _fields_ = [("config", ctypes.c_void_p), ("f", ctypes.c_void_p),
                ("kernelParams", ctypes.c_void_p), ("extra", ctypes.c_void_p)]


class LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig``."""

    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint),
                ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.c_void_p), ("numAttrs", ctypes.c_uint)]


class LaunchAttributeEntry(ctypes.Structure):
    """``CUlaunchAttribute``: a 4-byte id, 4 bytes of padding, a 64-byte value union."""

    _fields_ = [("id", ctypes.c_uint32), ("pad", ctypes.c_uint8 * 4),
                ("value", ctypes.c_uint8 * 64)]


CallbackFunc = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32,
                                ctypes.c_void_p)


# ---------------------------------------------------------------- finding the library

def _loaded_in_process() -> list[str]:
    """libcupti files already mapped into this process (torch's kineto may have one)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libcupti.so" in line}
    except OSError:
        return []
    return sorted(p for p in paths if os.path.isfile(p))


def candidate_paths(environ: dict | None = None, sys_path: Iterable[str] | None = None,
                    ldconfig: str | None = None) -> list[str]:
    """Every libcupti this process could load, best first, without loading any.

    Order: ``KPAIR_CUPTI_LIB``; one already loaded here; the ``nvidia-cuda-cupti`` wheel
    (``nvidia/cu13/lib``, ``nvidia/cuda_cupti/lib``) on ``sys.path``; ``CUDA_HOME`` /
    ``CUDA_PATH`` / ``/usr/local/cuda`` (``extras/CUPTI/lib64``, ``lib64``, ``lib``); ldconfig.
    """
    env = os.environ if environ is None else environ
    found: list[str] = []
    explicit = env.get("KPAIR_CUPTI_LIB")
    if explicit:
        found.append(explicit)
    if environ is None:
        found += _loaded_in_process()
    for entry in sys.path if sys_path is None else sys_path:
        for sub in ("nvidia/cu[0-9]*/lib", "nvidia/cuda_cupti/lib"):
            found += sorted(glob.glob(os.path.join(entry or ".", sub, "libcupti.so*")),
                            reverse=True)
    homes = [env.get("CUDA_HOME"), env.get("CUDA_PATH"), "/usr/local/cuda"]
    for home in filter(None, homes):
        for sub in ("extras/CUPTI/lib64", "lib64", "lib", "targets/x86_64-linux/lib"):
            found += sorted(glob.glob(os.path.join(home, sub, "libcupti.so*")), reverse=True)
    if ldconfig is None:
        try:
            ldconfig = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True,
                                      timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            ldconfig = ""
    found += re.findall(r"libcupti\.so[.\d]*\s.*=>\s*(\S+)", ldconfig)
    unique, seen = [], set()
    for path in found:
        if path not in seen and (path == explicit or os.path.isfile(path)):
            seen.add(path)
            unique.append(path)
    return unique


def soname_major(path: str) -> int | None:
    m = re.search(r"libcupti\.so\.(\d+)", os.path.basename(path))
    return int(m.group(1)) if m else None


def choose(paths: list[str], driver_major: int | None) -> list[str]:
    """``paths`` reordered so a CUPTI the driver can serve comes first.

    A libcupti newer than the driver's CUDA version fails to initialise; one of exactly the
    driver's major version is preferred, an older one next, an unversioned name after that.
    """
    if driver_major is None:
        return list(paths)

    def rank(item: tuple[int, str]) -> tuple[int, int]:
        index, path = item
        major = soname_major(path)
        if major == driver_major:
            return (0, index)
        if major is None:
            return (2, index)
        return (1, index) if major < driver_major else (3, index)

    return [p for _, p in sorted(enumerate(paths), key=rank)]


def find_cupti(driver_major: int | None = None) -> str:
    """The path of the libcupti to load, or BackendUnavailable with the install command."""
    paths = choose(candidate_paths(), driver_major)
    if not paths:
        raise BackendUnavailable(
            "CUPTI (libcupti.so) was not found: kpair capture needs NVIDIA's CUPTI library "
            f"to see kernel launches. Install it: {INSTALL_HINT}")
    return paths[0]


# ---------------------------------------------------------------- the library

class Cupti:
    """The few CUPTI calls capture makes; every failure becomes a DriverError with its name."""

    def __init__(self, path: str):
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise BackendUnavailable(f"cannot load CUPTI from {path} ({e}). "
                                     f"Install it: {INSTALL_HINT}") from None
        self.path, self.lib = path, lib
        lib.cuptiSubscribe.argtypes = [ctypes.POINTER(ctypes.c_void_p), CallbackFunc,
                                       ctypes.c_void_p]
        lib.cuptiUnsubscribe.argtypes = [ctypes.c_void_p]
        lib.cuptiEnableCallback.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_int,
                                            ctypes.c_uint32]
        lib.cuptiGetResultString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        for name in ("cuptiSubscribe", "cuptiUnsubscribe", "cuptiEnableCallback",
                     "cuptiGetResultString"):
            getattr(lib, name).restype = ctypes.c_int

    def check(self, call: str, code: int) -> None:
        if code == 0:
            return
        text = ctypes.c_char_p()
        name = _RESULTS.get(code)
        if name is None and self.lib.cuptiGetResultString(code, ctypes.byref(text)) == 0:
            name = (text.value or b"").decode(errors="replace")
        raise DriverError(call, name or f"CUPTI error {code}", _EXPLAIN.get(code, ""))

    def subscribe(self, callback) -> int:
        handle = ctypes.c_void_p()
        self.check("cuptiSubscribe", self.lib.cuptiSubscribe(ctypes.byref(handle), callback,
                                                               None))
        return handle.value

    def enable(self, handle: int, domain: int, cbid: int, on: bool = True) -> None:
        self.check("cuptiEnableCallback",
                   self.lib.cuptiEnableCallback(int(on), handle, domain, cbid))

    def unsubscribe(self, handle: int) -> None:
        self.check("cuptiUnsubscribe", self.lib.cuptiUnsubscribe(handle))

