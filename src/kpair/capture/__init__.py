"""Capture real CUDA kernel dispatches of a running program into snapshots (through CUPTI).

Two ways in:

- ``kpair capture -o DIR [--kernel REGEX] [--nth N] [--max K] -- python prog.py ARGS...``
  runs an unmodified program with capture installed before it starts (``kpair.capture.program``);
- inside a program: ``kpair.capture.install()`` before CUDA initialises, then
  ``with kpair.capture.capture("out", kernel=r"softmax", max=2) as session: ...``.

Ranges: ``kpair capture --range NAME -o DIR -- python prog.py`` (or
``start_range_session(DIR, [NAME])`` ... ``finish_session``) captures everything between an
NVTX push of NAME and its pop (``torch.cuda.nvtx.range``), or a ``kpair.mark(NAME)`` block,
as one range snapshot (``kpair.capture.ranges``).

Which dispatches are worth capturing: ``kpair profile -- python prog.py`` (or
``profile_program(command)``) times every kernel of a run through CUPTI's activity records;
``kpair capture --top K`` (or ``top_kernels(command, k)`` and ``names=``) takes the first
dispatch of each of the K kernels with the most GPU time.

Main abstractions: ``Tracer`` (the process's one CUPTI subscriber: module images, launch
callbacks), ``CaptureSession`` (filter, snapshots, ``capture.json``), ``ModuleRegistry``
(which code object holds a kernel) and the region planner (kernarg pointers narrowed to
allocator blocks). Importing this package loads no driver library; ``install`` does.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator

from ..formats import convert
from .filters import Filter
from .session import DEFAULT_MAX_REGION_BYTES, SUMMARY, CaptureSession
from .summary import ProfileUse
from .triton_meta import triton_metadata

_tracer = None
#: Loaded on first use: ``python -m kpair.capture.profiler`` (the profiled child) must not
#: find its own module already imported by this package.
_PROFILER = ("KernelProfiler", "profile_program", "run_profile", "top_kernels")


def __getattr__(name: str):
    if name in _PROFILER:
        from . import profiler

        return getattr(profiler, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def install(*, cupti_path: str | None = None):
    """Start this process's capture tracer (once); returns it.

    Code objects are only seen as they load, so call this before the first CUDA call. It asks
    for eager module loading (``CUDA_MODULE_LOADING=EAGER``) unless the variable is already
    set: eager loading reports every module at load time. Lazy loading is much cheaper, but
    an earlier probe saw it never report the modules of cudart's kernels (PyTorch's own);
    a CUDA 13 driver did report one (docs/evidence/capture.md), not yet a whole model.
    """
    global _tracer
    if _tracer is None:
        from .tracer import Tracer  # lazy: importing kpair.capture sets up no tracer

        os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            warnings.warn("kpair.capture.install() after CUDA was initialised: code objects "
                          "loaded before now are unknown, so their kernels cannot be captured",
                          stacklevel=2)
        tracer = Tracer(cupti_path)
        tracer.start()
        _tracer = tracer
    return _tracer


def start_session(out: str | os.PathLike, *, kernel: str | None = None, nth: int = 1,
                  max: int | None = None, distinct: bool = False,
                  max_region_bytes: int = DEFAULT_MAX_REGION_BYTES,
                  command: list[str] | None = None, names: list[str] | None = None,
                  profile: dict | ProfileUse | None = None,
                  store_bytes: bool = False,
                  post_digest_over: int | None = None) -> CaptureSession:
    """Open a session writing into ``out`` and attach it to the tracer (``install`` first).

    ``names`` restricts capture to kernels of those exact names (mangled or demangled);
    ``profile`` is what capture.json records about the profile they came from;
    ``store_bytes``: every region's pre-state as bytes (no regenerable chains);
    ``post_digest_over``: a written region larger than this keeps its post-state as digests
    only (None: bytes)."""
    from .tracer import software_environment, torch_blocks  # lazy, as install's Tracer

    if isinstance(profile, dict):
        profile = convert(profile, ProfileUse, field="profile")
    filter = Filter(kernel, nth, max, distinct, names)
    tracer = install()
    session = CaptureSession(out, filter, driver=tracer.driver, profile=profile,
                             registry=tracer.registry, blocks=torch_blocks,
                             max_region_bytes=max_region_bytes, command=command,
                             environment=software_environment, metadata=triton_metadata,
                             writers=tracer.writers, store_bytes=store_bytes)
    session.post_digest_over = post_digest_over
    tracer.attach(session)
    return session


def start_range_session(out: str | os.PathLike, ranges: list[str], *, nth: int = 1,
                        max_region_bytes: int = DEFAULT_MAX_REGION_BYTES,
                        command: list[str] | None = None, store_bytes: bool = False,
                        post_digest_over: int | None = None):
    """Open a ``RangeSession`` capturing the ranges named ``ranges`` (their ``nth``
    occurrence, marked by NVTX or ``kpair.mark``) into ``out/<name>/``. Call it before the
    process's first NVTX call (NVTX finds its tool then) and before CUDA initialises."""
    from .ranges import RangeSession
    from .tracer import software_environment, torch_blocks  # lazy, as install's Tracer

    tracer = install()
    # NVTX (torch.cuda.nvtx) reports its ranges to the library this names, read at the
    # process's first NVTX call: this CUPTI, whose NVTX callbacks the tracer enabled.
    os.environ.setdefault("NVTX_INJECTION64_PATH", tracer.cupti.path)
    session = RangeSession(out, ranges, nth=nth, driver=tracer.driver,
                           registry=tracer.registry, blocks=torch_blocks,
                           max_region_bytes=max_region_bytes, command=command,
                           environment=software_environment, metadata=triton_metadata,
                           writers=tracer.writers, store_bytes=store_bytes)
    session.post_digest_over = post_digest_over
    tracer.attach(session)
    return session


def finish_session(session: CaptureSession, exit_status: int | None = None) -> dict:
    """Detach ``session``, write its final ``capture.json`` and return that summary."""
    if _tracer is not None:
        _tracer.detach(session)
        session.notes.extend(_tracer.errors)
    return session.close(exit_status)


@contextlib.contextmanager
def capture(out: str | os.PathLike, *, kernel: str | None = None, nth: int = 1,
            max: int | None = None, distinct: bool = False,
            max_region_bytes: int = DEFAULT_MAX_REGION_BYTES,
            names: list[str] | None = None) -> Iterator[CaptureSession]:
    """Capture the matching dispatches launched inside the ``with`` block into ``out``.

    ``kernel`` is a regular expression searched in the mangled and demangled names; ``names``
    a list of exact names (``top_kernels``' answer, say); capture starts at the ``nth`` match
    and takes at most ``max`` dispatches (None: all of them).
    """
    session = start_session(out, kernel=kernel, nth=nth, max=max, distinct=distinct,
                            max_region_bytes=max_region_bytes, names=names)
    try:
        yield session
    finally:
        finish_session(session)


__all__ = ["SUMMARY", "CaptureSession", "Filter", "KernelProfiler", "capture",
           "finish_session", "install", "profile_program", "run_profile",
           "start_range_session", "start_session", "top_kernels"]
