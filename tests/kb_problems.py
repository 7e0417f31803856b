"""KernelBench-style problem files for the drivers' tests (no KernelBench copy needed), written
into a folder laid out as KernelBench's own: two real Level 2 problems for the GPU tests
(:func:`write_level2`), and plain-Python ones (:func:`write_plain`) that the drivers' child
programs run on the CPU under a torch stand-in (:class:`FakeTorch`, :class:`FakeMarks`)."""

from __future__ import annotations

import contextlib
import sys
import types
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


# --------------------------------------------------------------------------- torch stand-in

#: Problem files for :class:`FakeTorch`: plain Python under ``import torch`` (the stand-in),
#: one that runs, one whose forward raises, one whose forward runs out of GPU memory.
PLAIN = {
    "1_Scale": """
import torch
class Out:
    def __init__(self, n):
        self.shape, self.dtype = (n, 4), "torch.float32"
class Model:
    def __init__(self, n):
        self.n = n
    def eval(self):
        return self
    def __call__(self, x):
        return Out(self.n * x)
def get_inputs():
    return [2]
def get_init_inputs():
    return [3]
""",
    "2_Raises": """
import torch
class Model:
    def eval(self):
        return self
    def __call__(self, x):
        raise ValueError("no forward here")
def get_inputs():
    return [1]
def get_init_inputs():
    return []
""",
    "3_Huge": """
import torch
class Model:
    def eval(self):
        return self
    def __call__(self, x):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 90.00 GiB")
def get_inputs():
    return [1]
def get_init_inputs():
    return []
""",
}


class FakeTorch(types.ModuleType):
    """What the drivers' child programs use of torch, in plain Python: every call counted in
    ``calls`` (``compile``, ``synchronize``, ``empty_cache``, ``dynamo_reset``, ...).
    :meth:`install` puts it (and ``torch._inductor.config``) in ``sys.modules``."""

    class Tensor:
        pass

    def __init__(self):
        super().__init__("torch")
        self.calls: list[str] = []
        fake = self

        class OutOfMemoryError(RuntimeError):
            pass

        self.cuda = types.SimpleNamespace(
            OutOfMemoryError=OutOfMemoryError, get_device_capability=lambda: (9, 0),
            synchronize=lambda: fake.calls.append("synchronize"),
            empty_cache=lambda: fake.calls.append("empty_cache"))
        self._dynamo = types.SimpleNamespace(reset=lambda: fake.calls.append("dynamo_reset"))
        config = types.ModuleType("torch._inductor.config")
        config.patch = lambda **kw: (fake.calls.append(f"patch {sorted(kw)}"),
                                     contextlib.nullcontext())[1]
        self._inductor = types.ModuleType("torch._inductor")
        self._inductor.config = config

    def manual_seed(self, n: int) -> None:
        self.calls.append("manual_seed")

    def device(self, name: str):
        self.calls.append(f"device {name}")
        return contextlib.nullcontext()

    def no_grad(self):
        return contextlib.nullcontext()

    def compile(self, model, mode=None):
        self.calls.append(f"compile {mode}")
        return model

    def install(self, monkeypatch) -> FakeTorch:
        monkeypatch.setitem(sys.modules, "torch", self)
        monkeypatch.setitem(sys.modules, "torch._inductor", self._inductor)
        monkeypatch.setitem(sys.modules, "torch._inductor.config", self._inductor.config)
        return self


def write_plain(root: Path, level: int = 2) -> Path:
    """:data:`PLAIN`'s problems as ``root/level<level>/<name>.py``; ``root``."""
    folder = root / f"level{level}"
    folder.mkdir(parents=True, exist_ok=True)
    for name, source in PLAIN.items():
        (folder / f"{name}.py").write_text(source)
    return root


class FakeMarks:
    """A stand-in for ``kpair.mark``: the ranges entered, with what each declared output."""

    def __init__(self):
        self.ranges: list[tuple[str, object]] = []

    @contextlib.contextmanager
    def __call__(self, name: str):
        marks = self

        class Range:
            def outputs(self, *outs):
                marks.ranges.append((name, outs))

        yield Range()
