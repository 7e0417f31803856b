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

DOMAIN_DRIVER_API, DOMAIN_RESOURCE = 1, 3
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

