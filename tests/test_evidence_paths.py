"""Every evidence file and result file the README, the docs, the code and the benchmarks name
exists.

docs/evidence/ holds one file per capability (its README.md is the index); earlier raw logs
live in git history only. A reference to a path under docs/evidence/ that is not in the tree
is a broken link for a reader, so it fails here, naming the file, the line and the path.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EVIDENCE = ROOT / "docs" / "evidence"
PATH = re.compile(r"docs/evidence/[A-Za-z0-9_./-]*")
RESULT = re.compile(r"benchmarks/results/[A-Za-z0-9_./-]*")


def _sources() -> list[Path]:
    """The files whose references a reader follows: the README, the docs (the evidence
    files among them), the package, the benchmark scripts and the tests."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted(EVIDENCE.glob("*.md")), *sorted((ROOT / "src" / "kpair").rglob("*.py")),
             *sorted((ROOT / "benchmarks").glob("*.py")),
             *sorted((ROOT / "benchmarks").glob("*.sh")), *sorted((ROOT / "tests").rglob("*.py"))]
    return [f for f in files if f.is_file()]


def _in_history(line: str) -> bool:
    """A line that says a path is kept in git history (the raw logs of earlier runs)."""
    return "git history" in line or "git show" in line or "git archive" in line


def _missing(pattern: re.Pattern) -> list[str]:
    missing = []
    for f in _sources():
        lines = f.read_text(encoding="utf-8", errors="replace").splitlines()
        for n, line in enumerate(lines, 1):
            if any(_in_history(x) for x in lines[max(0, n - 2):n + 1]):
                continue   # this line, the one before or the one after says "git history"
            for m in pattern.finditer(line):
                p = m.group(0).rstrip(".,")
                if not (ROOT / p).exists():
                    missing.append(f"{f.relative_to(ROOT)}:{n}: {p}")
    return missing


def test_every_named_evidence_path_exists():
    missing = _missing(PATH)
    assert not missing, "evidence paths that do not exist:\n" + "\n".join(missing)


def test_every_named_result_path_exists():
    """The same for benchmarks/results (``benchmarks/results/README.md`` indexes it)."""
    missing = _missing(RESULT)
    assert not missing, "result paths that do not exist:\n" + "\n".join(missing)


def test_the_index_names_every_evidence_file_and_only_those():
    index = (EVIDENCE / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"\]\(([A-Za-z0-9_.-]+)\)", index))
    present = {p.name for p in EVIDENCE.iterdir() if p.is_file() and p.name != "README.md"}
    assert named == present, (sorted(named - present), sorted(present - named))
    assert not [p for p in EVIDENCE.iterdir() if p.is_dir()], "no folders under docs/evidence"
