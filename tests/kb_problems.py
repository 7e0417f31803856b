"""KernelBench-style problem files for the drivers' tests (no KernelBench copy needed), written
into a folder laid out as KernelBench's own: two real Level 2 problems for the GPU tests
(:func:`write_level2`), and plain-Python ones (:func:`write_fake`) that the drivers' child
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

#: A problem file for :class:`FakeTorch` (format ``fail``: None, ``"init"``: its model cannot
#: be made, ``"oom"``: its forward runs out of GPU memory).
FAKE_SOURCE = '''\
import torch
batch_size = 4
FAIL = {fail!r}
class Model:
    def __init__(self, n):
        if FAIL == "init":
            raise ValueError("no such layer")
        self.n = n
    def eval(self):
        return self
    def __call__(self, x):
        if FAIL == "oom":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return torch.Tensor((x.shape[0], self.n))
def get_inputs():
    return [torch.Tensor((batch_size, 3))]
def get_init_inputs():
    return [5]
'''


def write_fake(root: Path, level: int, fails: dict[str, str | None]) -> Path:
    """A :data:`FAKE_SOURCE` problem per name of ``fails`` (its ``fail``) as
    ``root/level<level>/<name>.py``; ``root``."""
    folder = root / f"level{level}"
    folder.mkdir(parents=True, exist_ok=True)
    for name, fail in fails.items():
        (folder / f"{name}.py").write_text(FAKE_SOURCE.format(fail=fail))
    return root


class FakeTorch(types.ModuleType):
    """What the drivers' child programs call of torch, in plain Python. ``calls``: what was
    called, in order (``synchronize``, ``empty_cache``, ``dynamo_reset``, ...); ``compiles``:
    each ``torch.compile``'s mode and the Inductor config in force, failing for the modes in
    ``broken``. :meth:`install` puts it (and ``torch._inductor.config``) in ``sys.modules``."""

    class Tensor:
        dtype = "torch.float32"

        def __init__(self, shape=()):
            self.shape = shape

        def to(self, device):
            return self

    def __init__(self, broken=()):
        super().__init__("torch")
        self.calls: list[str] = []
        self.compiles: list[tuple[str | None, dict]] = []
        self.broken, self.config = set(broken), {}
        fake = self

        class OutOfMemoryError(RuntimeError):
            pass

        @contextlib.contextmanager
        def patch(**kw):
            old = dict(fake.config)
            fake.config.update(kw)
            try:
                yield
            finally:
                fake.config.clear()
                fake.config.update(old)

        self.cuda = types.SimpleNamespace(
            OutOfMemoryError=OutOfMemoryError, get_device_capability=lambda: (9, 0),
            synchronize=lambda: fake.calls.append("synchronize"),
            empty_cache=lambda: fake.calls.append("empty_cache"))
        self._dynamo = types.SimpleNamespace(reset=lambda: fake.calls.append("dynamo_reset"))
        self._inductor = types.ModuleType("torch._inductor")
        self._inductor.config = types.ModuleType("torch._inductor.config")
        self._inductor.config.patch = patch

    def manual_seed(self, n: int) -> None:
        self.calls.append("manual_seed")

    def device(self, name: str):
        self.calls.append(f"device {name}")
        return contextlib.nullcontext()

    def no_grad(self):
        return contextlib.nullcontext()

    def compile(self, model, mode=None):
        self.compiles.append((mode, dict(self.config)))
        if mode in self.broken:
            raise RuntimeError(f"{mode}: autotuning failed")
        return model

    def install(self, monkeypatch) -> FakeTorch:
        monkeypatch.setitem(sys.modules, "torch", self)
        monkeypatch.setitem(sys.modules, "torch._inductor", self._inductor)
        monkeypatch.setitem(sys.modules, "torch._inductor.config", self._inductor.config)
        return self


class FakeMarks:
    """A stand-in for ``kpair.mark``: ``ranges``, the names of the ranges whose outputs were
    declared, in order."""

    def __init__(self):
        self.ranges: list[str] = []

    @contextlib.contextmanager
    def __call__(self, name: str):
        yield types.SimpleNamespace(outputs=lambda *outs: self.ranges.append(name))
