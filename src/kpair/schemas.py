"""The registry of kpair's top-level file formats, and their published JSON Schemas.

``FORMATS`` maps a format's name to the file it describes and its record (a
``kpair.formats.Record``). The registry sits above every module it names (its imports are
plain imports, so the layering contracts see each one); ``kpair.formats`` itself knows no
format. ``python -m kpair.schemas [DIR]`` (or ``python -m kpair.formats``) writes
``docs/schemas/<name>.schema.json`` for each; tests keep the published files in step.
"""

from __future__ import annotations

import json
from pathlib import Path

from .capture.profile import Profile
from .capture.summary import CaptureSummary
from .formats import json_schema
from .harness import HarnessSpec
from .optimize.director import DirectorValidation
from .optimize.ranges import RangeCandidates
from .plan import Plan
from .policy.schema import PolicyDocument
from .release.index import BaselineRecord, Index
from .release.tournament import RunLog, TournamentRecord
from .result import Result
from .session import Attempt
from .snapshot.model import Manifest

#: Every top-level file format: name → (the file it describes, its record).
#: docs/schemas/<name>.schema.json is generated from these (tests keep them in step).
FORMATS: dict[str, tuple[str, type]] = {
    "snapshot": ("snapshot.json", Manifest),
    "capture": ("capture.json", CaptureSummary),
    "profile": ("profile.json", Profile),
    "harness": ("harness.json", HarnessSpec),
    "policy": ("validation_policy.json", PolicyDocument),
    "result": ("result.json", Result),
    "index": ("index.json", Index),
    "director_validation": ("director_validation.json", DirectorValidation),
    "baseline": ("baseline.json", BaselineRecord),
    "plan": ("opt.plan.json", Plan),
    "range_candidates": ("range_candidates.json", RangeCandidates),
    "tournament": ("tournament.json", TournamentRecord),
    "tournament_run": ("tournament_run.json", RunLog),
    # JSON lines: the schema is that of one line.
    "attempt": ("attempts.jsonl", Attempt),
}

SCHEMA_DIR = Path("docs") / "schemas"


def load_format(name: str) -> type:
    """The record of format ``name`` (KeyError for a name that is not a format)."""
    return FORMATS[name][1]


def schema_text(name: str) -> str:
    """The published JSON Schema of format ``name``, as ``docs/schemas/`` holds it."""
    filename, kind = FORMATS[name]
    body = json_schema(kind)
    top = body.get("$defs", {}).get(kind.__name__, {})
    required = top.get("required", [])
    if "schema_version" in top.get("properties", {}) and "schema_version" not in required:
        # Writers get the version as a default; readers (check_version) insist on it.
        top["required"] = [*required, "schema_version"]
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema",
              "title": f"one line of {filename}" if filename.endswith(".jsonl") else filename,
              "description": f"Generated from {kind.__module__}:{kind.__name__} by "
                             "`python -m kpair.formats`; docs/format.md explains the fields.",
              **body}
    return json.dumps(schema, indent=1, sort_keys=True) + "\n"


def write_schemas(directory: Path = SCHEMA_DIR) -> list[Path]:
    """Write ``<name>.schema.json`` into ``directory`` for every format."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name in FORMATS:
        path = directory / f"{name}.schema.json"
        path.write_text(schema_text(name))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m kpair.schemas",
                                     description="Write the JSON Schema of every kpair format.")
    parser.add_argument("directory", nargs="?", type=Path, default=SCHEMA_DIR,
                        help=f"where to write <name>.schema.json (default {SCHEMA_DIR})")
    args = parser.parse_args(argv)
    for path in write_schemas(args.directory):
        print(path)
    return 0


__all__ = ["FORMATS", "SCHEMA_DIR", "load_format", "main", "schema_text", "write_schemas"]


if __name__ == "__main__":
    raise SystemExit(main())
