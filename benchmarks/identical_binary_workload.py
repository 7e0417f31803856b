"""A small PyTorch program whose kernels take 5-300 us on an H200: cuBLAS GEMMs (bf16 nvjet,
fp32), SDPA attention, a cuDNN convolution, elementwise ops, reductions, softmax, layer norm
and a gather. Captured with ``kpair capture --distinct`` for benchmarks/identical_binary.py.

    kpair capture -o CAP --distinct -- python benchmarks/identical_binary_workload.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def main() -> None:
    torch.manual_seed(0)
    dev = "cuda"
    a = torch.randn(2048, 2048, device=dev, dtype=torch.bfloat16)
    b = torch.randn(2048, 2048, device=dev, dtype=torch.bfloat16)
    torch.backends.cuda.matmul.allow_tf32 = False
    f = torch.randn(1024, 1024, device=dev)
    q, k, v = (torch.randn(8, 16, 1024, 64, device=dev, dtype=torch.bfloat16) for _ in range(3))
    img = torch.randn(16, 64, 56, 56, device=dev, dtype=torch.float16)
    w = torch.randn(64, 64, 3, 3, device=dev, dtype=torch.float16)
    x = torch.randn(4096, 4096, device=dev)          # 64 MiB
    small = torch.randn(1 << 20, device=dev)
    table = torch.randn(32768, 256, device=dev)
    idx = torch.randint(0, 32768, (8192,), device=dev)
    with torch.no_grad():
        _ = a @ b
        _ = f @ f
        _ = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        _ = F.conv2d(img, w, padding=1)
        _ = x + x
        _ = F.gelu(x)
        _ = torch.relu(small)
        _ = x.sum()
        _ = x.sum(dim=1)
        _ = x.amax(dim=0)
        _ = torch.softmax(x, dim=-1)
        _ = F.layer_norm(x, (4096,))
        _ = table.index_select(0, idx)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
