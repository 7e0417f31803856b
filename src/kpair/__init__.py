"""kpair: pair harnesses for GPU kernels.

Pipeline: capture a real dispatch into a *snapshot* (``kpair.snapshot``), pair a baseline
(``ref``) and an optimized (``opt``) kernel binary with it into a *harness* (``kpair.harness``),
replay both on the same placed regions (``kpair.replay``), judge correctness under a declared
policy (``kpair.policy``) and time them with the interleaved ABBA design (``kpair.measure``).
Many harnesses make a *release* (``kpair.release``).

Importing kpair touches no GPU driver; backends load their bindings on first use.
"""

__version__ = "0.1.0"

from .marks import mark  # noqa: E402  (``with kpair.mark("fwd"):`` marks a range to capture)

__all__ = ["__version__", "mark"]
