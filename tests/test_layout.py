"""The package's layering (pyproject.toml, [tool.importlinter]) holds, nothing imports in a
cycle (checked with import-linter, as CI does), and one name means one class."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "kpair"


def test_import_contracts_hold():
    # The environment running the tests (its bin/ need not be on PATH), else PATH.
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or \
        shutil.which("lint-imports")
    if exe is None:
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    proc = subprocess.run([exe, str(ROOT / "pyproject.toml")], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_import_cycle():
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("kpair")
    cycles = []
    for importer in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(importer):
            if importer == imported or importer.startswith(imported + ".") \
                    or imported.startswith(importer + "."):
                continue  # a package re-exporting its own modules
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back:
                cycles.append(" -> ".join((importer, *back)))
    assert not cycles, "\n".join(cycles)


def test_no_class_name_is_defined_twice():
    where: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(str(path.relative_to(SRC)))
    twice = {name: files for name, files in where.items() if len(files) > 1}
    assert not twice, twice
