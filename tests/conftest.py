"""Shared fixtures: C kernels built with the system compiler, and a recorded host snapshot."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from kpair.record import Recorder, record_call
from kpair.toolchain import compile_shared

CSRC = Path(__file__).parent / "csrc"


def mlp_arrays(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """a, b (n x n), bias (n) from ``seed``, and a zeroed out (n x n): the host range's arrays."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    return {"a": a, "b": b, "bias": bias, "out": np.zeros((n, n), np.float32)}


def record_mlp_range(lib: Path, out: Path, x: dict, n: int, **recorder):
    """The host range of tests/csrc/range_ops.c: out = relu(a @ b + bias), three calls over
    ``x``'s arrays, ``out`` declared; its Snapshot."""
    with Recorder(out, names={k: x[k] for k in ("a", "b", "bias", "out")},
                  outputs=[x["out"]], **recorder) as r:
        r.call(lib, "kp_matmul", [x["a"], x["b"], x["out"], np.int32(n)])
        r.call(lib, "kp_bias", [x["out"], x["bias"], np.int32(n)])
        r.call(lib, "kp_relu", [x["out"], np.int32(n)])
    return r.snapshot


def range_arrays(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """:func:`mlp_arrays` and a candidate's own zeroed output ``out2`` (n x n) and the fused
    function's scratch ``row`` (n)."""
    return {**mlp_arrays(n, seed), "out2": np.zeros((n, n), np.float32),
            "row": np.zeros(n, np.float32)}


class MlpRanges:
    """tests/csrc/range_ops.c's host ranges over one set of arrays (:func:`range_arrays`):
    the reference (:meth:`ref`) and candidates (:meth:`candidate`) made of ``three`` (matmul,
    bias, ReLU writing ``out2``) or ``fused`` (one call)."""

    def __init__(self, lib: Path, n: int, seed: int = 0):
        self.lib, self.n = lib, n
        x = self.x = range_arrays(n, seed)
        n32 = np.int32(n)
        self.three = [("kp_matmul", [x["a"], x["b"], x["out2"], n32]),
                      ("kp_bias", [x["out2"], x["bias"], n32]), ("kp_relu", [x["out2"], n32])]
        self.fused = [("kp_fused", [n32, x["bias"], x["a"], x["b"], x["out2"], x["row"]])]

    @staticmethod
    def build(folder: Path) -> Path:
        """range_ops.c built (-O2 -g) as ``folder/ops.so``."""
        return compile_shared(CSRC / "range_ops.c", folder / "ops.so", flags=("-O2", "-g"))

    def ref(self, out: Path) -> Path:
        """The reference range (:func:`record_mlp_range`, writing ``out``); its root."""
        return record_mlp_range(self.lib, out, self.x, self.n).root

    def candidate(self, out: Path, calls: list[tuple[str, list]],
                  scratch: bool = False) -> Path:
        """A candidate range: ``calls`` writing ``out2`` (zeroed first), declared;
        ``scratch``: ``row`` declared scratch. Its root."""
        x = self.x
        x["out2"][...] = 0
        names = {k: x[k] for k in ("a", "b", "bias", "out2")}
        if scratch:
            names["row"] = x["row"]
        with Recorder(out, names=names, outputs=[x["out2"]],
                      scratch=[x["row"]] if scratch else []) as r:
            for fn, args in calls:
                r.call(self.lib, fn, args)
        return r.snapshot.root


@pytest.fixture(scope="session")
def matmul_libs(tmp_path_factory) -> dict[str, Path]:
    """kp_matmul built three ways: naive (ref), loop-reordered (fast, bit-identical), buggy."""
    d = tmp_path_factory.mktemp("matmul")
    return {name: compile_shared(CSRC / "matmul.c", d / f"{name}.so",
                                 defines={"KP_VARIANT": v})
            for name, v in (("naive", 0), ("fast", 1), ("offbyone", 2))}


def record_matmul(lib: Path, out: Path, n: int = 128, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.full((n, n), np.nan, np.float32)
    record_call(lib, "kp_matmul", [a, b, c, np.int32(n)], out, names=["a", "b", "c", "n"])
    return out


def record_rowsum(out: Path) -> tuple[Path, Path]:
    """kp_rowsum (tests/csrc/rowsum.c) built into ``out`` and one call of it recorded there:
    (the library, the snapshot). ref aborts when rowptr decreases, as a permutation makes it."""
    lib = compile_shared(CSRC / "rowsum.c", out / "rowsum.so")
    rows = 64
    rowptr = np.arange(0, 4 * (rows + 1), 4, dtype=np.int32)
    x = np.random.default_rng(0).standard_normal(4 * rows).astype(np.float32)
    snap = record_call(lib, "kp_rowsum", [x, rowptr, np.zeros(rows, np.float32),
                                          np.int32(rows)], out / "s",
                       names=["x", "rowptr", "out", "rows"])
    return lib, snap.root


@pytest.fixture(scope="session")
def matmul_snapshot(matmul_libs, tmp_path_factory) -> Path:
    """A snapshot of one real naive kp_matmul call (n=128)."""
    return record_matmul(matmul_libs["naive"], tmp_path_factory.mktemp("snap") / "matmul")


def run_json(root, options=None, **kw) -> dict:
    """Run a harness in its isolated worker; its result as result.json holds it."""
    from kpair.isolation import run_isolated

    return run_isolated(root, options, **kw).to_json()


def summarize(result: dict) -> str:
    """The one-line verdict of a result.json object."""
    from kpair.result import Result

    return Result.from_json(result).summary()


@pytest.fixture
def cpu_hogs():
    """Busy-loop processes, one more than the CPUs, for the length of a test: timing and its
    checks must hold while other work competes for every core."""
    import os
    import subprocess
    import sys

    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
             for _ in range((os.cpu_count() or 1) + 1)]
    yield procs
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def plain_answers_left(dev, read, audit, region: str) -> list[str]:
    """Where kpair's own device buffers (``read(ptr, size)`` of each) hold, in plain, 64-byte
    windows of ref's answers for ``region`` (the captured outputs, its outputs on mutated
    inputs), or a held copy's mask key or the digest key."""
    answers = [e[region] for _, _, e, _ in audit.variants]
    windows = [a[at:at + 64] for a in answers for at in (0, len(a) // 2, len(a) - 64)]
    keys = [h.mask.to_bytes(8, "little") for entries in audit.replay.known.entries.values()
            for _, h, _ in entries] + [dev._key.to_bytes(8, "little")]
    found = []
    for ptr, size in dev._allocs.items():
        memory = bytes(read(ptr, size))
        found += [f"{hex(ptr)}: answer window {i}" for i, w in enumerate(windows) if w in memory]
        found += [f"{hex(ptr)}: key {i}" for i, k in enumerate(keys) if k in memory]
    return found


def file_state(*paths: Path) -> dict[str, str | None]:
    """sha256 (or kind) of every file under ``paths``: compared before and after a case, to
    show a refused command changed nothing."""
    out: dict[str, str | None] = {}
    for root in paths:
        if not os.path.lexists(root):
            out[str(root)] = None
            continue
        for p in [root] if not root.is_dir() else sorted(root.rglob("*")):
            mode = os.lstat(p).st_mode
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest() \
                if stat.S_ISREG(mode) else oct(stat.S_IFMT(mode))
    return out


@pytest.fixture(scope="module")
def gpu():
    """Skips unless capture can run: PyTorch with a CUDA device, cuda-bindings and CUPTI."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("cuda.bindings.driver")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    from kpair.capture.cupti import find_cupti
    from kpair.errors import BackendUnavailable

    try:
        find_cupti()
    except BackendUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def cuda():
    """Skips unless the CUDA backend opens an sm_90 device (tests/data's kernels are built
    for sm_90)."""
    pytest.importorskip("cuda.bindings.driver")
    from kpair.backends import open_device
    from kpair.errors import KpairError

    try:
        with open_device("cuda") as dev:
            arch = dev.arch()
    except KpairError as e:
        pytest.skip(str(e))
    if not arch.startswith("sm_90"):
        pytest.skip(f"tests/data's kernels are built for sm_90, this GPU is {arch}")
