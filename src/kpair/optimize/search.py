"""Successive halving, cheap first: prune every candidate with a short measurement (the
quick measurement, ``workbench.quick_options``), measure the best part again with a longer
one (a *rung*), confirm the best few with the full checked run, pick the winner. A candidate
whose code and launch are those of one already judged is skipped (say a register cap the
kernel never reaches).

Every search step is a ``kpair.session.Session`` on the same harness (``OUT/prune``,
``OUT/rung1`` ..., ``OUT/confirm``), each candidate judged with ``Session.judge``, so every
attempt lands in that step's ``attempts.jsonl`` with its strategy, parameters, source and
build command. Every step runs the trust checks; the prune step and the rungs no
identical-binary control and few ABBA blocks. After each step the passes whose speedup is
above 1.0 are ranked — candidates that keep ref's floating-point order first, then by
speedup — and a rung measures the best ``max(keep, ceil(n / eta))`` of them again, when that
is more than ``keep`` and fewer than all (otherwise it is skipped). The ``keep`` best of the
last step go on to the confirming run (the caller's options, by default ``RunOptions()``:
checks and control). The winner is the first of those, in that order, whose reported
interval lies above 1.0 (``Candidate.faster``): the rule ``release add`` applies. A candidate
that may reorder floating-point operations (``Candidate.reorders_fp``) is judged on a
tolerance harness only when its policy has a note saying why the tolerance is right.

``SearchOutcome`` is what comes back: every judged ``kpair.candidate.Candidate`` (its
``result``, ``attempt`` and ``step`` set), what was skipped and why, the winner or the reason
there is none.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..candidate import Candidate
from ..options import RunOptions
from ..release.index import BaselineEntry
from ..result import Result
from ..session import Session
from ..snapshot import sha256
from .workbench import quick_options

#: The prune stage's measurement: short, checked, no identical-binary control.
PRUNE = quick_options(RunOptions(), max_blocks=16, time_cap_s=1.0)
#: A rung between prune and confirm: twice the blocks, two replicates, still no control.
RUNG = quick_options(RunOptions(), min_blocks=8, max_blocks=32, time_cap_s=2.0, replicates=2)
KEEP = 3
#: A rung measures ``1 / ETA`` of the stage before it (at least ``keep``).
ETA = 3


@dataclass
class SearchOutcome:
    """What a search found: every judged candidate by step, the skipped ones with why, the
    winner (judged in ``confirm``) and ``chosen_by`` (the same candidate judged in the step
    that chose it: prune or the last rung), or the reason there is none."""

    pruned: list[Candidate] = field(default_factory=list)
    rungs: list[list[Candidate]] = field(default_factory=list)
    confirmed: list[Candidate] = field(default_factory=list)
    skipped: list[tuple[Candidate, str]] = field(default_factory=list)
    baselines: list = field(default_factory=list)  # kpair.release.index.BaselineEntry
    ref_failed: bool = False
    winner: Candidate | None = None
    chosen_by: Candidate | None = None
    reason: str | None = None

    @property
    def evaluated(self) -> int:
        return len(self.pruned) + sum(map(len, self.rungs)) + len(self.confirmed)

    @property
    def best(self) -> Candidate | None:
        """The evaluation that best shows what the search found (for a refusal's row)."""
        for group in (self.confirmed, *reversed(self.rungs), self.pruned):
            passes = sorted((e for e in group if e.result.status == "pass"),
                            key=lambda e: -e.speedup)
            if passes:
                return passes[0]
        return self.pruned[0] if self.pruned else None


def _rank(e: Candidate) -> tuple:
    return (e.reorders_fp, -e.speedup)


def search(harness: str | os.PathLike, candidates: Iterable[Candidate],
           out: str | os.PathLike, *, prune: RunOptions = PRUNE,
           confirm: RunOptions | None = None, keep: int = KEEP,
           rungs: Sequence[RunOptions] = (RUNG,), eta: int = ETA,
           baselines: Iterable[tuple[str, Candidate | None, dict]] = (),
           log: Callable[[str], None] = lambda s: None) -> SearchOutcome:
    """Judge the strategies' ``candidates`` on ``harness`` (see the module docstring), then
    ``baselines`` — ``(mode, built config or None, BaselineEntry fields)`` — with the
    confirming run's options in step ``baseline``, unless ref itself does not run."""
    out = Path(out)
    outcome = SearchOutcome()
    _search(outcome, harness, candidates, out, prune=prune, confirm=confirm, keep=keep,
            rungs=rungs, eta=eta, log=log)
    if not outcome.ref_failed:
        outcome.baselines = _baselines(harness, baselines, out / "baseline",
                                       confirm or RunOptions(), log)
    return outcome


def _baselines(harness, todo: Iterable[tuple[str, Candidate | None, dict]], out: Path,
               options: RunOptions, log: Callable[[str], None]) -> list:
    entries, session = [], None
    with ExitStack() as stack:   # the session opens at the first config to measure
        for mode, p, fields in todo:
            if p is not None and p.build_error is not None:
                fields = {**fields, "reason": f"not built: {p.build_error}"}
            elif p is not None:
                session = session or stack.enter_context(Session(harness, options, out=out))
                result = session.judge(replace(p, label=f"{mode}: {p.label}",
                                               strategy=f"inductor {mode}")).result
                fields = {**fields, "status": result.status}
                if result.status == "pass" and result.speed:
                    fields.update(speedup=result.speed.speedup,
                                  ci95=tuple(result.speed.reported_ci95))
                else:
                    fields["reason"] = result.reason
            entries.append(BaselineEntry(mode=mode, **fields))
            log(f"    baseline inductor {mode}: " + (
                f"{entries[-1].speedup:.3f}x" + (" (the captured config: ref)"
                                                 if entries[-1].same_as_ref else "")
                if entries[-1].speedup else entries[-1].reason or "-"))
    return entries


def _search(outcome: SearchOutcome, harness, candidates, out: Path, *, prune, confirm,
            keep, rungs, eta, log) -> None:
    seen: dict[tuple, str] = {}   # (code digest, launch) -> the first candidate's label
    with Session(harness, prune, out=out / "prune") as session:
        policy = session.harness.policy
        for p in candidates:
            if p.build_error is not None:
                outcome.skipped.append((p, f"not built: {p.build_error}"))
                log(f"    skipped {p.label}: not built")
                continue
            key = (sha256(p.code()), repr(p.launch_override))
            if key in seen:  # e.g. a register cap it never reaches: the same machine code
                outcome.skipped.append((p, f"the same code and launch as {seen[key]}"))
                continue
            seen[key] = p.label
            if p.reorders_fp and policy.mode == "tolerance" and not policy.note.strip():
                outcome.skipped.append((p, "may reorder floating-point operations, and the "
                                        "tolerance policy has no note saying why that is "
                                        "acceptable"))
                continue
            e = _judge(session, p, "prune")
            outcome.pruned.append(e)
            log(f"    [{e.attempt}] {p.strategy} {p.label}: {_short(e.result)}")
            if session.setup_failed is not None:
                outcome.reason = f"ref itself does not run on this harness: {e.result.reason}"
                outcome.ref_failed = True
                return
    if not outcome.pruned:
        outcome.reason = "no candidate to evaluate" + (
            f" ({len(outcome.skipped)} skipped: {outcome.skipped[0][2]})"
            if outcome.skipped else "")
        return
    passed = [e for e in outcome.pruned if e.result.status == "pass"]
    if not passed:
        counts = {s: sum(e.result.status == s for e in outcome.pruned) for s in ("fail", "error")}
        outcome.reason = (f"none of {len(outcome.pruned)} candidates passed "
                          f"({counts['fail']} failed, {counts['error']} errors); first: "
                          f"{outcome.pruned[0].result.reason}")
        return
    pool = sorted((e for e in passed if e.speedup > 1.0), key=_rank)
    if not pool:
        best = max(passed, key=lambda e: e.speedup)
        outcome.reason = (f"no candidate beat ref: {len(passed)} of {len(outcome.pruned)} "
                          f"passed, the best measured {best.speedup:.3f}x in the prune stage "
                          f"({best.label})")
        return
    for n, options in enumerate(rungs, 1):
        size = max(keep, math.ceil(len(pool) / eta))
        if not keep < size < len(pool):
            continue
        stage, rung = f"rung{n}", []
        with Session(harness, options, out=out / stage) as session:
            for before in pool[:size]:
                rung.append(_judge(session, before, stage))
                log(f"    {stage} {before.strategy} {before.label}: "
                    f"{_short(rung[-1].result)}")
        outcome.rungs.append(rung)
        pool = sorted((e for e in rung if e.speedup > 1.0), key=_rank)
        if not pool:
            outcome.reason = (f"no candidate beat ref in {stage}: {len(rung)} measured again, "
                              f"best {_short(outcome.best.result)}")
            return
    with Session(harness, confirm or RunOptions(), out=out / "confirm") as session:
        for before in pool[:keep]:
            e = _judge(session, before, "confirm")
            outcome.confirmed.append(e)
            log(f"    confirm {before.strategy} {before.label}: {_short(e.result)}")
            if e.faster and outcome.winner is None:
                outcome.winner, outcome.chosen_by = e, before
                break  # finalists are in preference order: the first confirmed one wins
    if outcome.winner is None:
        best = outcome.best
        outcome.reason = (f"no candidate beat ref in the confirming run: "
                          f"{len(outcome.confirmed)} confirmed, best "
                          f"{_short(best.result) if best else '-'}")


def _judge(session: Session, candidate: Candidate, step: str) -> Candidate:
    """``candidate`` judged in ``session`` (the search step ``step``)."""
    return replace(session.judge(replace(candidate, result=None, attempt=None, step=None)),
                   step=step)


def _short(result: Result) -> str:
    s = result.speed
    if result.status == "pass" and s:
        lo, hi = s.reported_ci95
        return f"pass {s.speedup:.3f}x [{lo:.3f}, {hi:.3f}]"
    return f"{result.status}: {result.reason}"


__all__ = ["ETA", "KEEP", "PRUNE", "RUNG", "SearchOutcome", "search"]
