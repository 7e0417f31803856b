"""Two KernelBench-style Level 2 problem files for the GPU drivers' tests (no KernelBench copy
needed): written by :func:`write_level2` into a folder laid out as KernelBench's own."""

from __future__ import annotations

from pathlib import Path

LEVEL2 = {
    "1_Gemm_ReLU_Add": """
import torch
batch_size, in_features, out_features = 256, 512, 384
class Model(torch.nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = torch.nn.Linear(in_features, out_features)
        self.bias = torch.nn.Parameter(torch.randn(out_features) * 0.02)
    def forward(self, x):
        return torch.relu(self.linear(x)) + self.bias
def get_inputs():
    return [torch.randn(batch_size, in_features)]
def get_init_inputs():
    return [in_features, out_features]
""",
    "2_Scale_Tanh_Mul": """
import torch
batch_size, n = 128, 4096
class Model(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
    def forward(self, x, y):
        return torch.tanh(x * self.scale) * y + x
def get_inputs():
    return [torch.randn(batch_size, n), torch.randn(batch_size, n)]
def get_init_inputs():
    return [0.5]
""",
}


def write_level2(root: Path) -> Path:
    """:data:`LEVEL2`'s problems as ``root/level2/<name>.py``; ``root`` (a KernelBench root as
    ``kernelbench.discover`` reads it)."""
    folder = root / "level2"
    folder.mkdir(parents=True, exist_ok=True)
    for name, source in LEVEL2.items():
        (folder / f"{name}.py").write_text(source)
    return root
