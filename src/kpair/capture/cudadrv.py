"""The CUDA driver calls capture makes from inside CUPTI callbacks, through ctypes.

Why ctypes and not cuda-bindings: these calls run inside the launch callbacks of someone
else's program, on raw pointers CUPTI hands over; a thin ``libcuda.so.1`` binding keeps that
path free of object wrapping and of a dependency the captured program may not have.

Versioned entry points are named explicitly (``cuMemcpyDtoH_v2``): the unversioned symbols in
libcuda are the legacy 32-bit ones that ``cuda.h`` redirects away from.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, byref, c_char_p, c_int, c_size_t, c_uint64, c_void_p

from ..errors import BackendUnavailable, DriverError

CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE = 0, 1
_ATTR = {"clock_khz": 13, "sm_count": 16, "memory_clock_khz": 36, "l2_bytes": 38,
         "cc_major": 75, "cc_minor": 76}
_RANGE_START, _RANGE_SIZE = 11, 12


class CudaDriver:
    """``libcuda.so.1`` opened for capture. Handles are plain ints (addresses)."""

    def __init__(self, path: str | None = None):
        names = [path] if path else ["libcuda.so.1", "libcuda.so"]
        for name in names:
            try:
                self.lib = ctypes.CDLL(name)
                break
            except OSError:
                continue
        else:
            raise BackendUnavailable("the NVIDIA driver library (libcuda.so.1) cannot be "
                                     "loaded: capture needs a machine with an NVIDIA GPU "
                                     "and its driver")
        self._fns: dict[str, object] = {}

    def _fn(self, name: str, argtypes: list):
        fn = self._fns.get(name)
        if fn is None:
            fn = getattr(self.lib, name, None)  # newer entry points may be absent
            if fn is not None:
                fn.argtypes, fn.restype = argtypes, c_int
            self._fns[name] = fn or False
        return fn or None

    def error_name(self, code: int) -> str:
        text = c_char_p()
        fn = self._fn("cuGetErrorName", [c_int, POINTER(c_char_p)])
        if fn and fn(code, byref(text)) == 0 and text.value:
            return text.value.decode()
        return f"CUresult {code}"

    def check(self, call: str, code: int, context: str = "") -> None:
        if code != CUDA_SUCCESS:
            raise DriverError(call + context, self.error_name(code))

    # ---------------------------------------------------------------- memory

    def synchronize(self) -> int:
        """cuCtxSynchronize; returns the CUresult (a kernel fault shows up here)."""
        return self._fn("cuCtxSynchronize", [])()

    def read(self, address: int, size: int) -> bytearray:
        out = bytearray(size)
        if size:
            buf = (ctypes.c_char * size).from_buffer(out)
            fn = self._fn("cuMemcpyDtoH_v2", [c_void_p, c_uint64, c_size_t])
            self.check("cuMemcpyDtoH", fn(buf, address, size), f" ({size} bytes at {address:#x})")
        return out

    def address_range(self, pointer: int) -> tuple[int, int] | None:
        """(base, size) of the device allocation holding ``pointer``, or None if it is none.

        ``cuMemGetAddressRange`` gives the mapped allocation, also for virtual-memory
        (expandable) segments, where the pointer attribute range would be the whole
        reservation; the attribute is the fallback.
        """
        base, size = c_uint64(), c_size_t()
        fn = self._fn("cuMemGetAddressRange_v2", [POINTER(c_uint64), POINTER(c_size_t),
                                                  c_uint64])
        if fn and fn(byref(base), byref(size), pointer) == 0 and size.value:
            return base.value, size.value
        attr = self._fn("cuPointerGetAttribute", [c_void_p, c_int, c_uint64])
        start, length = c_uint64(), c_size_t()
        if attr and attr(byref(start), _RANGE_START, pointer) == 0 and \
                attr(byref(length), _RANGE_SIZE, pointer) == 0 and length.value:
            return start.value, length.value
        return None

    def stream_capturing(self, stream: int) -> bool:
        status = c_int()
        fn = self._fn("cuStreamIsCapturing", [c_void_p, POINTER(c_int)])
        return bool(fn and fn(stream, byref(status)) == 0 and status.value != 0)

    # ---------------------------------------------------------------- kernels

    def function_name(self, handle: int) -> tuple[str | None, str]:
        """The kernel's (mangled) name and which call gave it: PyTorch's kernels arrive as
        CUkernel handles cast to CUfunction, so cuKernelGetName is the fallback."""
        name = c_char_p()
        for call, kind in (("cuFuncGetName", "function"), ("cuKernelGetName", "kernel")):
            fn = self._fn(call, [POINTER(c_char_p), c_void_p])
            if fn and fn(byref(name), handle) == 0 and name.value:
                return name.value.decode(errors="replace"), kind
        return None, "unknown"

    def _layout(self, call: str, handle: int) -> tuple[int, list[tuple[int, int]]]:
        fn = self._fn(call, [c_void_p, c_size_t, POINTER(c_size_t), POINTER(c_size_t)])
        if fn is None:
            return -1, []
        layout, offset, size = [], c_size_t(), c_size_t()
        for i in range(4096):
            code = fn(handle, i, byref(offset), byref(size))
            if code != CUDA_SUCCESS:
                return (CUDA_SUCCESS if i else code), layout
            layout.append((offset.value, size.value))
        return CUDA_SUCCESS, layout

    def param_layout(self, handle: int, *, kernel_first: bool = False
                     ) -> tuple[list[tuple[int, int]] | None, str]:
        """[(offset, size)] per parameter and the call that gave it, or (None, reason).

        A kernel without parameters and a handle of the other kind both fail at index 0, so
        when one call fails the other is asked too. ``kernel_first`` for handles whose name
        only cuKernelGetName knew (CUkernel handles cast to CUfunction).
        """
        calls = ["cuFuncGetParamInfo", "cuKernelGetParamInfo"]
        if kernel_first:
            calls.reverse()
        codes = []
        for call in calls:
            code, layout = self._layout(call, handle)
            if code == CUDA_SUCCESS and layout:
                return layout, call
            codes.append(code)
        if CUDA_ERROR_INVALID_VALUE in codes:
            return [], "no parameters"
        return None, "; ".join(f"{c} failed ({self.error_name(code)})"
                               for c, code in zip(calls, codes, strict=True))

    def function_module(self, handle: int) -> int | None:
        out = c_void_p()
        fn = self._fn("cuFuncGetModule", [POINTER(c_void_p), c_void_p])
        return out.value if fn and fn(byref(out), handle) == 0 and out.value else None

    def kernel_library(self, handle: int) -> int | None:
        out = c_void_p()
        fn = self._fn("cuKernelGetLibrary", [POINTER(c_void_p), c_void_p])
        return out.value if fn and fn(byref(out), handle) == 0 and out.value else None

    # ---------------------------------------------------------------- environment

    def driver_version(self) -> int | None:
        v = c_int()
        fn = self._fn("cuDriverGetVersion", [POINTER(c_int)])
        return v.value if fn and fn(byref(v)) == 0 else None

    def current_device(self) -> int | None:
        dev = c_int()
        fn = self._fn("cuCtxGetDevice", [POINTER(c_int)])
        return dev.value if fn and fn(byref(dev)) == 0 else None

    def device_facts(self, device: int) -> dict:
        """Name, architecture, SM count, clocks and memory of ``device`` (CUdevice ordinal)."""
        facts: dict = {"ordinal": device}
        attr = self._fn("cuDeviceGetAttribute", [POINTER(c_int), c_int, c_int])
        value = c_int()
        for key, code in _ATTR.items():
            if attr and attr(byref(value), code, device) == 0:
                facts[key] = value.value
        buf = ctypes.create_string_buffer(256)
        fn = self._fn("cuDeviceGetName", [c_char_p, c_int, c_int])
        if fn and fn(buf, 256, device) == 0:
            facts["name"] = buf.value.decode(errors="replace")
        fn = self._fn("cuDeviceGetPCIBusId", [c_char_p, c_int, c_int])
        if fn and fn(buf, 256, device) == 0:
            facts["pci_bus_id"] = buf.value.decode(errors="replace")
        total = c_size_t()
        fn = self._fn("cuDeviceTotalMem_v2", [POINTER(c_size_t), c_int])
        if fn and fn(byref(total), device) == 0:
            facts["total_memory_bytes"] = total.value
        version = self.driver_version()
        if version:
            facts["driver_cuda_version"] = f"{version // 1000}.{version % 1000 // 10}"
        if "cc_major" in facts and "cc_minor" in facts:
            major, minor = facts.pop("cc_major"), facts.pop("cc_minor")
            facts["compute_capability"] = f"{major}.{minor}"
            facts["arch"] = f"sm_{major}{minor}"
        return facts
