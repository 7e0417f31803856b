"""Policy lint: tolerances that cannot fail are refused.

A declared range whose criterion a *constant* output meets (all zeros, the data's mean, the
midpoint of its range) judges nothing: a kernel that writes a constant passes it. Such a
tolerance is refused when a harness is made and when it runs, unless the policy says
``"allow_loose": true`` and gives a ``note`` saying why. A range whose expected values are
themselves one constant is left alone: a constant is then the right answer.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import FLOAT_DTYPES, decode, encode
from ..errors import PolicyError
from .judge import check_region
from .schema import Policy, Tolerance


def _constants(values: np.ndarray) -> list[tuple[str, float]]:
    finite = values[np.isfinite(values)]
    if finite.size == 0 or finite.min() == finite.max():
        return []
    return [("0", 0.0), ("the mean", float(finite.mean())),
            ("the midrange", float((finite.min() + finite.max()) / 2))]


def loose(t: Tolerance, expected: bytes) -> str | None:
    """Why ``t`` cannot fail on ``expected`` (the region's bytes), or None when it can."""
    if t.dtype not in FLOAT_DTYPES and t.criterion != "allclose" and \
            t.criterion != "scalar_rtol":
        return None
    values = decode(np.frombuffer(expected, np.uint8)[t.start:t.end], t.dtype)
    for label, c in _constants(values):
        fake = bytearray(expected)
        fake[t.start:t.end] = encode(np.full(values.size, c), t.dtype)
        check = check_region(t.region, expected, bytes(fake), (t,)).checks[0]
        if check.passed:
            return (f"a constant output ({label}, {c:.6g}) passes {t.describe()} "
                    f"({check.metric} {check.value:.6g})")
    return None


def lint(policy: Policy, expected: dict[str, bytes], *, path: object = None) -> None:
    """Refuse a policy with a tolerance that cannot fail, unless it allows them (with a note).
    ``expected``: region name -> ref's output bytes (the captured post-state)."""
    if policy.allow_loose:
        return
    for i, t in enumerate(policy.tolerances):
        if t.region not in expected:
            continue
        why = loose(t, expected[t.region])
        if why is not None:
            raise PolicyError(f"this tolerance cannot fail: {why}. Tighten it, or declare "
                              '"allow_loose": true with a "note" saying why', path=path,
                              field=f"tolerances[{i}]")
