"""Triton source and compile-time metadata of a captured launch, when Triton launched it.

The CUPTI callback runs on the launching thread, inside the Python call that launched the
kernel, so the frames above it hold the objects that did the launch: Triton's
``CompiledKernel`` (its ``function`` handle is the launched one) or Inductor's autotuner.
They carry the kernel's Python source, constexpr values, signature and compile options.
Best effort: anything missing or unexpected yields less metadata, never an error.
"""

from __future__ import annotations

import sys
from typing import Any

_MAX_SOURCE = 64 * 1024
#: Triton's PTX of the launched kernel, kept for PTX-level edits (``kpair.ptx``).
_MAX_PTX = 1 << 20
_MAX_DEPTH = 24
_MAX_CONFIGS = 64
_META_KEYS = ("name", "hash", "num_warps", "num_stages", "num_ctas", "shared", "cluster_dims",
              "target", "global_scratch_size", "profile_scratch_size", "maxnreg", "arch",
              "ptx_version", "triton_version", "enable_fp_fusion", "launch_pdl",
              "launch_cooperative_grid")


def _jsonable(value: Any, depth: int = 0) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if depth > 4:
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v, depth + 1) for v in value]
    return str(value)


def _source_of(fn: Any) -> dict:
    out: dict = {}
    src = getattr(fn, "src", None)
    if isinstance(src, str):
        out["source"] = src[:_MAX_SOURCE]
        out["source_truncated"] = len(src) > _MAX_SOURCE
    for key, attr in (("function", "__name__"), ("module", "__module__")):
        value = getattr(fn, attr, None) or getattr(getattr(fn, "fn", None), attr, None)
        if isinstance(value, str):
            out[key] = value
    return out


def _from_compiled(obj: Any, handle: int) -> dict | None:
    if type(obj).__name__ != "CompiledKernel" or getattr(obj, "function", None) != handle:
        return None
    info: dict = {"launched_by": "triton.CompiledKernel"}
    src = getattr(obj, "src", None)
    info.update(_source_of(getattr(src, "fn", None)))
    for key in ("constants", "signature", "attrs"):
        if hasattr(src, key):
            info[key] = _jsonable(getattr(src, key))
    meta = getattr(obj, "metadata", None)
    if meta is not None:
        as_dict = meta._asdict() if hasattr(meta, "_asdict") else vars(meta)
        info["metadata"] = {k: _jsonable(as_dict[k]) for k in _META_KEYS if k in as_dict}
    asm = getattr(obj, "asm", None)
    ptx = asm.get("ptx") if isinstance(asm, dict) else None
    if isinstance(ptx, str) and len(ptx) <= _MAX_PTX:
        info["ptx"] = ptx
    return info


def _config(cfg: Any) -> dict:
    """A ``triton.Config`` as data: its constexpr kwargs and compile options."""
    out = {"kwargs": _jsonable(dict(getattr(cfg, "kwargs", None) or {}))}
    for key in ("num_warps", "num_stages", "num_ctas", "maxnreg"):
        out[key] = _jsonable(getattr(cfg, key, None))
    return out


def _from_autotuner(obj: Any, name: str, handle: int) -> dict | None:
    fn = getattr(obj, "fn", None)
    if fn is None or not hasattr(obj, "triton_meta") or getattr(fn, "__name__", None) != name:
        return None
    info: dict = {"launched_by": type(obj).__name__}
    info.update(_source_of(fn))
    for key in ("triton_meta", "inductor_meta"):
        value = getattr(obj, key, None)
        if isinstance(value, dict):
            info[key] = _jsonable(value)
    # Every config the autotuner was given (Inductor's heuristics for this kernel's sizes):
    # the retuner tries them first.
    candidates = [c for c in getattr(obj, "configs", None) or [] if hasattr(c, "kwargs")]
    if candidates:
        info["autotune_configs"] = [_config(c) for c in candidates[:_MAX_CONFIGS]]
    launchers = getattr(obj, "launchers", None) or []
    configs = [getattr(launcher, "config", None) for launcher in launchers]
    if any(c is not None for c in configs):
        info["configs"] = [str(c) for c in configs if c is not None]
        # The compiled configs; after autotuning only the chosen one is left. Which one ran
        # is told by the compiled kernel when it is reachable, else by the launch geometry.
        info["launcher_configs"] = [_config(c) for c in configs if c is not None]
    for launcher in launchers:
        for attr in ("bin", "binary", "kernel"):
            compiled = _from_compiled(getattr(launcher, attr, None), handle)
            if compiled:
                info.update({k: v for k, v in compiled.items()
                             if k in ("constants", "signature", "attrs", "metadata", "ptx")})
                info["launched_config"] = _config(getattr(launcher, "config", None))
                return info
    return info


def triton_metadata(handle: int, name: str) -> dict | None:
    """Source and metadata of the Triton kernel behind function ``handle``, or None."""
    if "triton" not in sys.modules:
        return None
    frame = sys._getframe(1)
    for _ in range(_MAX_DEPTH):
        if frame is None:
            break
        try:
            values = list(frame.f_locals.values())
        except Exception:  # a frame proxy can fail on exotic frames
            values = []
        for value in values:
            try:
                info = _from_compiled(value, handle) or _from_autotuner(value, name, handle)
            except Exception:  # metadata is optional, never fatal
                info = None
            if info:
                return info
        frame = frame.f_back
    return None
