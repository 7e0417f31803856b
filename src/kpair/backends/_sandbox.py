"""The host backend's sandbox: every loaded kernel runs in its own executor process
(``host_executor.c``) that holds no key, no Python and no verdict path, confined by a seccomp
ALLOWLIST generated here with libseccomp (the ``pyseccomp`` bindings) and installed by the
executor itself.

What this module provides to ``kpair.backends.host``:

- ``check()``: the sandbox can be set up here (Linux, x86_64 or aarch64, libseccomp and a C
  compiler present), else ``SandboxUnavailable`` naming what is missing: kpair fails closed,
  it never runs a candidate unconfined;
- ``executor()``: the executor binary, compiled once per source digest with the system C
  compiler into the per-user cache (``$XDG_CACHE_HOME/kpair`` or ``~/.cache/kpair``);
- ``filters(pid)``: the two BPF programs for the executor whose pid is ``pid`` — filter 1
  (the allowlist plus read-only ``open``/``openat``, in force while the code object is
  dlopen'ed and its ELF constructors run) and filter 2 (the allowlist alone, stacked on
  filter 1 before the first launch);
- ``describe()``: what the sandbox is, for result.json.

The allowlist is what running an already loaded kernel needs: memory (mmap, mprotect, brk,
...), threads (clone only with CLONE_THREAD and no namespace flag; clone3 answers ENOSYS so
the C library falls back to clone), futexes, signals to itself only (kill and tgkill whose
first argument is its own pid), clocks and sleeps, reading and writing descriptors it
already holds, signal handlers other than SIGSYS's. Every other system call fails with EPERM:
files cannot be opened (after the load), created or changed; no process, socket, mount,
namespace, IPC object, trace, reboot, clock change, BPF program or perf event can be made; no
other process can be signalled, limited or read.

A refused call is not silent: the filters trap it (SECCOMP_RET_TRAP), the executor's SIGSYS
handler writes a record naming the call to the reply pipe and makes the call return EPERM;
the judge counts the records (``HostDevice.refused_calls``, the ``refused_calls`` trust
check). ``syscall_name`` turns a number back into its name.
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
    "lseek", "mmap", "munmap", "mprotect", "mremap", "madvise", "brk", "futex",
    "set_robust_list", "get_robust_list", "rseq", "set_tid_address", "exit", "exit_group",
    "rt_sigreturn", "rt_sigprocmask", "sigaltstack", "clock_gettime",
    "clock_getres", "gettimeofday", "nanosleep", "clock_nanosleep", "sched_yield",
    "sched_getaffinity", "getpid", "gettid", "getrandom", "membarrier",
)
#: Open flags that write or create: O_WRONLY O_RDWR O_CREAT O_TRUNC O_APPEND __O_TMPFILE.
_WRITE_FLAGS = 0o1 | 0o2 | 0o100 | 0o1000 | 0o2000 | 0o20000000
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


def _build(pid: int, *, loading: bool) -> bytes:
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
    if loading:
        _add(sc, f, sc.ALLOW, "openat", sc.Arg(2, sc.MASKED_EQ, _WRITE_FLAGS, 0))
        _add(sc, f, sc.ALLOW, "open", sc.Arg(1, sc.MASKED_EQ, _WRITE_FLAGS, 0))
        # The executor stacks filter 2 once the code object is loaded: seccomp(
        # SECCOMP_SET_MODE_FILTER, no flags), which can only confine a process further.
        _add(sc, f, sc.ALLOW, "seccomp", sc.Arg(0, sc.EQ, 1), sc.Arg(1, sc.EQ, 0))
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


def filters(pid: int) -> tuple[bytes, bytes]:
    """(filter 1, filter 2) as BPF for the executor ``pid``: see the module docstring."""
    check()
    return _build(pid, loading=True), _build(pid, loading=False)


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
                "clone3 (ENOSYS)", "openat/open (read-only, while loading)",
                "seccomp (SET_MODE_FILTER, while loading)"],
            "default_action": "EPERM, reported (SECCOMP_RET_TRAP: the executor's SIGSYS "
            "handler tells the judge which call was refused)", "rlimits": rlimits,
            "filter_instructions": filter_bytes // 8, "timer": "executor CPU clock, read "
            "by the judge from outside"}
