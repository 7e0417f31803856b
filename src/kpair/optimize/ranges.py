"""``provenance/range_candidates.json``: every candidate of ``kpair optimize --range`` and what
became of it.

One row per candidate the range's search saw (those refused or skipped first, then the judged
ones in the order the search judged them): its
``producer`` (the name its capture was given, as ``inductor-default`` or ``max-autotune``;
``kpair-retune`` for kpair's own retunes, with ``of`` the capture retuned), its ``label``,
and its ``status``: ``refused`` (not bound to the range, or not built: ``reason`` says why),
``skipped`` (the search did not judge it: the same plan as another, ...), or the verdict of
the last search step that judged it (``pass``, ``fail``, ``error``) with that step, its
speedup and interval, the failed check and the reason. ``winner`` marks the one published.
The search's own ``attempts.jsonl`` beside it holds every judgement in full.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from .._util import utc_now
from ..candidate import Candidate
from ..formats import Record, read, write
from .search import SearchOutcome

SCHEMA = "kpair.range_candidates"
FILE = "range_candidates.json"


class RangeAttempt(Record, kw_only=True, omit_defaults=True):
    """One candidate of a range's search (see the module docstring)."""

    producer: str
    label: str
    strategy: str | None = None
    of: str | None = None
    snapshot: str | None = None
    status: Literal["pass", "fail", "error", "refused", "skipped"]
    step: str | None = None
    speedup: float | None = None
    ci95: tuple[float, float] | None = None
    failed_check: str | None = None
    reason: str | None = None
    winner: bool = False


class RangeCandidates(Record, kw_only=True):
    """``range_candidates.json``: every candidate, the winner's producer, or why none won."""

    schema: Literal["kpair.range_candidates"] = SCHEMA
    schema_version: Literal[1] = 1
    candidates: list[RangeAttempt]
    winner: str | None = None       # the published candidate's producer
    winner_label: str | None = None
    reason: str | None = None       # why there is no winner
    written: str = ""

    @classmethod
    def read(cls, path: str | Path) -> RangeCandidates:
        return read(Path(path), cls, schema=SCHEMA, version=1)

    def write(self, path: str | Path) -> None:
        write(Path(path), self.replace(written=self.written or utc_now()))


def _producer(c: Candidate) -> str:
    p = c.params or {}
    return p.get("producer") if isinstance(p.get("producer"), str) else (c.strategy or "?")


def _row(c: Candidate, **fields) -> RangeAttempt:
    p = c.params or {}
    return RangeAttempt(producer=_producer(c), label=c.label, strategy=c.strategy,
                        of=p.get("of") if isinstance(p.get("of"), str) else None,
                        snapshot=p.get("snapshot") if isinstance(p.get("snapshot"), str)
                        else None, **fields)


def range_record(outcome: SearchOutcome) -> RangeCandidates:
    """The record of a finished search: each candidate at the last step that judged it."""
    last: dict[str, Candidate] = {}
    for group in (outcome.pruned, *outcome.rungs, outcome.confirmed):
        for c in group:
            last[c.label] = c
    rows, seen = [], set()
    for c, why in outcome.skipped:
        refused = c.build_error is not None
        rows.append(_row(c, status="refused" if refused else "skipped",
                         reason=c.build_error if refused else why))
        seen.add(c.label)
    for c in outcome.pruned:
        if c.label in seen:
            continue
        seen.add(c.label)
        c = last[c.label]
        r = c.result
        s = r.speed if r is not None and r.status == "pass" else None
        rows.append(_row(
            c, status=r.status if r is not None else "error", step=c.step,
            speedup=s.speedup if s else None, ci95=tuple(s.reported_ci95) if s else None,
            failed_check=r.correctness.failed_check if r is not None and r.correctness
            else None, reason=r.reason if r is not None else None,
            winner=outcome.winner is not None and c.label == outcome.winner.label))
    w = outcome.winner
    return RangeCandidates(candidates=rows, winner=_producer(w) if w else None,
                       winner_label=w.label if w else None, reason=outcome.reason)


__all__ = ["FILE", "RangeAttempt", "RangeCandidates", "SCHEMA", "range_record"]
