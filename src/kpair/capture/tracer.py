"""The process's one CUPTI subscriber, feeding launches to the active capture session.

Lifetime: ``Tracer.start()`` subscribes once per process (CUPTI allows one subscriber) and
from then on collects every module image the driver loads (MODULE_LOADED) and ties it to the
``CUmodule``/``CUlibrary`` handle its load call returned. Launch callbacks are switched on
only while a ``CaptureSession`` is attached, so a process between captures pays nothing per
launch. The subscription lasts until interpreter exit (``atexit``), because code objects
loaded while no session is attached are still needed by later sessions.

Every callback swallows its own exceptions after recording them: a bug in capture must not
become a crash of the captured program.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import platform
import sys
import threading

from ..errors import UsageError
from . import cupti
from .cudadrv import CudaDriver
from .launches import decode_launch
from .modules import ModuleRegistry
from .names import demangle
from .regions import BlockTable, allocator_blocks
from .session import CaptureSession, KernelInfo


def torch_blocks() -> BlockTable:
    """The PyTorch caching allocator's blocks, when PyTorch has initialised CUDA here."""
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return BlockTable()
        return BlockTable(allocator_blocks(torch.cuda.memory._snapshot()))
    except Exception:  # an allocator without the snapshot API: the driver's ranges remain
        return BlockTable()


def software_environment() -> dict:
    """Versions of what launched the kernels, and the SM/memory clocks now (NVML)."""
    env: dict = {"python": platform.python_version(), "host": platform.node()}
    torch = sys.modules.get("torch")
    if torch is not None:
        env["torch"] = getattr(torch, "__version__", "?")
        env["torch_cuda"] = getattr(getattr(torch, "version", None), "cuda", None)
    triton = sys.modules.get("triton")
    if triton is not None:
        env["triton"] = getattr(triton, "__version__", "?")
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        env["clocks_mhz"] = {
            "sm": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            "memory": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
            "sm_max": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)}
        env["driver_version"] = pynvml.nvmlSystemGetDriverVersion()
    except Exception:  # NVML is optional: the driver's own attributes are recorded anyway
        pass
    return env


class Tracer:
    def __init__(self, cupti_path: str | None = None):
        self.driver = CudaDriver()
        version = self.driver.driver_version()
        path = cupti_path or cupti.find_cupti(version // 1000 if version else None)
        self.cupti = cupti.Cupti(path)
        self.registry = ModuleRegistry()
        self.session: CaptureSession | None = None
        self.errors: list[str] = []
        self._kernels: dict[int, KernelInfo] = {}
        self._tls = threading.local()
        self._lock = threading.RLock()
        self._handle: int | None = None
        self._callback = cupti.CallbackFunc(self._on_callback)  # kept alive: C holds it

    def start(self) -> None:
        self._handle = self.cupti.subscribe(self._callback)
        self.cupti.enable(self._handle, cupti.DOMAIN_RESOURCE, cupti.CBID_MODULE_LOADED)
        for cbid in cupti.LOAD_CBIDS:
            # An older CUPTI may not know cuLibraryLoad*: kernels are then found by name.
            with contextlib.suppress(Exception):
                self.cupti.enable(self._handle, cupti.DOMAIN_DRIVER_API, cbid)
        atexit.register(self.stop)

    def stop(self) -> None:
        if self._handle is not None:
            handle, self._handle, self.session = self._handle, None, None
            with contextlib.suppress(Exception):  # at exit, nothing is left to report to
                self.cupti.unsubscribe(handle)

    def _launch_callbacks(self, on: bool) -> None:
        for cbid in cupti.LAUNCH_CBIDS:
            self.cupti.enable(self._handle, cupti.DOMAIN_DRIVER_API, cbid, on)

    def attach(self, session: CaptureSession) -> None:
        if self._handle is None:
            raise UsageError("the capture tracer is not running")
        with self._lock:
            if self.session is not None:
                raise UsageError("another capture session is active in this process; "
                                 "sessions do not nest")
            self.session = session
        self._launch_callbacks(True)

    def detach(self, session: CaptureSession) -> None:
        with self._lock:
            if self.session is session:
                self.session = None
        if self._handle is not None:
            self._launch_callbacks(False)

    # ---------------------------------------------------------------- callbacks

    def kernel_info(self, handle: int) -> KernelInfo:
        info = self._kernels.get(handle)
        if info is None:
            d = self.driver
            name, kind = d.function_name(handle)
            layout, how = d.param_layout(handle, kernel_first=(kind == "kernel"))
            module = d.function_module(handle)
            library = d.kernel_library(handle) if module is None else None
            name = name or f"unknown_function_{handle:x}"
            info = KernelInfo(handle, name, demangle(name), layout, how, (module, library))
            self._kernels[handle] = info
        return info

    def _on_callback(self, userdata, domain, cbid, cbdata) -> None:
        try:
            if domain == cupti.DOMAIN_RESOURCE and cbid == cupti.CBID_MODULE_LOADED:
                self._on_module(cbdata)
            elif domain == cupti.DOMAIN_DRIVER_API:
                data = cupti.CallbackData.from_address(cbdata)
                if cbid in cupti.LAUNCH_CBIDS:
                    self._on_launch(cbid, data)
                elif cbid in cupti.LOAD_CBIDS:
                    self._on_load(data)
        except Exception as e:  # never let an exception unwind into the driver
            if len(self.errors) < 100:
                self.errors.append(f"callback {domain}/{cbid}: {e!r}")
                print(f"kpair capture: internal error in a CUPTI callback: {e!r}",
                      file=sys.stderr)

    def _on_module(self, cbdata: int) -> None:
        res = cupti.ResourceData.from_address(cbdata)
        if not res.resourceDescriptor:
            return
        mod = cupti.ModuleResourceData.from_address(res.resourceDescriptor)
        if not (mod.pCubin and mod.cubinSize):
            return
        image = ctypes.string_at(mod.pCubin, mod.cubinSize)
        self.registry.add(mod.moduleId, image)
        loading = getattr(self._tls, "loading", None)
        if loading is not None:
            loading.append(mod.moduleId)

    def _on_load(self, data: cupti.CallbackData) -> None:
        if data.callbackSite == cupti.API_ENTER:
            self._tls.loading = []
            return
        ids, self._tls.loading = getattr(self._tls, "loading", None) or [], None
        status = ctypes.c_int.from_address(data.functionReturnValue).value \
            if data.functionReturnValue else 0
        out = ctypes.c_void_p.from_address(data.functionParams).value  # CUmodule* / CUlibrary*
        if status or not out or not ids:
            return
        handle = ctypes.c_void_p.from_address(out).value
        if handle:
            for mid in ids:
                self.registry.bind(handle, mid)

    def _on_launch(self, cbid: int, data: cupti.CallbackData) -> None:
        session = self.session
        if session is None:
            return
        if data.callbackSite == cupti.API_ENTER:
            launch = decode_launch(cbid, data.functionParams)
            session.launch_enter(launch, self.kernel_info(launch.function),
                                 data.correlationId)
        else:
            status = ctypes.c_int.from_address(data.functionReturnValue).value \
                if data.functionReturnValue else 0
            session.launch_exit(data.correlationId, status)
