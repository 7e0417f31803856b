"""Kernel names for people: demangling, and a short form for directory names.

Demangling goes through libstdc++'s ``__cxa_demangle`` in-process (a subprocess per name would
cost milliseconds inside someone's launch path), then ``c++filt`` when that library is
missing; a name neither understands (Triton's plain C names) stays as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import re
import shutil
import subprocess

_cxa = None


def _cxa_demangle():
    global _cxa
    if _cxa is None:
        _cxa = False
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6")
            libc = ctypes.CDLL(None)
            fn = lib.__cxa_demangle
            fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                           ctypes.POINTER(ctypes.c_int)]
            fn.restype = ctypes.c_void_p
            libc.free.argtypes = [ctypes.c_void_p]
            _cxa = (fn, libc.free)
        except (OSError, AttributeError):
            pass
    return _cxa or None


@functools.lru_cache(maxsize=4096)
def demangle(name: str) -> str:
    """The demangled C++ name, or ``name`` itself when it is not a mangled C++ name."""
    if not name.startswith("_Z"):
        return name
    pair = _cxa_demangle()
    if pair:
        fn, free = pair
        status = ctypes.c_int()
        out = fn(name.encode(), None, None, ctypes.byref(status))
        if out:
            try:
                if status.value == 0:
                    return ctypes.string_at(out).decode(errors="replace")
            finally:
                free(out)
    tool = shutil.which("c++filt")
    if tool:
        try:
            text = subprocess.run([tool, name], capture_output=True, text=True,
                                  timeout=10).stdout.strip()
            if text:
                return text
        except (OSError, subprocess.SubprocessError):
            pass
    return name


def _strip_templates(text: str) -> str:
    out, depth = [], 0
    for ch in text:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def short_name(demangled: str, limit: int = 48) -> str:
    """The bare function name: ``void at::native::f<4, X>(int, Y)`` → ``f``; safe for paths."""
    text = _strip_templates(demangled.replace("(anonymous namespace)", "anon"))
    text = text.split("(", 1)[0].strip()
    text = text.split()[-1] if text.split() else text
    text = text.rsplit("::", 1)[-1]
    text = re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_")
    return text[:limit] or "kernel"
