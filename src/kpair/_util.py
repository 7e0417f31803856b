"""Small helpers shared across the pipeline: timestamps, sizes for people, temporary
directories, and safe writes (the one way kpair writes a file: see "safe writes" below)."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

T, R = TypeVar("T"), TypeVar("R")

#: Threads for work that leaves the GIL (zstd, sha256 and numpy over large buffers).
IO_THREADS = 8


def utc_now() -> str:
    """The current time, UTC, to the second, ISO 8601: the timestamp of every kpair file."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# ---------------------------------------------------------------------- safe writes
#
# Every file kpair writes goes through ``write_bytes_atomic`` (or ``append_text``): only a
# regular file or a new path is written, through a temporary file in the same folder and a
# rename, so a reader sees the old file or the whole new one. A directory, a device, a FIFO
# or a symbolic link is never written over; an existing file only when the caller allows it
# (``replace=True``: kpair's own files, or a user's with --force). ``check_output`` makes the
# same checks before a command starts work, so a refusal comes before anything is written.

FORCE_HINT = "pass --force to replace it"


def _kind(mode: int) -> str | None:
    """What a non-regular file is, for a message (None: a regular file)."""
    if stat.S_ISREG(mode):
        return None
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _lstat(path: Path, refusal: str) -> os.stat_result | None:
    """``path``'s own status (None: nothing there); an unreadable one is an OutputError."""
    from .errors import OutputError

    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise OutputError(f"{path}: {refusal} ({e.strerror or e})") from None


def check_output(path: str | os.PathLike, *, replace: bool = False,
                 hint: str = FORCE_HINT) -> Path:
    """Refuse (``OutputError``, exit 2) an output path kpair must not write: a directory, a
    special file, a symbolic link, an existing file unless ``replace``, a path under a file
    or in a folder that cannot be written. Nothing is created. Returns the path."""
    from .errors import OutputError

    path = Path(path)
    st = _lstat(path, "cannot be written")
    if st is not None:
        kind = _kind(st.st_mode)
        if kind is not None:
            raise OutputError(f"{path} is {kind}: kpair writes only regular files or new "
                              "paths; give a file path")
        if not replace:
            raise OutputError(f"{path} exists; kpair does not replace it ({hint})")
    folder = _existing_ancestor(path.parent)
    if not folder.is_dir():
        raise OutputError(f"{path}: {folder} is not a directory")
    why = _unwritable(folder)
    if why:
        raise OutputError(f"{path}: the folder {folder} cannot be written ({why})")
    return path


def _unwritable(folder: Path) -> str | None:
    """Why files cannot be made in ``folder`` (None: they can). Tried for real, with a
    temporary file removed at once: permission bits do not stop root, while a read-only
    mount or a pseudo-filesystem (/sys, /proc) does."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return "read-only or no permission"
    try:
        fd, probe = tempfile.mkstemp(prefix=".kpair-probe-", dir=folder)
    except OSError as e:
        return e.strerror or str(e)
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return None


def check_output_dir(path: str | os.PathLike, *, empty: bool = False) -> Path:
    """Refuse an output *directory* kpair cannot use: an existing non-directory, or a folder
    that cannot be written; ``empty``: also one that holds anything."""
    from .errors import OutputError

    path = Path(path)
    st = _lstat(path, "cannot be used")
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{path} exists and is {_kind(st.st_mode) or 'a file'}, not a "
                          "directory")
    if st is not None and empty and any(path.iterdir()):
        raise OutputError(f"{path} exists and is not empty; give a new or empty directory")
    folder = _existing_ancestor(path)
    if not folder.is_dir():
        raise OutputError(f"{path}: {folder} is not a directory")
    why = _unwritable(folder)
    if why:
        raise OutputError(f"{path}: {folder} cannot be written ({why})")
    return path


def _existing_ancestor(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def make_dirs(path: str | os.PathLike) -> Path:
    """``mkdir -p`` whose failure is an ``OutputError`` naming the path, not an OSError."""
    path = Path(path)
    check_output_dir(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        from .errors import OutputError

        raise OutputError(f"{path}: cannot create the directory ({e.strerror or e})") from None
    return path


def _file_mode() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def write_bytes_atomic(path: str | os.PathLike, data: bytes, *, replace: bool = True,
                       hint: str = FORCE_HINT) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename:
    never a half file, never over a directory, device, FIFO or link, and over an existing
    file only with ``replace`` (see ``check_output``). Folders are created as needed.
    A failure while writing is ``WriteFailed`` (exit 5) and leaves the old file as it was."""
    from .errors import WriteFailed

    path = Path(path)
    check_output(path, replace=replace, hint=hint)
    make_dirs(path.parent)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise WriteFailed(f"{path}: cannot write ({e.strerror or e})") from None
    try:
        with open(fd, "wb") as f:
            os.fchmod(f.fileno(), _file_mode())
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        # Checked again at the last moment: what appeared meanwhile is not replaced either.
        check_output(path, replace=replace, hint=hint)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise WriteFailed(f"{path}: cannot write ({e.strerror or e})") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | os.PathLike, text: str, *, replace: bool = True,
                      hint: str = FORCE_HINT) -> None:
    write_bytes_atomic(path, text.encode(), replace=replace, hint=hint)


def append_text(path: str | os.PathLike, text: str) -> None:
    """Append ``text`` to a regular file (created if absent): the one way kpair adds lines
    to a log such as ``attempts.jsonl``; a special file or a link is refused."""
    from .errors import WriteFailed

    path = Path(path)
    check_output(path, replace=True)
    make_dirs(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        with open(fd, "a") as f:
            f.write(text)
    except OSError as e:
        raise WriteFailed(f"{path}: cannot append ({e.strerror or e})") from None


_TEMP_PREFIX = "kpair-"


@contextlib.contextmanager
def private_tempdir(kind: str, parent: Path | None = None) -> Iterator[Path]:
    """A temporary directory named ``kpair-<kind>-<pid>-<random>`` (in ``parent`` or the
    system's temporary directory), removed on exit; ``sweep_stale_tempdirs`` removes the ones
    whose process died before it could."""
    path = Path(tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{kind}-{os.getpid()}-", dir=parent))
    _LIVE.add(path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        _LIVE.discard(path)


#: This process's temporary directories still in use (a pool's threads hold some).
_LIVE: set[Path] = set()


def remove_live_tempdirs() -> None:
    """Remove every temporary directory this process still holds: on Ctrl-C or SIGTERM the
    main thread unwinds its own, but a pool thread's would outlive the exit."""
    for path in list(_LIVE):
        shutil.rmtree(path, ignore_errors=True)
        _LIVE.discard(path)


def sweep_stale_tempdirs(parent: Path | None = None) -> list[Path]:
    """Remove kpair's temporary directories whose owning process no longer exists."""
    removed = []
    base = Path(parent) if parent is not None else Path(tempfile.gettempdir())
    with contextlib.suppress(OSError):
        for path in base.glob(f"{_TEMP_PREFIX}*-*-*"):
            parts = path.name.split("-")
            if len(parts) < 4 or not parts[2].isdigit() or not path.is_dir():
                continue
            if not pid_alive(int(parts[2])):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def threaded_map(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``[fn(x) for x in items]``, computed on up to ``IO_THREADS`` threads (one per CPU at
    most): for work that releases the GIL, such as decompressing and hashing blobs. Every call
    finishes before this returns; the first item's error, in order, is raised."""
    items = list(items)
    workers = min(IO_THREADS, os.cpu_count() or 1, len(items))
    if workers <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(fn, x) for x in items]
    return [f.result() for f in futures]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def child_command(module: str, entry: str, *args: str) -> list[str]:
    """``python -I`` running ``module.entry(argv)`` on ``args``, with this process's resolved
    import path minus the current directory (a ``kpair/`` folder there must not replace
    kpair): how kpair starts its workers and record_call its child."""
    boot = (f"import sys, json; sys.path[:0] = json.loads(sys.argv.pop(1)); "
            f"from {module} import {entry}; sys.exit({entry}(sys.argv[1:]))")
    cwd, here = os.getcwd(), str(Path(__file__).resolve().parent.parent)
    path = [here] + [p for p in sys.path if p and os.path.isabs(p) and p not in (cwd, here)]
    return [sys.executable, "-I", "-c", boot, json.dumps(path), *args]


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc``'s process group (started with ``start_new_session``) and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
