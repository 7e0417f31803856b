"""The host backend's sandbox: every loaded kernel runs in its own executor process
(``host_executor.c``) that holds no key, no Python, no verdict path and no protocol, confined
by ONE seccomp filter generated here with libseccomp (the ``pyseccomp`` bindings) and
installed by the executor itself before the code object is loaded.

What this module provides to ``kpair.backends.host``:

- ``check()``: the sandbox can be set up here (Linux, x86_64 or aarch64, libseccomp and a C
  compiler present), else ``SandboxUnavailable`` naming what is missing: kpair fails closed,
  it never runs a candidate unconfined;
- ``executor()``: the executor binary, compiled once per source digest with the system C
  compiler into the per-user cache (``$XDG_CACHE_HOME/kpair`` or ``~/.cache/kpair``);
- ``filter_for(pid)``: the BPF program for the executor whose pid is ``pid``, in force before
  its code object is dlopen'ed (ELF constructors and IFUNC resolvers run under it) and for
  the rest of its life; ``FILTERS`` is how many filters an executor has then (the judge reads
  ``Seccomp_filters`` from /proc from outside and fails a candidate whose count differs);
- ``describe()``: what the sandbox is, for result.json.

The allowlist is what running an already loaded kernel needs: memory (mmap, mprotect, brk,
...; madvise only with advice that cannot change a shared page's residency for another
process), threads (clone only with CLONE_THREAD and no namespace flag; clone3 answers ENOSYS
so the C library falls back to clone), futexes, signals to itself only (kill and tgkill whose
first argument is its own pid: the executor stops itself that way between calls), clocks and
sleeps, reading and writing descriptors it already holds, signal handlers other than
SIGSYS's. ``open``/``openat`` go to the judge (SECCOMP_RET_USER_NOTIF): it lets read-only
opens through while the code object loads (SECCOMP_USER_NOTIF_FLAG_CONTINUE) and refuses
every open after. ``sendmsg`` on descriptor 0 (the setup socket, closed before the load)
hands the judge that listener. Every other system call fails with EPERM — ``seccomp()`` and
``prctl()`` included, so no filter can be stacked and nothing the executor set can be undone:
files cannot be opened (after the load), created or changed; no process, socket, mount,
namespace, IPC object, trace, reboot, clock change, BPF program or perf event can be made; no
other process can be signalled, limited or read.

A refused call is not silent: the filter traps it (SECCOMP_RET_TRAP), the executor's SIGSYS
handler writes a record naming the call to the report pipe and makes the call return EPERM
(an open is refused and counted by the judge itself); the judge counts them
(``HostDevice.refused_calls``, the ``refused_calls`` trust check). ``syscall_name`` turns a
number back into its name.
"""

from __future__ import annotations

import errno
import hashlib
import os
import platform
import subprocess
import tempfile
from functools import lru_cache
from importlib import resources
from pathlib import Path

from ..errors import BackendUnavailable

#: The executor runs as this user and group when kpair runs as root (nobody/nogroup).
NOBODY = 65534
SUPPORTED = ("x86_64", "aarch64")
MECHANISM = "seccomp allowlist (libseccomp) + separate process"

#: System calls an executor may make once its kernel is loaded (names as libseccomp knows
#: them; one absent on an architecture, such as ``newfstatat`` vs ``fstat``, is skipped).
ALLOWED = (
    "read", "write", "readv", "writev", "pread64", "close", "fstat", "newfstatat", "statx",
    "lseek", "mmap", "munmap", "mprotect", "mremap", "brk", "futex",
    "set_robust_list", "get_robust_list", "rseq", "set_tid_address", "exit", "exit_group",
    "rt_sigreturn", "restart_syscall", "rt_sigprocmask", "sigaltstack", "clock_gettime",
    "clock_getres", "gettimeofday", "nanosleep", "clock_nanosleep", "sched_yield",
    "sched_getaffinity", "getpid", "gettid", "getrandom", "membarrier",
)
#: madvise advice that changes only the caller's own view (its page tables, its VMA's flags)
#: or only makes pages resident: NORMAL RANDOM SEQUENTIAL WILLNEED DONTNEED FREE DONTFORK
#: DOFORK UNMERGEABLE NOHUGEPAGE DONTDUMP DODUMP WIPEONFORK KEEPONFORK DONTNEED_LOCKED.
#: Refused: REMOVE (punches the shared object), COLD and PAGEOUT (reclaim its pages),
#: POPULATE_READ/WRITE, HUGEPAGE and COLLAPSE (change its pages' size under another process's
#: mapping), MERGEABLE, HWPOISON, SOFT_OFFLINE, and any advice not named here.
MADVISE_ALLOWED = (0, 1, 2, 3, 4, 8, 10, 11, 13, 15, 16, 17, 18, 19, 24)
#: Seccomp filters in force in a loaded executor (its one filter).
FILTERS = 1
#: Open flags that write or create: O_WRONLY O_RDWR O_CREAT O_TRUNC O_APPEND __O_TMPFILE.
WRITE_FLAGS = 0o1 | 0o2 | 0o100 | 0o1000 | 0o2000 | 0o20000000
_CLONE_THREAD = 0x00010000
#: SIGSYS (31 on x86_64 and aarch64): its handler reports refused calls and stays in place.
_SIGSYS = 31
#: Namespace flags of clone(2): CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET.
_CLONE_NEW = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 \
    | 0x40000000

SOURCE = "host_executor.c"


class SandboxUnavailable(BackendUnavailable):
    """The host sandbox cannot be set up here; kpair refuses to run host kernels without it."""


def _arch() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


@lru_cache(maxsize=1)
def _seccomp():
    try:
        import pyseccomp
    except ImportError as e:
        raise SandboxUnavailable(
            f"the host sandbox needs the pyseccomp bindings ({e}): pip install 'pyseccomp>=0.1'"
        ) from None
    except OSError as e:  # pyseccomp loads libseccomp.so.2 when imported
        raise SandboxUnavailable(
            f"the host sandbox needs libseccomp ({e}): apt-get install libseccomp2") from None
    return pyseccomp


def check() -> None:
    """Raise SandboxUnavailable unless an executor can be built and confined here."""
    if platform.system() != "Linux":
        raise SandboxUnavailable(f"the host sandbox needs Linux (seccomp), not "
                                 f"{platform.system()}: host kernels are not run here")
    if _arch() not in SUPPORTED:
        raise SandboxUnavailable(f"the host sandbox supports {' and '.join(SUPPORTED)}, not "
                                 f"{_arch()}: host kernels are not run here")
    _seccomp()
    executor()


def _build(pid: int) -> bytes:
    sc = _seccomp()
    # TRAP: the executor's SIGSYS handler reports the call, then answers it with EPERM.
    f = sc.SyscallFilter(sc.TRAP)
    for name in ALLOWED:
        _add(sc, f, sc.ALLOW, name)
    _add(sc, f, sc.ALLOW, "rt_sigaction", sc.Arg(0, sc.NE, _SIGSYS))
    _add(sc, f, sc.ERRNO(errno.ENOSYS), "clone3")
    _add(sc, f, sc.ALLOW, "clone",
         sc.Arg(0, sc.MASKED_EQ, _CLONE_THREAD | _CLONE_NEW, _CLONE_THREAD))
    _add(sc, f, sc.ALLOW, "kill", sc.Arg(0, sc.EQ, pid))
    _add(sc, f, sc.ALLOW, "tgkill", sc.Arg(0, sc.EQ, pid))
    for advice in MADVISE_ALLOWED:
        _add(sc, f, sc.ALLOW, "madvise", sc.Arg(2, sc.EQ, advice))
    # Opens are the judge's to answer (read-only ones while loading, none after).
    _add(sc, f, sc.NOTIFY, "openat")
    _add(sc, f, sc.NOTIFY, "open")
    # The setup reply carries the listener (SCM_RIGHTS) on descriptor 0, closed right after.
    _add(sc, f, sc.ALLOW, "sendmsg", sc.Arg(0, sc.EQ, 0))
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        code = out.read()
    if not code or len(code) % 8:
        raise SandboxUnavailable(f"libseccomp exported a {len(code)}-byte filter")
    return code


def _add(sc, f, action: int, name: str, *args) -> None:
    try:
        nr = sc.resolve_syscall(sc.Arch.NATIVE, name)
    except (OSError, ValueError):
        return
    if nr == -1:  # unknown to libseccomp
        return
    f.add_rule(action, nr, *args)


@lru_cache(maxsize=512)
def syscall_name(nr: int) -> str:
    """The name of system call ``nr`` on this architecture (``syscall 1234`` if unknown)."""
    try:
        name = _seccomp().resolve_syscall(_seccomp().Arch.NATIVE, int(nr))
    except (OSError, ValueError, SandboxUnavailable):
        return f"syscall {nr}"
    return name.decode() if isinstance(name, bytes) else str(name)


@lru_cache(maxsize=64)
def syscall_number(name: str) -> int:
    """The number of system call ``name`` on this architecture (-1 where it has none)."""
    sc = _seccomp()
    try:
        return int(sc.resolve_syscall(sc.Arch.NATIVE, name))
    except (OSError, ValueError):
        return -1


def filter_for(pid: int) -> bytes:
    """The executor ``pid``'s one filter, as BPF: see the module docstring."""
    check()
    return _build(pid)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kpair"


@lru_cache(maxsize=1)
def executor() -> Path:
    """The compiled executor, built at first use (a file named by the source's sha256)."""
    from ..toolchain import find_cc

    source = resources.files("kpair.backends").joinpath(SOURCE).read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:32]
    out = cache_dir() / f"host-executor-{_arch()}-{digest}"
    if out.is_file() and os.access(out, os.X_OK):
        return out
    cc = find_cc()   # BackendUnavailable naming apt-get install gcc
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=out.name + ".", dir=out.parent)
    os.close(fd)
    src = Path(tmp + ".c")
    try:
        src.write_bytes(source)
        cmd = [cc, "-O2", "-std=gnu11", "-o", tmp, str(src), "-ldl"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SandboxUnavailable(f"building the host executor failed:\n$ {' '.join(cmd)}\n"
                                     f"{proc.stderr}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)
    finally:
        src.unlink(missing_ok=True)
        Path(tmp).unlink(missing_ok=True)
    return out


def describe(*, filter_bytes: int, rlimits: dict) -> dict:
    """What the sandbox is, for result.json."""
    as_root = os.geteuid() == 0
    return {"mechanism": MECHANISM, "process": "one executor process per loaded kernel",
            "uid": NOBODY if as_root else os.geteuid(),
            "gid": NOBODY if as_root else os.getegid(), "groups": [] if as_root else None,
            "capabilities": "none", "no_new_privs": True, "allowlist": list(ALLOWED) + [
                "clone (CLONE_THREAD only)", "kill/tgkill (own pid only)",
                "rt_sigaction (not SIGSYS)",
                "clone3 (ENOSYS)", "madvise (advice " + ", ".join(map(str, MADVISE_ALLOWED))
                + ")", "openat/open (the judge's: read-only while loading, refused after)",
                "sendmsg (descriptor 0: the setup socket, closed before the load)"],
            "filters": FILTERS, "installed": "before the code object is loaded",
            "default_action": "EPERM, reported (SECCOMP_RET_TRAP: the executor's SIGSYS "
            "handler tells the judge which call was refused)", "rlimits": rlimits,
            "filter_instructions": filter_bytes // 8, "timer": "executor CPU clock, read "
            "by the judge from outside", "protocol": "none in the executor: it stops itself "
            "between calls; the judge writes a read-only call page, SIGCONTs it and waits for "
            "its stop"}
