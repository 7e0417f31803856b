"""The worker's environment: no PYTHON* variables, and glibc's allocator asked for huge pages
(``WORKER_MALLOC``) unless the user chose that tunable themselves."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import kpair.isolation as isolation
from conftest import record_matmul
from kpair._util import private_tempdir
from kpair.harness import create_harness
from kpair.pipeline import RunOptions
from kpair.protocol import Judge


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


# ---------------------------------------------------------------- no secret in argv or environ

#: A check seed no command line or environment holds by chance.
SEED = 8675309123457


def _descendants(root: int) -> list[int]:
    """Every live process below ``root``, from /proc."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    parent[int(entry)] = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, todo = [], [root]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        found += kids
        todo += kids
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_no_secret_is_on_a_workers_command_line_or_in_its_environment(tmp_path, matmul_libs,
                                                                      monkeypatch):
    """A worker started with a seed (``--seed``), set up and waiting for its candidate (its
    ref executor loaded): neither it nor anything below it shows the seed or the channel's
    key in /proc/PID/cmdline or /proc/PID/environ (read as root where the test runs as root:
    a non-dumpable process hides its environment from anyone else)."""
    keys = []

    def token_bytes(n):
        keys.append(os.urandom(n))
        return keys[-1]

    monkeypatch.setattr(isolation.secrets, "token_bytes", token_bytes)
    snap = record_matmul(matmul_libs["naive"], tmp_path / "snap", n=32)
    h = create_harness(snap, tmp_path / "h", opt=matmul_libs["fast"])
    options = RunOptions(seed=SEED, timeout_s=120, time_cap_s=1.0, min_blocks=4,
                         max_blocks=8)
    with private_tempdir("test") as scratch, \
            isolation.start(h.root, options, scratch, scratch / "log", session=True) as worker:
        assert worker.failed is None, worker.failed
        assert keys, "the worker's key was not drawn through secrets.token_bytes"
        secrets = [str(SEED).encode(), keys[-1], keys[-1].hex().encode()]
        pids = _descendants(os.getpid())
        assert worker.proc.pid in pids
        read = 0
        for pid in pids:
            for what in ("cmdline", "environ"):
                try:
                    with open(f"/proc/{pid}/{what}", "rb") as f:
                        data = f.read()
                except (PermissionError, ProcessLookupError, FileNotFoundError):
                    assert what == "environ" and os.geteuid() != 0, (pid, what)
                    continue
                read += 1
                for s in secrets:
                    assert s not in data, (pid, what, data[:200])
        assert read >= 2
        # The worker still has the options: it judges with the seed it was given.
        outcome = worker.judge(Judge(id=1, image=matmul_libs["fast"].read_bytes(),
                                     kernel="kp_matmul", format="elf-so"))
        assert outcome.result.checks.seed == SEED, outcome.result.summary()


def test_the_seed_argument_is_hidden_from_the_processs_own_command_line():
    """``kpair run --seed N``: the process that starts the worker overwrites N where
    /proc/PID/cmdline reads it (any process on the machine can); its own copy stays."""
    code = ("import sys; from kpair.isolation import hide_argument; "
            "n = hide_argument('--seed'); "
            "print(n, open('/proc/self/cmdline', 'rb').read().split(b'\\0')[3:], sys.argv[1:])")
    out = subprocess.run([sys.executable, "-c", code, "--seed", str(SEED), "x", "--seed=42"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == (f"15 [b'--seed', b'{'*' * 13}', b'x', b'--seed=**', b''] "
                           f"['--seed', '{SEED}', 'x', '--seed=42']"), out
