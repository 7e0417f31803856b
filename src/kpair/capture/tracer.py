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

from .. import marks
from ..errors import UsageError
from . import cupti
from .cudadrv import CudaDriver
from .launches import decode_launch
from .modules import ModuleRegistry
from .names import demangle
from .ranges import MemoryOp
from .regions import BlockTable, allocator_blocks
from .session import CaptureSession, KernelInfo
from .writers import LiveBlocks, WriterLog


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
    writers: WriterLog | None = None
    live: LiveBlocks | None = None

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
        #: Who wrote each allocator block (regenerable regions, issue 48): every launch,
        #: memset and copy while a session is attached, looked up in a cached block table.
        self.writers = WriterLog()
        self.live = LiveBlocks(torch_blocks, self.writers, self.driver.address_range)

    def start(self) -> None:
        self._handle = self.cupti.subscribe(self._callback)
        self.cupti.enable(self._handle, cupti.DOMAIN_RESOURCE, cupti.CBID_MODULE_LOADED)
        for cbid in cupti.LOAD_CBIDS:
            # An older CUPTI may not know cuLibraryLoad*: kernels are then found by name.
            with contextlib.suppress(Exception):
                self.cupti.enable(self._handle, cupti.DOMAIN_DRIVER_API, cbid)
        for cbid in cupti.NVTX_CBIDS:
            # NVTX ranges (``--range``); they arrive only when NVTX loaded this CUPTI as its
            # injection library (NVTX_INJECTION64_PATH). ``kpair.mark`` works without them.
            try:
                self.cupti.enable(self._handle, cupti.DOMAIN_NVTX, cbid)
            except Exception as e:
                self.errors.append(f"NVTX callbacks unavailable ({e}): only kpair.mark "
                                   "ranges are seen")
                break
        marks.listen(self)
        atexit.register(self.stop)

    def stop(self) -> None:
        marks.listen(None)
        if self._handle is not None:
            handle, self._handle, self.session = self._handle, None, None
            with contextlib.suppress(Exception):  # at exit, nothing is left to report to
                self.cupti.unsubscribe(handle)

    def _launch_callbacks(self, on: bool, data: bool = False) -> None:
        for cbid in cupti.LAUNCH_CBIDS:
            self.cupti.enable(self._handle, cupti.DOMAIN_DRIVER_API, cbid, on)
        if data:   # a range session also records memsets and copies
            for cbid in (*cupti.DATA_CBIDS, *cupti.UNSUPPORTED_CBIDS):
                with contextlib.suppress(Exception):   # ids an older CUPTI does not know
                    self.cupti.enable(self._handle, cupti.DOMAIN_DRIVER_API, cbid, on)

    def attach(self, session: CaptureSession) -> None:
        if self._handle is None:
            raise UsageError("the capture tracer is not running")
        with self._lock:
            if self.session is not None:
                raise UsageError("another capture session is active in this process; "
                                 "sessions do not nest")
            self.session = session
        self._launch_callbacks(True, True)   # memsets and copies feed the writer log

    def detach(self, session: CaptureSession) -> None:
        with self._lock:
            if self.session is session:
                self.session = None
        if self._handle is not None:
            self._launch_callbacks(False, True)

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
                elif cbid in cupti.DATA_CBIDS or cbid in cupti.UNSUPPORTED_CBIDS:
                    self._on_data(cbid, data)
            elif domain == cupti.DOMAIN_NVTX:
                self._on_nvtx(cbid, cbdata)
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
            info = self.kernel_info(launch.function)
            session.launch_enter(launch, info, data.correlationId)
            # After the session: a dispatch's chains are the log as it was before it.
            if self.writers is not None:
                self.writers.feed(launch, info, self.live, guess=True)
        else:
            status = ctypes.c_int.from_address(data.functionReturnValue).value \
                if data.functionReturnValue else 0
            session.launch_exit(data.correlationId, status)

    # ---------------------------------------------------------------- ranges

    def _range_session(self):
        session = self.session
        return session if hasattr(session, "range_begin") else None

    def quiet_nvtx(self, on: bool) -> None:
        """``kpair.mark`` pushes its own NVTX range: its callbacks are ignored meanwhile."""
        self._tls.quiet = on

    def range_begin(self, name: str, thread: int) -> None:
        session = self._range_session()
        if session is not None:
            session.range_begin(name, thread, "mark")

    def range_end(self, name: str, thread: int, outputs, *, failed: bool = False) -> None:
        session = self._range_session()
        if session is not None:
            session.range_end(name, thread, outputs, failed=failed)

    def _on_nvtx(self, cbid: int, cbdata: int) -> None:
        session = self._range_session()
        if session is None or getattr(self._tls, "quiet", False):
            return
        data = cupti.NvtxData.from_address(cbdata)
        thread = threading.get_ident()
        if cbid == cupti.NVTX_POP:
            session.range_end(None, thread)
            return
        name = None
        if cbid == cupti.NVTX_PUSH_A and data.functionParams:
            message = ctypes.c_void_p.from_address(data.functionParams).value
            name = ctypes.string_at(message).decode(errors="replace") if message else ""
        elif cbid == cupti.NVTX_PUSH_EX and data.functionParams:
            attrs = ctypes.c_void_p.from_address(data.functionParams).value
            if attrs:
                a = cupti.NvtxEventAttributes.from_address(attrs)
                if a.messageType == cupti.NVTX_MESSAGE_ASCII and a.message:
                    name = ctypes.string_at(a.message).decode(errors="replace")
        session.range_begin(name if name is not None else "", thread, "nvtx")

    def _on_data(self, cbid: int, data: cupti.CallbackData) -> None:
        if self.session is None or data.callbackSite != cupti.API_ENTER:
            return
        session = self._range_session()
        if cbid in cupti.UNSUPPORTED_CBIDS:
            mop = MemoryOp(cupti.UNSUPPORTED_CBIDS[cbid], "unsupported")
        else:
            api, kind, element, has_stream = cupti.DATA_CBIDS[cbid]
            p = cupti.DataParams.from_address(data.functionParams)
            stream = (p.stream or 0) if has_stream else 0
            if kind == "memset":
                mop = MemoryOp(api, kind, p.dst, 0, p.count * element,
                               p.word & ((1 << 8 * element) - 1), element, stream)
            else:
                mop = MemoryOp(api, kind, p.dst, p.word, p.count, stream=stream)
        if session is not None:
            session.memory_op(mop)
        if self.writers is not None:
            feed_memory_op(self.writers, self.live, mop, self.driver.address_range)


def feed_memory_op(log: WriterLog, live: LiveBlocks, mop: MemoryOp, driver_range) -> None:
    """A memset or copy into the writer log: a memset writes its block reading nothing; a
    device-to-device copy writes its destination from its source; a host-to-device copy makes
    its destination host data; an operation kpair cannot follow (2D/3D, a graph launch) may
    have written anything."""
    kind = mop.kind
    if kind == "copy?":
        kind = {(True, True): "copy", (True, False): "htod", (False, True): "dtoh"}.get(
            (driver_range(mop.dst) is not None, driver_range(mop.src) is not None), "host")
    if kind == "unsupported":
        log.unseen()
        return
    if kind in ("dtoh", "host") or not mop.size:
        return
    dst = live.find(mop.dst)
    if dst is None:
        return
    if kind == "htod":
        log.host_write(dst.start)
    elif kind == "memset":
        log.memset(dst.start, mop.dst, mop.size, mop.value, mop.element_size)
    else:
        src = live.find(mop.src)
        if src is None:
            log.host_write(dst.start)   # from memory kpair does not know
        else:
            log.copy(dst.start, src.start, mop.dst, mop.src, mop.size)
