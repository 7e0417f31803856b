"""The worker's environment: no PYTHON* variables, and glibc's allocator asked for huge pages
(``WORKER_MALLOC``) unless the user chose that tunable themselves."""

from __future__ import annotations

import pytest

import kpair.isolation as isolation


@pytest.mark.parametrize(("theirs", "expected"), [
    (None, isolation.WORKER_MALLOC),
    ("glibc.malloc.arena_max=2", f"glibc.malloc.arena_max=2:{isolation.WORKER_MALLOC}"),
    ("glibc.malloc.hugetlb=0", "glibc.malloc.hugetlb=0"),
])
def test_the_worker_asks_for_huge_pages_unless_the_user_chose(monkeypatch, theirs, expected):
    monkeypatch.setenv("PYTHONSTARTUP", "/nowhere/startup.py")
    monkeypatch.setenv("KPAIR_TEST_MARK", "kept")
    if theirs is None:
        monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    else:
        monkeypatch.setenv("GLIBC_TUNABLES", theirs)
    env = isolation._worker_env()
    assert env["GLIBC_TUNABLES"] == expected
    assert env["KPAIR_TEST_MARK"] == "kept"
    assert not [k for k in env if k.startswith("PYTHON")]
