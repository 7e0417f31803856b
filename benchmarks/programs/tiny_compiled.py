"""A tiny torch.compile'd program whose Inductor-generated Triton kernels are ~10 us each on
an H200: a scaled add with a bias (elementwise), a row softmax and a row sum over 4M-element
float32 tensors. For the MCP agent (benchmarks/mcp_agent.py --backend cuda):

    kpair capture -o DIR --top 3 --kernel '^triton_' -- python benchmarks/programs/tiny_compiled.py
"""

from __future__ import annotations

import argparse


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, default=1024)
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()

    import torch

    @torch.compile
    def scaled_add(x, y, b):
        return x * 2.0 + y + b

    @torch.compile
    def softmax(x):
        return torch.softmax(x, dim=-1)

    @torch.compile
    def rowsum(x):
        return (x * x).sum(dim=-1)

    torch.manual_seed(0)
    x = torch.randn(args.rows, args.cols, device="cuda")
    y = torch.randn(args.rows, args.cols, device="cuda")
    b = torch.randn(args.cols, device="cuda")
    for _ in range(args.steps):
        scaled_add(x, y, b)
        softmax(x)
        rowsum(y)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
