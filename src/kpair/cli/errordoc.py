"""The one JSON document ``--json`` prints when a command ends without its own: a usage
error (argparse's included), a bad input, a missing backend, a runtime failure, an interrupt.

Its shape follows ``result.json``'s error (``status``, ``error.type``, ``error.message``), so
a reader of ``kpair run --json`` handles every verb's failures the same way; its JSON Schema
is ``docs/schemas/cli/error.schema.json`` (``python -m kpair.cli.errordoc`` writes it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Literal

from .. import __version__
from ..formats import Record, encode, json_schema

SCHEMA = "kpair.error"
SCHEMA_VERSION = 1
SCHEMA_FILE = Path("docs") / "schemas" / "cli" / "error.schema.json"


class ErrorDetail(Record, omit_defaults=True):
    """What went wrong: the error's type (``UsageError``, ``InputError``, ...), its one-line
    message, and the path and field it names when it names one."""

    type: str
    message: str
    path: str | None = None
    field: str | None = None


class ErrorDocument(Record):
    """What ``kpair VERB --json`` prints on stdout when the verb ends with an error instead of
    its own document: ``exit_code`` is the process's exit status (README "Exit codes")."""

    schema: Literal["kpair.error"]
    schema_version: int
    kpair_version: str
    command: str
    status: Literal["error", "interrupted"]
    exit_code: Literal[2, 3, 4, 5, 130, 143]
    error: ErrorDetail


def error_document(command: str, exit_code: int, error: BaseException | str, *,
                   kind: str | None = None) -> ErrorDocument:
    """The document of ``error`` ending ``command`` (``kpair run``) with ``exit_code``."""
    message = str(error) if not isinstance(error, str) else error
    path = getattr(error, "path", None) if not isinstance(error, str) else None
    field = getattr(error, "field", None) if not isinstance(error, str) else None
    return ErrorDocument(
        schema=SCHEMA, schema_version=SCHEMA_VERSION, kpair_version=__version__,
        command=command, status="interrupted" if exit_code in (130, 143) else "error",
        exit_code=exit_code,
        error=ErrorDetail(type=kind or type(error).__name__, message=message,
                          path=None if path is None else str(path), field=field))


def print_error_document(command: str, exit_code: int, error: BaseException | str, *,
                         kind: str | None = None) -> None:
    print(encode(error_document(command, exit_code, error, kind=kind)), end="", flush=True)


def schema_text() -> str:
    """The JSON Schema (Draft 2020-12) of ``ErrorDocument``, as ``SCHEMA_FILE`` holds it."""
    body = json_schema(ErrorDocument)
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema",
              "title": "kpair VERB --json, on an error",
              "description": "Generated from kpair.cli.errordoc:ErrorDocument by `python -m "
                             "kpair.cli.errordoc`; README \"Exit codes\" explains exit_code.",
              **body}
    return json.dumps(schema, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    target = Path(argv[0]) if argv else SCHEMA_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(schema_text())
    print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
