"""The README's CPU walk-through runs as written: its marked bash block, in an empty directory,
on the host backend, with this checkout's kpair (a newcomer's first own release)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kpair

README = Path(__file__).resolve().parents[1] / "README.md"
MARKER = "<!-- readme-walkthrough:"


def walkthrough() -> str:
    text = README.read_text()
    assert text.count(MARKER) == 1, f"README.md must mark one walk-through block with {MARKER}"
    m = re.search(re.escape(MARKER) + r".*?-->\n```bash\n(.*?)\n```", text, re.S)
    assert m, "the marker must be followed by a ```bash block"
    return m[1]


def test_the_walkthrough_is_complete():
    block = walkthrough()
    for step in ("cc -shared", "record_call(", "kpair pair", "kpair run", "kpair release add",
                 "kpair report"):
        assert step in block, step


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")
def test_the_readme_walkthrough_runs(tmp_path):
    shim = tmp_path / "bin"
    shim.mkdir()
    # `kpair` and `python` as the walk-through types them, both this interpreter and checkout.
    (shim / "kpair").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m kpair "$@"\n')
    (shim / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    for f in shim.iterdir():
        f.chmod(0o755)
    src = str(Path(kpair.__file__).resolve().parents[1])
    env = {**os.environ, "PATH": f"{shim}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", walkthrough()], cwd=work,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert "PASS: byte-exact" in proc.stdout
    assert "added level1/1_RowSum" in proc.stdout
    index = json.loads((work / "rel" / "index.json").read_text())
    (row,) = index["operators"]
    assert row["name"] == "1_RowSum" and row["status"] == "pass"
    assert row["harness"]["speedup"] > 1.0
    assert (work / "rel" / "report.md").is_file()
