"""GPU test kit: skips cleanly without cuda-bindings, a device or nvcc; builds the test kernels
in tests/cuda/ for the device's architecture; records snapshots from numpy inputs; pairs and
runs harnesses end to end in isolated workers.

Measured numbers go to ``$KPAIR_EVIDENCE`` (JSON lines) when it is set: the evidence files of
docs/evidence/ (trust-cuda-tests.jsonl) are made from it.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from kpair.backends import open_device
from kpair.errors import BackendUnavailable
from kpair.harness import create_harness
from kpair.isolation import run_isolated
from kpair.pipeline import RunOptions
from kpair.record import record_call
from kpair.snapshot import (
    CodeObject,
    Kernarg,
    Launch,
    Manifest,
    Param,
    Region,
    SnapshotWriter,
)
from kpair.toolchain import compile_cuda

CUDA_SRC = Path(__file__).parents[1] / "cuda"
#: Enough measurement to reach a verdict; correctness tests do not care about the CI.
QUICK = {"min_blocks": 4, "max_blocks": 8, "rel_ci": 0.5, "time_cap_s": 5.0, "seed": 1}


@pytest.fixture(scope="session")
def gpu_arch() -> str:
    try:
        import cuda.bindings.driver  # noqa: F401
    except ImportError:
        pytest.skip("cuda-bindings is not installed (pip install 'kpair[cuda]')")
    try:
        with open_device("cuda") as dev:
            arch = dev.arch()
    except BackendUnavailable as e:
        pytest.skip(f"no usable CUDA device: {e}")
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    return arch


class Kit:
    def __init__(self, arch: str, root: Path):
        self.arch, self.root = arch, root
        self.quick = dict(QUICK)
        self._built: dict[tuple[str, str], Path] = {}
        self._n = 0

    def path(self, stem: str) -> Path:
        self._n += 1
        return self.root / f"{stem}-{self._n}"

    def build(self, source: str, kind: str = "cubin", arch: str | None = None) -> Path:
        arch = arch or self.arch
        key = (source, f"{kind}-{arch}")
        if key not in self._built:
            ext = {"cubin": "cubin", "ptx": "ptx", "fatbin": "fatbin"}[kind]
            self._built[key] = compile_cuda(CUDA_SRC / f"{source}.cu",
                                            self.root / "bin" / f"{source}-{arch}.{ext}",
                                            arch=arch, kind=kind)
        return self._built[key]

    def record(self, source: str, kernel: str, args: list, launch: Launch,
               names: list[str] | None = None) -> Path:
        out = self.path(f"snap-{kernel}")
        record_call(self.build(source), kernel, args, out, backend="cuda", launch=launch,
                    names=names)
        return out

    def pair(self, snapshot: Path, opt: Path | None = None, **kw) -> Path:
        out = self.path("harness")
        if opt is None:  # A/A: opt is the snapshot's own code object
            opt = out.parent / f"{out.name}-opt.bin"
            from kpair.snapshot import Snapshot
            opt.write_bytes(Snapshot.open(snapshot).code_object())
        create_harness(snapshot, out, opt=opt, **kw)
        return out

    def run(self, harness: Path, **options) -> dict:
        return run_isolated(harness, RunOptions(**options)).to_json()

    # ------------------------------------------------------------------ recorded cases

    def case(self, name: str, seed: int = 0, **size) -> Path:
        """Record one of the standard test dispatches; checks the recorded output's numbers."""
        rng = np.random.default_rng(seed)
        if name == "elementwise":
            n = size.get("n", 1 << 20)
            x, y = rng.standard_normal(n, np.float32), rng.standard_normal(n, np.float32)
            want = np.float32(1.5) * x + y
            snap = self.record("elementwise", "axpy", [x, y, np.float32(1.5), np.int32(n)],
                               Launch((n // 256, 1, 1), (256, 1, 1)), ["x", "y", "a", "n"])
            np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)
        elif name == "reduction":
            n, blocks = size.get("n", 1 << 22), 512
            x = rng.standard_normal(n, np.float32)
            partial = np.zeros(blocks, np.float32)
            snap = self.record("reduce", "block_sum", [x, partial, np.int32(n)],
                               Launch((blocks, 1, 1), (256, 1, 1)), ["x", "partial", "n"])
            assert abs(float(partial.sum(dtype=np.float64)) - float(x.sum(dtype=np.float64))) \
                < 1e-2 * np.sqrt(n)
        elif name in ("gemm_tiled", "gemm_naive"):
            m = size.get("n", 512)
            a, b = rng.standard_normal((m, m), np.float32), rng.standard_normal((m, m), np.float32)
            c = np.zeros((m, m), np.float32)
            snap = self.record("gemm", name, [a, b, c, np.int32(m), np.int32(m), np.int32(m)],
                               Launch((m // 16, m // 16, 1), (16, 16, 1)),
                               ["A", "B", "C", "M", "N", "K"])
            np.testing.assert_allclose(c, a @ b, rtol=1e-3, atol=1e-3)
        elif name == "bigsmem":
            per_block, blocks = 24576, 64            # 96 KiB of dynamic shared memory
            x = rng.standard_normal(per_block * blocks, np.float32)
            out = np.zeros_like(x)
            snap = self.record("bigsmem", "smem_reverse", [x, out, np.int32(per_block)],
                               Launch((blocks, 1, 1), (256, 1, 1), per_block * 4),
                               ["in", "out", "per_block"])
            np.testing.assert_array_equal(out, 2 * x.reshape(blocks, -1)[:, ::-1].ravel())
        elif name == "cluster":
            from kpair.snapshot import LaunchAttribute
            out = np.zeros(64, np.uint32)
            attr = LaunchAttribute(4, "CLUSTER_DIMENSION", struct.pack("<3I", 2, 1, 1))
            snap = self.record("cluster", "cluster_rank", [out],
                               Launch((64, 1, 1), (32, 1, 1), 0, (attr,)), ["out"])
            np.testing.assert_array_equal(out, (np.arange(64) % 2) | (2 << 16))
        else:
            raise ValueError(name)
        return snap

    def pointer_table(self, nsrc: int = 4, n: int = 1 << 16, seed: int = 0) -> Path:
        """Snapshot of sum_ptrs: a device array of device pointers, built by hand (record_call
        cannot store pointers to arrays it has not placed yet)."""
        rng = np.random.default_rng(seed)
        srcs = [rng.standard_normal(n, np.float32) for _ in range(nsrc)]
        image = self.build("ptrarray").read_bytes()
        table_at, stride = 256, -(-(n * 4 + 256) // 256) * 256
        src_at = [4096 + k * stride for k in range(nsrc)]
        out_at = src_at[-1] + stride
        params = (Param(0, 8, "pointer", "srcs"), Param(8, 4, "i32", "nsrc"),
                  Param(16, 8, "pointer", "out"), Param(24, 4, "i32", "n"))
        launch = Launch((n // 256, 1, 1), (256, 1, 1))
        out_dir = self.path("snap-sum_ptrs")
        writer = SnapshotWriter(out_dir)
        with open_device("cuda") as dev:
            base = dev.map([(0, out_at + n * 4 + 256)], relocate=True).delta
            table = np.array([base + a for a in src_at], np.uint64)
            pre = {"table": (base + table_at, table.tobytes())}
            for k, a in enumerate(src_at):
                pre[f"src{k}"] = (base + a, srcs[k].tobytes())
            pre["out"] = (base + out_at, bytes(n * 4))
            for address, data in pre.values():
                dev.write(address, data)
            kernarg = struct.pack("<Qi4xQi4x", base + table_at, nsrc, base + out_at, n)
            dev.launch(dev.load(image, "sum_ptrs", fmt="cubin"), launch, kernarg, params)
            regions = [Region(name, address, len(data), writer.put(data),
                              writer.put(dev.read(address, len(data))),
                              "uint64" if name == "table" else "float32")
                       for name, (address, data) in pre.items()]
            got = np.frombuffer(dev.read(base + out_at, n * 4), np.float32)
            np.testing.assert_allclose(got, np.sum(srcs, axis=0), rtol=1e-5, atol=1e-5)
            manifest = Manifest(backend="cuda", arch=dev.arch(),
                                code=CodeObject(writer.put(image), "cubin", "sum_ptrs"),
                                launch=launch, kernarg=Kernarg(writer.put(kernarg), params),
                                regions=tuple(regions), environment=dev.environment(),
                                provenance={"recorded_by": "tests/gpu pointer_table"})
        writer.finish(manifest)
        return out_dir


@pytest.fixture(scope="session")
def kit(gpu_arch, tmp_path_factory) -> Kit:
    return Kit(gpu_arch, tmp_path_factory.mktemp("gpu"))


@pytest.fixture(scope="session")
def evidence():
    """``evidence(name, obj)`` appends one JSON line to $KPAIR_EVIDENCE (when set)."""
    path = os.environ.get("KPAIR_EVIDENCE")

    def write(name: str, obj: object) -> None:
        if path:
            with open(path, "a") as f:
                f.write(json.dumps({"test": name, **obj}) + "\n")
    return write
