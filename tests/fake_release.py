"""Synthetic release rows, typed as ``kpair.release.operator_row`` makes them, for tests of the
index math and the report that run nothing."""

from __future__ import annotations

from kpair.release.index import (
    CorrectnessMode,
    Director,
    HarnessSpeed,
    Kernels,
    Paths,
    Row,
    ToleranceRow,
)


def fake_row(level: int, name: str, speedup: float | None = None, *, status: str = "pass",
             slot_bias: float = 1.0, director: float | None = None,
             mode: str = "byte-exact") -> Row:
    harness = None if status != "pass" else HarnessSpeed(
        speedup=speedup, ci95=(speedup * 0.98, speedup * 1.02), slot_bias=slot_bias,
        slot_bias_ci95=(slot_bias - 0.004, slot_bias + 0.004), blocks=64, stopped_by="ci",
        rel_ci_halfwidth=0.02, cache="cold")
    if mode == "byte-exact":
        correctness = CorrectnessMode(mode="byte-exact", label="byte-exact")
    else:
        correctness = CorrectnessMode(
            mode="tolerance", label="tolerance: cosine >= 0.9999", policy="p.json",
            tolerances=[ToleranceRow(region="y", range=(0, 64), dtype="float32",
                                     criterion="cosine", threshold={"min_cosine": 0.9999},
                                     rule="cosine >= 0.9999", metric="cosine",
                                     measured=0.99999)])
    return Row(level=level, name=name, status=status,
               reason=None if status == "pass" else f"{status}: synthetic reason",
               backend="host", arch="x86_64", device="test cpu",
               kernels=Kernels(ref="k", opt="k"), correctness=correctness, harness=harness,
               director=None if director is None else Director(
                   speedup=director, source="x", reference_only=True, note="n"),
               paths=Paths(harness=None, result="r", provenance=None), replay="captured",
               inputs_digest=None, verified=None)
