"""Small helpers shared across the pipeline (timestamps, sizes for people, versioned JSON)."""

from __future__ import annotations

import contextlib
import datetime
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def utc_now() -> str:
    """The current time, UTC, to the second, ISO 8601: the timestamp of every kpair file."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename: never a half file."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode())


_TEMP_PREFIX = "kpair-"


@contextlib.contextmanager
def private_tempdir(kind: str, parent: Path | None = None) -> Iterator[Path]:
    """A temporary directory named ``kpair-<kind>-<pid>-<random>`` (in ``parent`` or the
    system's temporary directory), removed on exit; ``sweep_stale_tempdirs`` removes the ones
    whose process died before it could."""
    path = Path(tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{kind}-{os.getpid()}-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


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


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
