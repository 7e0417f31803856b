"""record_call: typed scalars (bare Python numbers refused with what to pass), the docstring's
own example, and a kernel that crashes or hangs costs the caller an error, not its process
and not a half-written snapshot."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import CSRC
from kpair import record
from kpair.errors import DriverError, KpairError, UsageError, WorkerFailed
from kpair.record import record_call
from kpair.snapshot import Snapshot
from kpair.toolchain import compile_shared

SAXPY = """
void saxpy(int n, float a, const float *x, float *y) {
    for (int i = 0; i < n; i++) y[i] = a * x[i] + y[i];
}
"""


@pytest.fixture(scope="module")
def saxpy(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("saxpy")
    (d / "saxpy.c").write_text(SAXPY)
    return compile_shared(d / "saxpy.c", d / "saxpy.so")


@pytest.fixture(scope="module")
def faults(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("faults")
    return {name: compile_shared(CSRC / "faulty.c", d / f"{name}.so", defines={"KP_FAULT": v})
            for name, v in (("crash", 1), ("hang", 2))}


def _nothing_left(parent: Path, out: Path) -> None:
    assert not out.exists()
    assert [p.name for p in parent.iterdir() if p.name.startswith(".")] == []


def test_the_docstring_example_records_a_correct_call(saxpy, tmp_path):
    n = 1000
    x = np.arange(n, dtype=np.float32)
    y = np.ones(n, dtype=np.float32)
    snap = record_call(saxpy, "saxpy", [np.int32(n), np.float32(2.0), x, y], tmp_path / "s",
                       names=["n", "a", "x", "y"])
    np.testing.assert_array_equal(y, 2 * x + 1)       # the call really happened
    m = Snapshot.open(tmp_path / "s").manifest
    assert [(p.name, p.kind, p.size) for p in m.kernarg.params] == [
        ("n", "i32", 4), ("a", "f32", 4), ("x", "pointer", 8), ("y", "pointer", 8)]
    assert snap.root == tmp_path / "s"
    (post,) = [snap.post(i) for i, r in enumerate(m.regions) if r.name == "y"]
    np.testing.assert_array_equal(np.frombuffer(post, np.float32), y)
    assert [p.name for p in tmp_path.iterdir()] == ["s"]  # no staging left beside it


def test_ctypes_scalars_say_their_size_too(saxpy, tmp_path):
    x, y = np.ones(8, np.float32), np.zeros(8, np.float32)
    record_call(saxpy, "saxpy", [ctypes.c_int(8), ctypes.c_float(3.0), x, y], tmp_path / "s")
    np.testing.assert_array_equal(y, 3 * x)
    kinds = [p.kind for p in Snapshot.open(tmp_path / "s").manifest.kernarg.params]
    assert kinds == ["i32", "f32", "pointer", "pointer"]


@pytest.mark.parametrize("bad, hint", [(8, "np.int32(8)"), (2.0, "np.float32(2.0)"),
                                       (True, "np.int32"), ("8", "typed scalar")])
def test_an_ambiguous_python_scalar_is_refused_with_what_to_pass(saxpy, tmp_path, bad, hint):
    x, y = np.ones(8, np.float32), np.zeros(8, np.float32)
    args = [np.int32(8), np.float32(2.0), x, y]
    args[0 if not isinstance(bad, float) else 1] = bad
    with pytest.raises(UsageError, match=r"argument [01] \((n|a)\)") as e:
        record_call(saxpy, "saxpy", args, tmp_path / "s", names=["n", "a", "x", "y"])
    assert hint in str(e.value)
    _nothing_left(tmp_path, tmp_path / "s")
    assert not y.any()                                  # nothing ran


def test_a_crashing_kernel_is_an_error_and_leaves_nothing(faults, tmp_path):
    a = np.ones((16, 16), np.float32)
    c = np.full((16, 16), 7, np.float32)
    with pytest.raises(DriverError, match="SIGSEGV") as e:
        record_call(faults["crash"], "kp_matmul", [a, a.copy(), c, np.int32(16)],
                    tmp_path / "s")
    assert e.value.exit_code == 5
    _nothing_left(tmp_path, tmp_path / "s")
    assert (c == 7).all()                               # the caller's arrays untouched


def test_a_hanging_kernel_is_killed_at_the_timeout(faults, tmp_path):
    a = np.ones((16, 16), np.float32)
    with pytest.raises(WorkerFailed, match="did not finish within 3 s"):
        record_call(faults["hang"], "kp_matmul", [a, a.copy(), a.copy(), np.int32(16)],
                    tmp_path / "s", timeout_s=3)
    _nothing_left(tmp_path, tmp_path / "s")


def test_a_child_that_dies_is_an_error_naming_the_signal(saxpy, tmp_path, monkeypatch):
    # Whatever kills the recording process (a driver fault, the OOM killer) looks like this.
    monkeypatch.setattr(record, "child_command", lambda *args: [
        sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    x, y = np.ones(8, np.float32), np.zeros(8, np.float32)
    with pytest.raises(WorkerFailed, match="died \\(signal SIGKILL\\)"):
        record_call(saxpy, "saxpy", [np.int32(8), np.float32(1), x, y], tmp_path / "s")
    _nothing_left(tmp_path, tmp_path / "s")


def test_errors_of_the_child_keep_their_class_and_fields(saxpy, tmp_path):
    x, y = np.ones(8, np.float32), np.zeros(8, np.float32)
    with pytest.raises(KpairError, match="nosuch") as e:
        record_call(saxpy, "nosuch", [np.int32(8), np.float32(1), x, y], tmp_path / "s")
    assert e.value.exit_code == 4                       # symbol not found
    _nothing_left(tmp_path, tmp_path / "s")


def test_out_must_be_new_or_empty(saxpy, tmp_path):
    x, y = np.ones(8, np.float32), np.zeros(8, np.float32)
    args = [np.int32(8), np.float32(1), x, y]
    (tmp_path / "file").write_text("mine")
    with pytest.raises(UsageError, match="not a directory"):
        record_call(saxpy, "saxpy", args, tmp_path / "file")
    assert (tmp_path / "file").read_text() == "mine"
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep").write_text("mine")
    with pytest.raises(UsageError, match="not empty"):
        record_call(saxpy, "saxpy", args, tmp_path / "full")
    with pytest.raises(UsageError, match="create it first"):
        record_call(saxpy, "saxpy", args, tmp_path / "no" / "such")
    (tmp_path / "empty").mkdir()
    record_call(saxpy, "saxpy", args, tmp_path / "empty", isolate=False)  # in this process
    assert Snapshot.open(tmp_path / "empty").manifest.code.kernel_name == "saxpy"
    np.testing.assert_array_equal(y, x)
    with pytest.raises(KpairError, match="cannot read"):
        record_call(tmp_path / "missing.so", "saxpy", args, tmp_path / "t")
