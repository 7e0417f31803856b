"""GPU test helpers: PyTorch programs captured by ``kpair capture --range`` (run as the CLI, in
a subprocess), the regions their tensors landed in, and kp_add recorded on CUDA. Imported by
the GPU tests (they skip without a GPU; these helpers import kpair's capture modules only
when called)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np

DATA = Path(__file__).parent / "data"

#: A forward ``f`` over x (rows x inner), w (inner x cols), b (cols), eager and compiled, on the
#: same tensors; compiled once (and both run once) before the ranges, so each range holds its
#: forward's operations only. Ranges ``eager`` and ``compiled``, outputs declared.
FORWARDS = """
import torch, kpair
torch.manual_seed(0)
x = torch.randn({rows}, {inner}, device="cuda")
w = torch.randn({inner}, {cols}, device="cuda")
b = torch.randn({cols}, device="cuda")
def f(x, w, b):
    return {body}
g = torch.compile(f)
f(x, w, b); g(x, w, b)
torch.cuda.synchronize()
with kpair.mark("eager") as m:
    y = f(x, w, b)
    m.outputs(y)
torch.cuda.synchronize()
with kpair.mark("compiled") as m:
    y2 = g(x, w, b)
    m.outputs(y2)
torch.cuda.synchronize()
"""


def forwards(body: str, rows: int, inner: int, cols: int) -> str:
    """:data:`FORWARDS` with ``body`` (an expression of x, w, b) and those sizes."""
    return FORWARDS.format(body=body, rows=rows, inner=inner, cols=cols)


def kpair(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m kpair ARGS``, its output captured as text."""
    return subprocess.run([sys.executable, "-m", "kpair", *args], capture_output=True,
                          text=True, timeout=timeout)


class Capture(NamedTuple):
    ranges: list[dict]   # capture.json's rows, in the order named
    tensors: dict        # the program's last stdout line as JSON, less a ``TENSORS `` prefix
                         # (benchmarks/range_capture_gpu.py's); {} when it printed none
    snaps: list          # each range's Snapshot, verified
    stderr: str


def capture(out: Path, names: list[str], program: str, *options: str) -> Capture:
    """``kpair capture -o OUT --range NAME... OPTIONS -- python -c PROGRAM``; asserts it exits 0
    and captures every range named."""
    from kpair.snapshot import Snapshot

    proc = kpair("capture", "-o", str(out), *[a for n in names for a in ("--range", n)],
                 *options, "--", sys.executable, "-c", program)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    tensors = json.loads(lines[-1].removeprefix("TENSORS ")) if lines else {}
    ranges = {r["name"]: r for r in json.loads((out / "capture.json").read_text())["ranges"]}
    snaps = []
    for n in names:
        assert ranges[n]["status"] == "captured", (ranges[n], proc.stderr)
        snap = Snapshot.open(out / ranges[n]["snapshot"])
        snap.verify()
        snaps.append(snap)
    return Capture([ranges[n] for n in names], tensors, snaps, proc.stderr)


def region_at(manifest, address: int):
    """The region of ``manifest`` holding ``address``."""
    return next(r for r in manifest.regions if r.address <= address < r.end)


def record_kp_add(out: Path, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """c = a + b over ``n`` seeded float32s, tests/data's kp_add recorded on CUDA into ``out``
    (regions a, b, c, n); (a, b, c)."""
    from kpair.record import record_call
    from kpair.snapshot import Launch

    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(n, dtype=np.float32) for _ in range(2))
    c = np.zeros(n, np.float32)
    record_call(DATA / "kp_add_sm90.cubin", "kp_add", [a, b, c, np.int32(n)], out,
                names=["a", "b", "c", "n"], backend="cuda",
                launch=Launch(grid=(n // 256, 1, 1), block=(256, 1, 1)))
    return a, b, c
