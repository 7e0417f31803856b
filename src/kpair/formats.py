"""One way to read, validate and write every kpair file format.

Each format is a tree of ``Record`` structs (msgspec): typed fields, unknown fields refused,
constraints declared on the fields. ``decode`` turns a JSON document (or already parsed
object) into the top-level record and reports any violation as a ``FormatError`` that names
the file and the failing field's dotted path (``regions[2].address``), as every kpair reader
always has. ``encode`` writes the canonical JSON. ``json_schema`` exports the contract that
``docs/schemas/`` publishes; ``FORMATS`` lists the top-level records by file.

Two JSON shapes need a Python type of their own: 64-bit addresses, written as hex strings
("0x7f00") and used as ints (``Address``), and raw bytes written as hex (``HexBytes``).
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from ._util import write_text_atomic
from .errors import FormatError

T = TypeVar("T")


class Record(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Base of every typed record: strict on read, immutable."""

    def to_json(self) -> dict:
        return to_builtins(self)

    def replace(self, **changes: Any) -> Any:
        """A copy with ``changes`` (records are immutable)."""
        return msgspec.structs.replace(self, **changes)


class Address(int):
    """A 64-bit address; JSON spells it as a hex string ``"0x7f00"`` (written lowercase;
    uppercase digits are read, as kpair's readers always have)."""

    PATTERN = "^0x[0-9a-fA-F]{1,16}$"


class HexBytes(bytes):
    """Raw bytes; JSON spells them as lowercase hex (``"0a00ff"``)."""


class Invalid(FormatError, ValueError):
    """A rule across fields, broken; raised by a record's ``__post_init__``.

    msgspec reports a ValueError from ``__post_init__`` at the record's own path, which is
    too coarse for a rule like "the blob holds as many bytes as the region": ``field`` names
    the failing field relative to the record, and ``convert`` joins the two. Being a
    FormatError too, it stays one of kpair's own errors when a record is built in code.
    """

    def __init__(self, message: str, field: str = ""):
        super().__init__(message, field=field or None)
        self.message, self.relative_field = message, field


def _dec_hook(kind: type, obj: Any) -> Any:
    if kind is Address:
        if isinstance(obj, str) and re.match(Address.PATTERN, obj):
            return Address(int(obj, 16))
        raise ValueError(f"expected a 64-bit hex address like '0x7f00', got {obj!r}")
    if kind is HexBytes:
        try:
            return HexBytes(bytes.fromhex(obj))
        except (TypeError, ValueError):
            raise ValueError(f"expected hex bytes, got {obj!r}") from None
    raise NotImplementedError(kind)


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, Address):
        return hex(obj)
    # Subclasses of JSON's scalar types (torch's TorchVersion is a str) write as their base.
    for base in (bool, int, float, str):
        if isinstance(obj, base):
            return base(obj)
    if isinstance(obj, bytes):
        return obj.hex()
    if isinstance(obj, Path):
        return str(obj)
    raise NotImplementedError(type(obj))


def _schema_hook(kind: type) -> dict:
    if kind is Address:
        return {"type": "string", "pattern": Address.PATTERN}
    if kind is HexBytes:
        return {"type": "string", "pattern": "^([0-9a-f]{2})*$"}
    raise NotImplementedError(kind)


# msgspec names Python types; a person fixing a JSON file thinks in JSON's own names.
_JSON_NAMES = {"int": "integer", "float": "number", "str": "string", "bool": "boolean",
               "array": "array", "object": "object", "null": "null", "bytes": "string"}
_TYPE = re.compile(r"`(int|float|str|bool|array|object|null|bytes)`")

_AT = re.compile(r"^(?P<msg>.*) - at `\$(?P<field>[^`]*)`$", re.S)


def _format_error(e: msgspec.ValidationError, path: object, error: type[FormatError],
                  prefix: str) -> FormatError:
    m = _AT.match(str(e))
    message, field = (m["msg"], m["field"].lstrip(".")) if m else (str(e), "")
    if message.startswith("Object contains unknown field"):
        name = message.split("`")[1]
        field = f"{field}.{name}" if field else name
        message = "unknown field (this format version does not define it)"
    elif message.startswith("Object missing required field"):
        name = message.split("`")[1]
        field = f"{field}.{name}" if field else name
        message = "missing"
    if isinstance(e.__cause__, Invalid):
        message = e.__cause__.message
        field = ".".join(p for p in (field, e.__cause__.relative_field) if p)
    else:
        message = _TYPE.sub(lambda t: _JSON_NAMES[t[1]], message)
    field = ".".join(p for p in (prefix, field) if p).replace(".[", "[")
    return error(message[:1].lower() + message[1:], path=path, field=field or None)


def convert(obj: Any, kind: type[T], *, path: object = None,
            error: type[FormatError] = FormatError, field: str = "") -> T:
    """Validate an already parsed JSON object as ``kind``; errors name ``path`` and the field
    (``field`` prefixes it when ``obj`` is a part of a larger document)."""
    try:
        return msgspec.convert(obj, kind, strict=True, dec_hook=_dec_hook)
    except msgspec.ValidationError as e:
        raise _format_error(e, path, error, field) from None


def parse(data: bytes | str, *, path: object = None,
          error: type[FormatError] = FormatError) -> Any:
    """JSON text → plain objects, or a FormatError saying the file is not JSON."""
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise error(f"not readable JSON ({e})", path=path) from None


def check_version(obj: Any, schema: str, version: int, *, path: object = None,
                  error: type[FormatError] = FormatError) -> None:
    """Refuse another format or an unknown version by name, before the field-level checks."""
    if not isinstance(obj, dict) or obj.get("schema") != schema:
        raise error(f"expected schema {schema!r}", path=path, field="schema")
    if obj.get("schema_version") != version:
        raise error(f"schema_version {obj.get('schema_version')!r} is not supported "
                    f"(this kpair reads {version})", path=path, field="schema_version")


def read(path: Path, kind: type[T], *, error: type[FormatError] = FormatError,
         schema: str | None = None, version: int | None = None) -> T:
    """Read and validate the file at ``path`` as ``kind`` (a versioned format when ``schema``
    is given)."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise error(f"cannot read ({e.strerror or e})", path=path) from None
    obj = parse(data, path=path, error=error)
    if schema is not None:
        check_version(obj, schema, version if version is not None else 1, path=path, error=error)
    return convert(obj, kind, path=path, error=error)


def to_builtins(obj: Any) -> Any:
    """A record (or anything holding records) as plain JSON-ready Python objects: the value
    ``json.load`` would give back for it (arrays as lists, never tuples)."""
    return _lists(msgspec.to_builtins(obj, enc_hook=_enc_hook))


def _lists(obj: Any) -> Any:
    # msgspec keeps tuples as tuples; a reader comparing with parsed JSON expects lists.
    if isinstance(obj, dict):
        return {k: _lists(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_lists(v) for v in obj]
    return obj


def encode(obj: Any, *, indent: int = 1) -> str:
    """Canonical JSON text of a record or plain object (ends with a newline). NaN and
    infinities are refused: JSON has no spelling for them that every reader accepts."""
    return json.dumps(to_builtins(obj), indent=indent, allow_nan=False) + "\n"


def write(path: Path, obj: Any, *, replace: bool = True) -> None:
    """Write a record as JSON atomically (a temporary file, then a rename; ``_util``'s safe
    write: never over a directory or special file, over a file only with ``replace``)."""
    write_text_atomic(Path(path), encode(obj), replace=replace)


def json_schema(kind: type) -> dict:
    return msgspec.json.schema(kind, schema_hook=_schema_hook)


#: Every top-level file format: name → (the file it describes, "module:Record").
#: docs/schemas/<name>.schema.json is generated from these (tests keep them in step).
FORMATS: dict[str, tuple[str, str]] = {
    "snapshot": ("snapshot.json", "kpair.snapshot.model:Manifest"),
    "capture": ("capture.json", "kpair.capture.summary:CaptureSummary"),
    "profile": ("profile.json", "kpair.capture.profile:Profile"),
    "harness": ("harness.json", "kpair.harness:HarnessSpec"),
    "policy": ("validation_policy.json", "kpair.policy.schema:PolicyDocument"),
    "result": ("result.json", "kpair.result:Result"),
    "index": ("index.json", "kpair.release.index:Index"),
    "director_validation": ("director_validation.json",
                            "kpair.optimize.director:DirectorValidation"),
    "baseline": ("baseline.json", "kpair.release.index:BaselineRecord"),
    "plan": ("opt.plan.json", "kpair.plan:Plan"),
    # JSON lines: the schema is that of one line.
    "attempt": ("attempts.jsonl", "kpair.session:Attempt"),
}


def load_format(name: str) -> type:
    module, _, attr = FORMATS[name][1].partition(":")
    return getattr(importlib.import_module(module), attr)


def find_format(name: str) -> type | None:
    """The record of format ``name``, or None while its module or class is not written yet
    (the registry may name a format before the code that reads it lands)."""
    module, _, attr = FORMATS[name][1].partition(":")
    try:
        return getattr(importlib.import_module(module), attr, None)
    except ModuleNotFoundError as e:
        if e.name and module.startswith(e.name):
            return None
        raise  # the module exists and one of its own imports is missing: a real error


SCHEMA_DIR = Path("docs") / "schemas"


def schema_text(name: str) -> str:
    """The published JSON Schema of format ``name``, as ``docs/schemas/`` holds it."""
    filename, record = FORMATS[name]
    kind = load_format(name)
    body = json_schema(kind)
    top = body.get("$defs", {}).get(kind.__name__, {})
    required = top.get("required", [])
    if "schema_version" in top.get("properties", {}) and "schema_version" not in required:
        # Writers get the version as a default; readers (check_version) insist on it.
        top["required"] = [*required, "schema_version"]
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema",
              "title": f"one line of {filename}" if filename.endswith(".jsonl") else filename,
              "description": f"Generated from {record} by `python -m kpair.formats`; "
                             "docs/format.md explains the fields.",
              **body}
    return json.dumps(schema, indent=1, sort_keys=True) + "\n"


def write_schemas(directory: Path = SCHEMA_DIR) -> list[Path]:
    """Write ``<name>.schema.json`` into ``directory`` for every format whose code exists."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name in FORMATS:
        if find_format(name) is not None:
            path = directory / f"{name}.schema.json"
            path.write_text(schema_text(name))
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m kpair.formats",
                                     description="Write the JSON Schema of every kpair format.")
    parser.add_argument("directory", nargs="?", type=Path, default=SCHEMA_DIR,
                        help=f"where to write <name>.schema.json (default {SCHEMA_DIR})")
    args = parser.parse_args(argv)
    for path in write_schemas(args.directory):
        print(path)
    missing = [name for name in FORMATS if find_format(name) is None]
    if missing:
        print(f"not written (their records do not exist yet): {', '.join(missing)}")
    return 0


if __name__ == "__main__":
    # Run as a script this file is a second module, with its own Address and HexBytes
    # classes that the records do not use: hand over to the imported module.
    from kpair.formats import main as _main

    raise SystemExit(_main())
