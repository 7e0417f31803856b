"""The built-in strategies, one module each; ``STRATEGIES`` maps their names to classes."""

from .cuda_source import CudaSource
from .host_c import HostC
from .triton import TritonRetune

STRATEGIES = {cls.name: cls for cls in (HostC, CudaSource, TritonRetune)}

__all__ = ["CudaSource", "HostC", "STRATEGIES", "TritonRetune"]
