"""``kpair.mark(name)``: mark a range of a program for ``kpair capture --range NAME``.

A program marks the work it wants captured as one range::

    with kpair.mark("forward") as m:
        y = model(x)
        m.outputs(y)          # optional: the range's declared outputs (live-out)

Without a capture tracer in the process the block costs a few attribute lookups (and an
NVTX push/pop when PyTorch is imported), so a program can keep its marks in production.
Under ``kpair capture`` the capture tracer has registered itself here (``listen``): the
mark tells it where the range begins and ends and which tensors it declared as outputs.
The mark also pushes an NVTX range of the same name through ``torch.cuda.nvtx`` when torch
is already imported, so profilers see it; the tracer ignores that push (it has been told).
A program that does not import kpair marks ranges with ``torch.cuda.nvtx.range(NAME)``
instead; the tracer sees those through CUPTI's NVTX callbacks.

This module imports nothing of kpair and no GPU library.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable

#: The capture tracer listening, or None (set by ``listen``).
_listener = None
_tls = threading.local()


def listen(listener) -> None:
    """Route marks to ``listener`` (``range_begin(name, thread)``, ``range_end(name,
    thread, outputs)``, ``quiet_nvtx(on)``); ``None`` stops."""
    global _listener
    _listener = listener


def _spans(tensors: Iterable) -> list[tuple[int, int]]:
    """(device address, bytes) of each tensor's storage (a torch tensor or anything with
    ``data_ptr()`` and ``nbytes``); other objects are refused with a one-line message."""
    out = []
    for t in tensors:
        ptr = getattr(t, "data_ptr", None)
        if ptr is None:
            raise TypeError(f"kpair.mark outputs must be tensors, not {type(t).__name__}")
        size = getattr(t, "nbytes", None)
        if size is None:
            size = t.numel() * t.element_size()
        out.append((int(ptr()), int(size)))
    return out


def _nvtx():
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return torch.cuda.nvtx
    except Exception:  # a torch without CUDA support: no NVTX to push
        return None


class mark:  # noqa: N801 - used as a function: ``with kpair.mark("fwd"):``
    """A context manager marking the range ``name``; ``outputs``: tensors the range
    writes that are its declared outputs (more with ``.outputs(...)`` inside the block)."""

    def __init__(self, name: str, outputs: Iterable | None = None):
        if not isinstance(name, str) or not name:
            raise ValueError("kpair.mark needs a non-empty range name")
        self.name = name
        self._outputs = list(outputs or ())
        self._listener = None
        self._pushed = False

    def outputs(self, *tensors) -> mark:
        """Declare ``tensors`` as outputs of this range (live-out regions); returns self."""
        self._outputs.extend(tensors)
        return self

    def __enter__(self) -> mark:
        self._listener = listener = _listener
        thread = threading.get_ident()
        if listener is not None:
            listener.range_begin(self.name, thread)
        nvtx = _nvtx()
        if nvtx is not None:
            self._quiet(True)
            try:
                nvtx.range_push(self.name)
                self._pushed = True
            except Exception:  # NVTX unavailable: the mark still works through the listener
                self._pushed = False
            finally:
                self._quiet(False)
        return self

    def __exit__(self, *exc) -> None:
        if self._pushed:
            self._quiet(True)
            try:
                _nvtx().range_pop()
            except Exception:  # pushed but cannot pop: nothing left to do about it
                pass
            finally:
                self._quiet(False)
        listener = self._listener
        if listener is not None:
            spans = _spans(self._outputs) if exc[0] is None else []
            listener.range_end(self.name, threading.get_ident(), spans,
                               failed=exc[0] is not None)

    def _quiet(self, on: bool) -> None:
        if self._listener is not None:
            self._listener.quiet_nvtx(on)


__all__ = ["listen", "mark"]
