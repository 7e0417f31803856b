"""A tolerance policy from the observed spread of repeated ref runs (``kpair policy suggest``).

``Spread`` reduces runs as they come: per region it keeps the first run's bytes, which bytes
ever differed from them, and per element the largest absolute deviation from the first run
(decoded as the region's float type); memory is that of one run, whatever the run count.
``suggest_policy(policy, spread, margin=...)`` turns the spread into tolerances ``margin``
times wider than observed (``allclose``; ``scalar_rtol`` for a single element) and proposes
mutations for float regions ref only reads. Pure: no device, tested on synthetic runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from ..dtypes import EPS, FLOAT_DTYPES, decode, dtype_size
from .mutation import Mutation
from .schema import Policy, Tolerance


class _Region:
    """The running reduction of one region: first bytes, bytes that ever differed, per
    element the largest |value - first value| (NaN where either was NaN, as ``max`` keeps)."""

    def __init__(self, first: bytes, dtype: str, guessed: bool):
        self.first, self.dtype, self.guessed = first, dtype, guessed
        self.size = dtype_size(dtype)
        self.mask: np.ndarray | None = None
        self.dev: np.ndarray | None = None
        self._first_vals: np.ndarray | None = None

    def add(self, data: bytes) -> None:
        if data == self.first:
            return  # deviation 0 (or NaN against NaN, which the reduction reads as 0 too)
        if len(data) != len(self.first):
            raise ValueError(f"region size changed between runs ({len(self.first)} -> "
                             f"{len(data)} bytes)")
        a, b = np.frombuffer(data, np.uint8), np.frombuffer(self.first, np.uint8)
        differ = a != b
        self.mask = differ if self.mask is None else self.mask | differ
        n = len(data) // self.size * self.size
        if self._first_vals is None:
            self._first_vals = decode(b[:n], self.dtype)
            self.dev = np.zeros_like(self._first_vals)
        with np.errstate(invalid="ignore", over="ignore"):
            np.maximum(self.dev, np.abs(decode(a[:n], self.dtype) - self._first_vals),
                       out=self.dev)


class Spread:
    """What repeated ref runs on identical inputs disagree on, reduced as they come.

    ``hints``: region -> element type (as the snapshot declares it); ``pre``: region -> its
    pre-state bytes, to tell which regions every run left as they were (read-only)."""

    def __init__(self, hints: Mapping[str, str], pre: Mapping[str, bytes]):
        self.hints, self.pre = dict(hints), dict(pre)
        self.runs = 0
        self.regions: dict[str, _Region] = {}
        self.unchanged = {name: True for name in pre}

    def add(self, run: Mapping[str, bytes]) -> None:
        """Fold in one run's post-state (region -> bytes); nothing of it is kept."""
        if self.runs == 0:
            for name, data in run.items():
                dtype, guessed = self.hints.get(name), False
                if dtype not in FLOAT_DTYPES:
                    dtype, guessed = ("float32" if len(data) % 4 == 0 else "float16"), True
                self.regions[name] = _Region(bytes(data), dtype, guessed)
        else:
            if run.keys() != self.regions.keys():
                raise ValueError("runs name different regions")
            for name, data in run.items():
                self.regions[name].add(data)
        for name in self.unchanged:
            if self.unchanged[name] and run[name] != self.pre[name]:
                self.unchanged[name] = False
        self.runs += 1

    @classmethod
    def of(cls, runs: Iterable[Mapping[str, bytes]], *, hints: Mapping[str, str],
           pre: Mapping[str, bytes]) -> Spread:
        spread = cls(hints, pre)
        for run in runs:
            spread.add(run)
        return spread


#: The one note of a suggestion from runs that all agree.
DETERMINISTIC = "ref is deterministic over these runs: no tolerance needed"


def suggest_policy(policy: Policy, spread: Spread, *, margin: float = 4.0
                   ) -> tuple[Policy, list[str]]:
    """A policy whose tolerances cover what the runs of ``spread`` disagree on, ``margin``
    times wider than observed; mutations for float regions ref only reads.

    Tolerances of other regions and declared mutations are kept. Returns (policy, notes):
    no notes when the runs all agree and nothing was proposed (say ``DETERMINISTIC``).
    ``spread`` of a harness's ref: ``kpair.harness.ref_spread``."""
    if spread.runs < 1:
        raise ValueError("no runs to suggest a policy from")
    hints = spread.hints
    notes, new = [], []
    for name, reg in spread.regions.items():
        if reg.mask is None:
            continue
        differ = np.flatnonzero(reg.mask)
        dtype, size = reg.dtype, reg.size
        if reg.guessed:
            notes.append(f"region {name}: element type unknown, read as {dtype}: check it")
        nbytes = len(reg.first)
        start = int(differ[0]) // size * size
        end = min(-(-(int(differ[-1]) + 1) // size) * size, nbytes // size * size)
        ref0 = reg._first_vals[start // size:end // size]
        dev = reg.dev[start // size:end // size]
        scale = float(np.abs(ref0[np.isfinite(ref0)]).max(initial=0.0))
        small = np.abs(ref0) < 1e-3 * scale
        with np.errstate(all="ignore"):
            rtol = float(np.nan_to_num(dev[~small] / np.abs(ref0[~small])).max(initial=0.0))
        atol = float(np.nan_to_num(dev[small]).max(initial=0.0))
        rtol, atol = max(margin * rtol, 4 * EPS[dtype]), margin * atol
        if end - start == size:
            tol = Tolerance(name, start, end, dtype, "scalar_rtol", rtol=rtol,
                            **({"atol": atol} if atol else {}))
        else:
            tol = Tolerance(name, start, end, dtype, "allclose", atol=atol, rtol=rtol)
        new.append(tol)
        notes.append(f"region {name}: {int(differ.size)} byte(s) vary over {spread.runs} ref "
                     f"runs; {tol.describe()}")
    touched = {t.region for t in new}
    tols = tuple(t for t in policy.tolerances if t.region not in touched) + tuple(new)
    mutations = policy.mutations
    if not mutations:
        inputs = [n for n in spread.pre if hints.get(n) in FLOAT_DTYPES and spread.unchanged[n]]
        mutations = tuple(Mutation(n, hints[n], "permute", 2) for n in inputs)
        if inputs:
            notes.append("mutations: permute " + ", ".join(inputs) + " (float regions ref "
                         "only reads) in 2 differential runs")
    note = policy.note or "written by kpair policy suggest from the spread of repeated ref runs"
    return Policy(tols, note, mutations, policy.max_bias), notes


__all__ = ["DETERMINISTIC", "Spread", "suggest_policy"]
