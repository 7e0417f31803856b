"""The format registry: every published JSON Schema is what the code generates, and the
records behave as one strict reader (types, unknown fields, field paths in errors)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kpair import formats, schemas
from kpair.errors import FormatError
from kpair.formats import Address, HexBytes, Invalid, Record
from kpair.schemas import FORMATS

DATA = Path(__file__).parent / "data"

SCHEMAS = Path(__file__).resolve().parents[1] / "docs" / "schemas"


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_the_published_schema_is_what_the_code_generates(name):
    path = SCHEMAS / f"{name}.schema.json"
    assert path.is_file(), f"{path} missing: run python -m kpair.formats"
    assert path.read_text() == schemas.schema_text(name), \
        f"{path} is stale: run python -m kpair.formats"


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_published_schema_lists_each_required_field_once(name):
    def lists(node):
        if isinstance(node, dict):
            if isinstance(node.get("required"), list):
                yield node["required"]
            for v in node.values():
                yield from lists(v)
        elif isinstance(node, list):
            for v in node:
                yield from lists(v)

    for required in lists(json.loads(schemas.schema_text(name))):
        assert len(required) == len(set(required)), required


def test_the_snapshot_schema_accepts_a_real_manifest():
    jsonschema = pytest.importorskip("jsonschema")
    manifest = json.loads((Path(__file__).parent / "data" / "snapshot_v1" / "snapshot.json")
                          .read_text())
    schema = json.loads((SCHEMAS / "snapshot.schema.json").read_text())
    jsonschema.validate(manifest, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**manifest, "surprise": 1}, schema)


def test_the_generator_writes_every_format(tmp_path):
    written = schemas.write_schemas(tmp_path)
    assert {p.name for p in written} == {f"{n}.schema.json" for n in FORMATS}
    assert all(p.read_text() == schemas.schema_text(p.name.split(".")[0]) for p in written)


def test_the_registry_names_each_record_by_its_own_module():
    """Each record is imported by ``kpair.schemas`` (seen by the layering contracts), and
    the schema says where it comes from."""
    for name, (_, kind) in FORMATS.items():
        doc = json.loads(schemas.schema_text(name))
        assert f"{kind.__module__}:{kind.__name__}" in doc["description"]
        assert schemas.load_format(name) is kind


class Inner(Record):
    at: Address
    raw: HexBytes = HexBytes(b"")

    def __post_init__(self):
        if self.at == 0:
            raise Invalid("null address", "at")


class Outer(Record):
    items: list[Inner]
    count: int = 0


def test_errors_name_the_file_and_the_field_path():
    ok = formats.convert({"items": [{"at": "0x10", "raw": "00ff"}]}, Outer)
    assert ok.items[0].at == 16 and ok.items[0].raw == b"\0\xff"
    assert formats.to_builtins(ok) == {"items": [{"at": "0x10", "raw": "00ff"}], "count": 0}
    cases = [({"items": [{"at": "0x10"}, {"at": "16"}]}, "items[1].at", "hex address"),
             ({"items": [{"at": "0x0"}]}, "items[0].at", "null address"),
             ({"items": [], "count": True}, "count", "expected integer, got boolean"),
             ({"items": [], "extra": 1}, "extra", "unknown field"),
             ({}, "items", "missing")]
    for obj, field, message in cases:
        with pytest.raises(FormatError) as e:
            formats.convert(obj, Outer, path="f.json", field="doc")
        assert e.value.field == f"doc.{field}" and message in str(e.value)
        assert str(e.value).startswith("f.json: field doc.")


def test_a_rule_broken_in_code_is_a_format_error_too():
    with pytest.raises(FormatError, match="field at: null address"):
        Inner(Address(0))


@pytest.mark.parametrize("status", ["pass", "fail", "error"])
def test_a_result_written_before_the_typed_record_loads(status):
    """result.json files written by kpair 0.1's untyped writer (tests/data/result_v1_*.json,
    produced by commit e5d85e3) read through the strict Result reader unchanged."""
    from kpair.result import Result

    path = DATA / f"result_v1_{status}.json"
    result = Result.read(path)
    assert result.status == status and result.correct is {"pass": True, "fail": False,
                                                          "error": None}[status]
    original = json.loads(path.read_text())
    assert result.to_json() == {k: v for k, v in original.items()}
    assert result.summary().startswith({"pass": "PASS", "fail": "FAIL", "error": "ERROR"}[status])
