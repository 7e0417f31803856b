"""Hostile candidates and hostile files (host backend): no forged verdict, no code run from a
release or working directory, no output let through, no process or temporary directory left
behind, a clear error and exit status for every bad input.

The attacking kernels are in tests/csrc/hostile.c; each writes a wrong answer and then tries
to make kpair say "pass" anyway, or to get out of its worker.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import CSRC, record_matmul
from kpair.cli import main as kpair
from kpair.errors import PolicyError
from kpair.harness import create_harness, write_manifest
from kpair.policy import Policy, Tolerance
from kpair.toolchain import compile_shared

HOSTILE = {"forge_file": 1, "forge_channel": 2, "flood": 3, "escape": 4, "spin": 5}
QUICK = ["--time-cap", "1", "--min-blocks", "4", "--max-blocks", "8", "--timeout", "120"]
SANDBOXED = platform.system() == "Linux" and platform.machine() in ("x86_64", "aarch64")
KPAIR = [sys.executable, "-c", "import sys; from kpair.cli import main; sys.exit(main())"]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, matmul_libs):
    d = tmp_path_factory.mktemp("hostile")
    marker = d / "escaped"
    libs = {name: compile_shared(CSRC / "hostile.c", d / f"{name}.so", defines={
        "KP_HOSTILE": k, "KP_MARKER": f'"{marker}"'}) for name, k in HOSTILE.items()}
    snap = record_matmul(matmul_libs["naive"], d / "snap", n=32)
    count = iter(range(1000))

    def pair(opt: str | Path, **kw) -> Path:
        lib = libs[opt] if isinstance(opt, str) and opt in libs else matmul_libs[opt]
        return create_harness(snap, d / f"h{next(count)}-{opt}", opt=lib, **kw).root

    pair.marker, pair.snap, pair.dir, pair.libs = marker, snap, d, libs
    return pair


def _run_cli(args: list[str], cwd: Path | None = None, env: dict | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess:
    """kpair as a user runs it: a separate process, from ``cwd``."""
    return subprocess.run(KPAIR + args, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


# ----------------------------------------------------------- forged verdicts, escapes


def test_an_opt_that_writes_result_files_forges_nothing(hostile, tmp_path):
    h = hostile("forge_file")
    forged = Path(tempfile.gettempdir()) / "kpair-forged-result.json"
    forged.unlink(missing_ok=True)
    proc = _run_cli(["run", str(h), "--json", *QUICK], cwd=tmp_path)
    result = json.loads(proc.stdout)
    assert proc.returncode == 1 and result["status"] == "fail" and result["correct"] is False
    assert json.loads((h / "result.json").read_text())["status"] == "fail"
    assert not forged.exists() and not (tmp_path / "result.json").exists()
    if SANDBOXED:
        assert result["sandbox"]["mechanism"] == \
            "seccomp allowlist (libseccomp) + separate process"


def test_fake_messages_on_every_descriptor_are_not_taken_for_kpairs(hostile):
    h = hostile("forge_channel")
    assert kpair(["run", str(h), *QUICK]) == 1
    result = json.loads((h / "result.json").read_text())
    assert result["status"] == "fail"
    # The kernel runs in an executor that does not hold the channel: nothing it writes
    # reaches it (its stdout and stderr are the log).
    assert "unsigned channel lines ignored" not in (h / "worker.log").read_text()
    assert not _scratch_of(os.getpid())  # the run's scratch directory went with it


def test_a_flooding_opt_reaches_neither_stdout_nor_the_json(hostile, tmp_path):
    h = hostile("flood")
    proc = _run_cli(["run", str(h), "--json", *QUICK], cwd=tmp_path)
    result = json.loads(proc.stdout)  # valid JSON: nothing the kernel printed is in it
    assert result["status"] == "fail" and result["log"] == "worker.log"
    assert "99.000x" not in proc.stdout and "99.000x" not in proc.stderr
    log = (h / "worker.log").read_bytes()
    assert len(log) < (1 << 20) + 4096 and b"more bytes of output dropped" in log


@pytest.mark.skipif(not SANDBOXED, reason="the seccomp sandbox covers Linux x86_64/aarch64")
def test_an_opt_cannot_run_commands_fork_connect_or_signal_its_parent(hostile):
    h = hostile("escape")
    # system() blocks SIGSYS before it asks for a process: the sandbox's refusal kills the
    # executor (a crash, exit 5, named), not this process, and nothing ran.
    assert kpair(["run", str(h), *QUICK]) == 5     # and this process is still alive
    result = json.loads((h / "result.json").read_text())
    assert result["status"] == "error" and not hostile.marker.exists()
    assert "crashed: SIGSYS: it made a system call the sandbox refuses" in \
        result["error"]["message"], result["error"]
    assert result["sandbox"]["default_action"].startswith("EPERM, reported")
    assert result["sandbox"]["no_new_privs"]


def test_a_kpair_package_in_the_working_directory_is_not_imported(hostile, tmp_path):
    """``cd REL && kpair verify .``: a kpair/ folder there must not replace kpair's worker."""
    shadow = tmp_path / "kpair"
    shadow.mkdir()
    planted = tmp_path / "shadow-ran"
    (shadow / "__init__.py").write_text(f"open({str(planted)!r}, 'w').write('x')\n")
    h = hostile("flood")
    exe = Path(sys.executable).with_name("kpair")
    if not exe.exists():
        pytest.skip("the kpair console script is not installed beside this python")
    env = {**os.environ, "PYTHONSTARTUP": str(shadow / "__init__.py")}
    proc = subprocess.run([str(exe), "run", str(h), "--json", *QUICK], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert json.loads(proc.stdout)["status"] == "fail" and not planted.exists()


# ----------------------------------------------------------- lifetimes


def _workers_of(harness: Path) -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"kpair.isolation" in b" ".join(cmd) and str(harness).encode() in cmd:
                pids.append(int(p.name))
    return pids


def _wait(predicate, timeout: float = 60.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def _scratch_of(pid: int) -> list[Path]:
    return list(Path(tempfile.gettempdir()).glob(f"kpair-run-{pid}-*"))


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="process listing reads /proc")
@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT", "SIGTERM"])
def test_no_worker_or_scratch_outlives_its_parent(hostile, how):
    h = hostile("spin")
    # SIGINT as at a terminal: a suite started in the background (``cmd &`` in a script)
    # runs with SIGINT ignored, and a child would inherit that and never see Ctrl-C.
    parent = subprocess.Popen(KPAIR + ["run", str(h), "--timeout", "300"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert _wait(lambda: _workers_of(h)), "the worker never started"
        assert _scratch_of(parent.pid)
        parent.send_signal(getattr(signal, how))
        parent.wait(timeout=60)
        assert _wait(lambda: not _workers_of(h), 30), f"worker left running after {how}"
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in _workers_of(h):
            os.kill(pid, signal.SIGKILL)
    if how == "SIGINT":
        assert parent.returncode == 130 and not _scratch_of(parent.pid)
    # A later command sweeps what a killed one could not remove.
    assert kpair(["run", str(hostile("fast")), *QUICK]) == 0
    assert not _scratch_of(parent.pid)


# ----------------------------------------------------------- hostile files


def _edit_json(path: Path, **changes) -> None:
    obj = json.loads(path.read_text())
    obj.update(changes)
    path.write_text(json.dumps(obj))


def _dotfile(h: Path) -> None:
    (h / ".hidden").write_text("x")


def _fifo(h: Path) -> None:
    os.mkfifo(h / "capture" / "pipe")


def _empty_dir(h: Path) -> None:
    (h / "capture" / "nothing").mkdir()


def _duplicate_line(h: Path) -> None:
    lines = (h / "MANIFEST.sha256").read_text().splitlines()
    (h / "MANIFEST.sha256").write_text("\n".join(lines + lines[:1]) + "\n")


def _unknown_field(h: Path) -> None:
    _edit_json(h / "harness.json", surprise=1)
    write_manifest(h)


def _foreign_arch(h: Path) -> None:
    _edit_json(h / "harness.json", arch="aarch64" if platform.machine() != "aarch64"
               else "x86_64")
    write_manifest(h)


def _unknown_backend(h: Path) -> None:
    _edit_json(h / "harness.json", backend="opencl")
    write_manifest(h)


STRICT = [(_dotfile, "not listed in the manifest"), (_fifo, "not a regular file"),
          (_empty_dir, "not a regular file"), (_duplicate_line, "listed twice"),
          (_unknown_field, "surprise"), (_foreign_arch, "differs from the snapshot"),
          (_unknown_backend, "backend")]


@pytest.mark.parametrize(("spoil", "phrase"), STRICT, ids=[f.__name__[1:] for f, _ in STRICT])
def test_a_harness_breaking_a_format_rule_is_refused(hostile, capsys, spoil, phrase):
    h = hostile("fast")
    spoil(h)
    assert kpair(["run", str(h), *QUICK]) == 3
    result = json.loads((h / "result.json").read_text())
    assert result["status"] == "error" and result["correct"] is None
    assert phrase in result["error"]["message"], result["error"]["message"]


def test_a_harness_for_a_backend_without_its_driver_exits_4(hostile):
    """A hip harness where hip-python is absent: backend unavailable, not a usage error."""
    pytest.importorskip("numpy")
    try:
        import hip  # noqa: F401
        pytest.skip("hip-python is installed here")
    except ImportError:
        pass
    h = hostile("fast")
    snap = h / "capture" / "snapshot.json"
    _edit_json(snap, backend="hip", arch="gfx942")
    _edit_json(h / "harness.json", backend="hip", arch="gfx942")
    write_manifest(h)
    assert kpair(["run", str(h), *QUICK]) == 4
    result = json.loads((h / "result.json").read_text())
    assert result["error"]["type"] == "BackendUnavailable"
    assert "kpair[hip]" in result["error"]["message"]


@pytest.mark.parametrize("which", ["missing", "directory", "missing-ref", "empty"])
def test_pair_refuses_bad_binaries_as_bad_input(hostile, tmp_path, capsys, which):
    """A missing, empty or non-file code object is a bad input file: exit 3, as a missing or
    corrupt snapshot is (README "Exit codes")."""
    empty = tmp_path / "empty.so"
    empty.write_bytes(b"")
    args = {"missing": ["--opt", str(tmp_path / "none.so")],
            "directory": ["--opt", str(tmp_path)],
            "missing-ref": ["--opt", str(empty), "--ref", str(tmp_path / "none.so")],
            "empty": ["--opt", str(empty)]}[which]
    assert kpair(["pair", str(hostile.snap), *args, "-o", str(tmp_path / "h")]) == 3
    err = capsys.readouterr().err
    assert err.startswith("kpair pair: --") and "Traceback" not in err
    assert not (tmp_path / "h").exists()


# ----------------------------------------------------------- policies that cannot fail


def _loose(n: int, **kw) -> Tolerance:
    return Tolerance("c", 0, n * n * 4, "float32", **kw)


@pytest.mark.parametrize("tol", [
    {"criterion": "allclose", "atol": 1e308, "rtol": 1e308},
    {"criterion": "allclose", "atol": 100.0, "rtol": 0.0},
    {"criterion": "ulp", "max_ulp": 2**31},
], ids=["allclose-1e308", "allclose-wider-than-the-data", "ulp-covers-everything"])
def test_a_tolerance_a_constant_output_meets_is_refused(hostile, tmp_path, tol):
    with pytest.raises(PolicyError, match="cannot fail: a constant output"):
        create_harness(hostile.snap, tmp_path / "h", opt=hostile.libs["flood"],
                       policy=Policy((_loose(32, **tol),)))
    assert not (tmp_path / "h").exists()


def test_a_cosine_threshold_a_constant_meets_is_refused(matmul_libs, tmp_path):
    """C = A B with A, B close to all-ones: every output is close to n, so a constant output
    has cosine 0.99999... with the answer: cosine >= 0.9999 judges nothing there."""
    from kpair.record import record_call

    n = 32
    rng = np.random.default_rng(1)
    a, b = ((1.0 + 1e-3 * rng.standard_normal((n, n))).astype(np.float32) for _ in range(2))
    snap = record_call(matmul_libs["naive"], "kp_matmul", [a, b, np.zeros((n, n), np.float32),
                                                           np.int32(n)], tmp_path / "s",
                       names=["a", "b", "c", "n"])
    cos = Tolerance("c", 0, n * n * 4, "float32", "cosine", min_cosine=0.9999)
    with pytest.raises(PolicyError, match="cannot fail: a constant output"):
        create_harness(snap.root, tmp_path / "h", opt=matmul_libs["fast"], policy=Policy((cos,)))


def test_allow_loose_keeps_a_loose_tolerance_only_with_a_note(hostile, matmul_libs, tmp_path):
    tol = _loose(32, criterion="allclose", atol=100.0, rtol=0.0)
    with pytest.raises(PolicyError, match="needs a note"):
        Policy((tol,), allow_loose=True)
    kept = Policy((tol,), note="outputs are only compared for shape in this demo",
                  allow_loose=True)
    h = create_harness(hostile.snap, tmp_path / "h", opt=matmul_libs["fast"], policy=kept)
    assert h.policy.allow_loose and h.policy.note
