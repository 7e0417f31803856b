"""Small helpers shared across the pipeline (timestamps, sizes for people, versioned JSON)."""

from __future__ import annotations

import datetime
import json
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
