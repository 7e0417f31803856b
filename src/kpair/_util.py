"""Small helpers shared across the pipeline (timestamps, sizes for people, versioned JSON)."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .errors import FormatError


def utc_now() -> str:
    """The current time, UTC, to the second, ISO 8601: the timestamp of every kpair file."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def read_versioned_json(path: Path, schema: str, version: int,
                        error: type[FormatError] = FormatError) -> dict:
    """Read a kpair JSON file, refusing another schema or an unknown version by name."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise error(f"not readable JSON ({e})", path=path) from None
    if not isinstance(obj, dict) or obj.get("schema") != schema:
        raise error(f"expected schema {schema!r}", path=path, field="schema")
    if obj.get("schema_version") != version:
        raise error(f"schema_version {obj.get('schema_version')!r} is not supported "
                    f"(this kpair reads {version})", path=path, field="schema_version")
    return obj


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename: never a half file."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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
