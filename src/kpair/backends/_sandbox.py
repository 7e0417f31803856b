"""A seccomp-bpf filter for the host backend's worker: once sealed, no file is created,
written, renamed or removed, no process is created or executed, no network socket is made,
and no signal reaches another process — for every thread of the process, native code
included. Everything else (reading files, memory, the pipes the worker already holds) stays.

Linux only, x86_64 and aarch64 (the filter names syscalls by number). ``seal()`` returns a
description of what it installed, for result.json, or raises SandboxUnavailable.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

# BPF instruction classes and modes (linux/filter.h, linux/bpf_common.h).
_LD_W_ABS = 0x20
_JEQ, _JGE, _JSET = 0x15, 0x35, 0x45
_RET = 0x06
_ALLOW, _KILL = 0x7FFF0000, 0x80000000


def _errno(n: int) -> int:
    return 0x00050000 | n


_EPERM, _ENOSYS = _errno(errno.EPERM), _errno(errno.ENOSYS)
#: open flags that write or create: O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND.
_WRITE_FLAGS = 0x1 | 0x2 | 0x40 | 0x200 | 0x400
_CLONE_THREAD = 0x10000

#: Per architecture: audit arch, seccomp syscall number, syscalls refused outright (EPERM),
#: refused as absent (ENOSYS: the C library then falls back to a call the filter can read),
#: open-like syscalls and the argument that holds their flags, and the signal senders.
_ARCHS = {
    "x86_64": {
        "audit": 0xC000003E, "seccomp": 317,
        "deny": [85, 82, 264, 316, 87, 263, 83, 258, 84, 86, 265, 88, 266, 90, 91, 268, 452,
                 92, 93, 94, 260, 76, 133, 259, 132, 235, 261, 280, 57, 58, 59, 322, 41, 53, 42,
                 49, 50, 43, 288, 101, 310, 311, 200, 425, 303, 304, 165, 424, 434, 129, 297],
        "absent": [437, 435],
        "open": {2: 1, 257: 2},
        "clone": 56, "kill": 62, "tgkill": 234,
    },
    "aarch64": {
        "audit": 0xC00000B7, "seccomp": 277,
        "deny": [38, 276, 35, 34, 37, 36, 53, 452, 54, 52, 55, 45, 33, 88, 221, 281, 198, 199,
                 200, 201, 202, 203, 242, 117, 270, 271, 130, 425, 264, 265, 40, 424, 434, 138,
                 240],
        "absent": [437, 435],
        "open": {56: 2},
        "clone": 220, "kill": 129, "tgkill": 131,
    },
}
DENIED = ("creating, writing, renaming or removing files", "creating or executing processes",
          "network sockets", "signals to other processes", "tracing other processes")


class SandboxUnavailable(OSError):
    pass


def _arg_lo(i: int) -> int:
    return 16 + 8 * i  # seccomp_data: nr, arch, instruction_pointer, args[6]


def _program(spec: dict, pid: int) -> list[tuple[int, object, object, int]]:
    """The filter as (code, jt, jf, k); jt/jf are labels or 0 (next instruction)."""
    p: list[tuple[int, object, object, int]] = [
        (_LD_W_ABS, 0, 0, 4), (_JEQ, 0, "kill", spec["audit"]), (_LD_W_ABS, 0, 0, 0)]
    if spec["audit"] == 0xC000003E:
        p.append((_JGE, "kill", 0, 0x40000000))  # the x32 ABI: other numbers, same calls
    for nr in spec["deny"]:
        p.append((_JEQ, "eperm", 0, nr))
    for nr in spec["absent"]:
        p.append((_JEQ, "enosys", 0, nr))
    for nr, arg in spec["open"].items():
        p += [(_JEQ, 0, 2, nr), (_LD_W_ABS, 0, 0, _arg_lo(arg)),
              (_JSET, "eperm", "allow", _WRITE_FLAGS)]
    p += [(_JEQ, 0, 2, spec["clone"]), (_LD_W_ABS, 0, 0, _arg_lo(0)),
          (_JSET, "allow", "eperm", _CLONE_THREAD)]
    # kill(0 or own pid) and tgkill(own pid, ...) stay: raise() and abort() use them.
    p += [(_JEQ, 0, 3, spec["kill"]), (_LD_W_ABS, 0, 0, _arg_lo(0)),
          (_JEQ, "allow", 0, pid), (_JEQ, "allow", "eperm", 0)]
    p += [(_JEQ, 0, 2, spec["tgkill"]), (_LD_W_ABS, 0, 0, _arg_lo(0)),
          (_JEQ, "allow", "eperm", pid)]
    p += [(_RET, 0, 0, _ALLOW)]
    return p


def _assemble(prog: list[tuple[int, object, object, int]]) -> bytes:
    tail = {"allow": _ALLOW, "eperm": _EPERM, "enosys": _ENOSYS, "kill": _KILL}
    labels = {name: len(prog) + i for i, name in enumerate(tail)}
    out = b""
    for i, (code, jt, jf, k) in enumerate(prog):
        offs = [labels[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf)]
        if not all(0 <= o <= 255 for o in offs):
            raise SandboxUnavailable(f"seccomp filter jump out of range at instruction {i}")
        out += struct.pack("<HBBI", code, offs[0], offs[1], k & 0xFFFFFFFF)
    for value in tail.values():
        out += struct.pack("<HBBI", _RET, 0, 0, value)
    return out


def seal() -> dict:
    """Install the filter on every thread of this process (irrevocably)."""
    machine = platform.machine().lower()
    spec = _ARCHS.get({"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine))
    if not platform.system() == "Linux" or spec is None:
        raise SandboxUnavailable(f"no seccomp filter for {platform.system()} {machine}")
    code = _assemble(_program(spec, os.getpid()))
    filt = ctypes.create_string_buffer(code, len(code))

    class _Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = _Prog(len(code) // 8, ctypes.addressof(filt))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS: required to filter unprivileged
        raise SandboxUnavailable(f"prctl(NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}")
    # seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, prog): every thread at once.
    if libc.syscall(spec["seccomp"], 1, 1, ctypes.byref(prog)) != 0:
        raise SandboxUnavailable(f"seccomp: {os.strerror(ctypes.get_errno())}")
    return {"mechanism": "seccomp-bpf", "denied": list(DENIED), "instructions": len(code) // 8}
