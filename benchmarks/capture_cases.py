"""The must-show capture cases, each captured with the Python API inside one program.

    python benchmarks/capture_cases.py OUT

Captures, each into ``OUT/<case>/``: torch elementwise add, a sum reduction, softmax, layer
norm, cuBLAS GEMM in fp32 and in bf16, a hand-written Triton kernel, and the kernels of a
torch.compile'd function. Each case runs once outside capture first (JIT compilation, cuBLAS
handles and workspaces, Inductor's compile), then once inside ``kpair.capture.capture``, which
takes every dispatch of that call. Writes ``OUT/cases.json``: case → captured dispatches.
Then ``python benchmarks/replay_check.py OUT`` replays them.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import kpair.capture as kc

kc.install()  # before torch touches CUDA: every code object is seen as it loads

import torch  # noqa: E402  (after install, on purpose)
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def scaled_add(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * alpha + y, mask=mask)


def triton_case(x, y, out):
    n = x.numel()
    scaled_add[(triton.cdiv(n, 1024),)](x, y, out, n, 0.5, BLOCK=1024)
    return out


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    dev = "cuda"
    x, y = torch.randn(4096, 1024, device=dev), torch.randn(4096, 1024, device=dev)
    w, b = torch.randn(1024, device=dev), torch.randn(1024, device=dev)
    a32, b32 = torch.randn(1024, 768, device=dev), torch.randn(768, 512, device=dev)
    a16, b16 = a32.bfloat16(), b32.bfloat16()
    t_out = torch.empty_like(x)

    @torch.compile
    def compiled(t):
        return F.gelu(t) * torch.sigmoid(t).sum(dim=-1, keepdim=True)

    cases = {
        "add": lambda: torch.add(x, y),
        "sum": lambda: x.sum(),
        "softmax": lambda: torch.softmax(x, dim=-1),
        "layer_norm": lambda: F.layer_norm(x, (1024,), w, b),
        "gemm_fp32": lambda: a32 @ b32,
        "gemm_bf16": lambda: a16 @ b16,
        "triton": lambda: triton_case(x, y, t_out),
        "torch_compile": lambda: compiled(x),
    }
    summary = {}
    for name, fn in cases.items():
        t0 = time.perf_counter()
        try:
            fn()
            torch.cuda.synchronize()
            with kc.capture(out / name, max=16) as session:
                fn()
                torch.cuda.synchronize()
            s = session.summary()
            summary[name] = {"captured": s["captured"], "failed": s["failed"],
                             "dispatches": [{k: d.get(k) for k in
                                             ("snapshot", "kernel", "status", "reason",
                                              "attributes", "region_bytes", "segment_bytes")}
                                            for d in s["dispatches"]],
                             "seconds": round(time.perf_counter() - t0, 2)}
        except Exception as e:  # one case failing must not hide the others
            summary[name] = {"error": f"{type(e).__name__}: {e}"}
        print(name, json.dumps(summary[name])[:600], flush=True)
    (out / "cases.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
