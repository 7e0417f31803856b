"""Hostile CUDA candidates (GPU twin of tests/test_hostile.py): a cubin that writes a forged
verdict into everything it can reach, and one that floods the output with fake PASS lines.
Neither may yield a pass, reach kpair's own output, or leave a worker behind."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from kpair.snapshot import Launch

pytestmark = pytest.mark.gpu

N = 64
KPAIR = [sys.executable, "-c", "import sys; from kpair.cli import main; sys.exit(main())"]


@pytest.fixture(scope="module")
def gemm_snapshot(kit):
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((N, N), np.float32) for _ in range(2))
    c = np.zeros((N, N), np.float32)
    return kit.record("gemm", "gemm_tiled", [a, b, c, np.int32(N), np.int32(N), np.int32(N)],
                      Launch((N // 16, N // 16, 1), (16, 16, 1)),
                      ["A", "B", "C", "M", "N", "K"])


@pytest.mark.parametrize("kernel", ["hostile_forge", "hostile_flood"])
def test_hostile_cubin_cannot_forge_or_flood(kit, gemm_snapshot, evidence, tmp_path, kernel):
    harness = kit.pair(gemm_snapshot, opt=kit.build("hostile"), opt_kernel=kernel)
    proc = subprocess.run(KPAIR + ["run", str(harness), "--json", "--min-blocks", "4",
                                   "--max-blocks", "8", "--time-cap", "5", "--timeout", "300"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    result = json.loads(proc.stdout)  # only kpair's JSON on stdout
    log = (harness / "worker.log").read_bytes()
    evidence(f"hostile[{kernel}]", {"exit": proc.returncode, "status": result["status"],
                                    "summary": (result.get("correctness") or {}).get("summary")
                                    or (result.get("error") or {}).get("message"),
                                    "log_bytes": len(log)})
    assert result["status"] in ("fail", "error") and result["correct"] is not True
    assert proc.returncode in (1, 5)
    assert "99.000x" not in proc.stdout and "99.000x" not in proc.stderr
    assert json.loads((harness / "result.json").read_text())["status"] == result["status"]
    if kernel == "hostile_flood":
        assert b"99.000x" in log and len(log) < (1 << 20) + 4096
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(harness) not in ps  # no worker left
