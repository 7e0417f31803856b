"""One way to read, validate and write every kpair file format.

Each format is a tree of ``Record`` structs (msgspec): typed fields, unknown fields refused,
constraints declared on the fields. ``decode`` turns a JSON document (or already parsed
object) into the top-level record and reports any violation as a ``FormatError`` that names
the file and the failing field's dotted path (``regions[2].address``), as every kpair reader
always has. ``encode`` writes the canonical JSON. ``json_schema`` exports the contract that
``docs/schemas/`` publishes; ``kpair.schemas.FORMATS`` lists the top-level records by file.

Two JSON shapes need a Python type of their own: 64-bit addresses, written as hex strings
("0x7f00") and used as ints (``Address``), and raw bytes written as hex (``HexBytes``).
"""

from __future__ import annotations

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


if __name__ == "__main__":
    # ``python -m kpair.formats`` writes the schemas: the registry of every format lives
    # above the modules it names, in ``kpair.schemas`` (run it from there).
    import runpy

    runpy.run_module("kpair.schemas", run_name="__main__", alter_sys=True)
