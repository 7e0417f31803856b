"""Successive halving, cheap first: prune every proposal with a short measurement, measure
the best part again with a longer one (a *rung*), confirm the best few with the full checked
run, pick the winner. A proposal whose code and launch are those of one already evaluated is
skipped (say a register cap the kernel never reaches).

Every stage is a ``kpair.session.Session`` on the same harness (``OUT/prune``,
``OUT/rung1`` ..., ``OUT/confirm``), so every evaluation lands in that stage's
``attempts.jsonl`` with its strategy, parameters, source and build command. Every stage runs
the trust checks; the prune stage and the rungs no identical-binary control and few ABBA
blocks. After each stage the passes whose speedup is above 1.0 are ranked — candidates that
keep ref's floating-point order first, then by speedup — and a rung measures the best
``max(keep, ceil(n / eta))`` of them again, when that is more than ``keep`` and fewer than all
(otherwise it is skipped). The ``keep`` best of the last stage go on to the confirming run
(the caller's options, by default ``RunOptions()``: checks and control). The winner is the
first of those, in that order, whose reported interval lies above 1.0: the rule
``release add`` applies. A candidate that may reorder floating-point operations
(``Proposal.reorders_fp``) is evaluated on a tolerance harness only when its policy has a
note saying why the tolerance is right.

``SearchOutcome`` is what comes back: every evaluation, what was skipped and why, the
winner or the reason there is none.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from ..options import RunOptions
from ..release.index import BaselineEntry
from ..result import Result
from ..session import Session
from ..snapshot import sha256
from .strategy import Proposal

#: The prune stage's measurement: short, checked, no identical-binary control.
PRUNE = RunOptions(min_blocks=4, max_blocks=16, time_cap_s=1.0, control=False, replicates=1)
#: A rung between prune and confirm: twice the blocks, two replicates, still no control.
RUNG = RunOptions(min_blocks=8, max_blocks=32, time_cap_s=2.0, control=False, replicates=2)
KEEP = 3
#: A rung measures ``1 / ETA`` of the stage before it (at least ``keep``).
ETA = 3


@dataclass(frozen=True)
class Evaluated:
    """One proposal, the strategy that made it, and its verdict in one stage."""

    strategy: str
    proposal: Proposal
    result: Result
    attempt: int
    stage: str

    @property
    def speedup(self) -> float:
        s = self.result.speed
        return s.speedup if self.result.status == "pass" and s else 0.0

    @property
    def faster(self) -> bool:
        s = self.result.speed
        return self.result.status == "pass" and s is not None and s.reported_ci95[0] > 1.0


@dataclass
class SearchOutcome:
    pruned: list[Evaluated] = field(default_factory=list)
    rungs: list[list[Evaluated]] = field(default_factory=list)
    confirmed: list[Evaluated] = field(default_factory=list)
    skipped: list[tuple[str, Proposal, str]] = field(default_factory=list)
    baselines: list = field(default_factory=list)  # kpair.release.index.BaselineEntry
    ref_failed: bool = False
    winner: Evaluated | None = None
    chosen_by: Evaluated | None = None  # the winner's evaluation in the stage that chose it
    reason: str | None = None

    @property
    def evaluated(self) -> int:
        return len(self.pruned) + sum(map(len, self.rungs)) + len(self.confirmed)

    @property
    def best(self) -> Evaluated | None:
        """The evaluation that best shows what the search found (for a refusal's row)."""
        for group in (self.confirmed, *reversed(self.rungs), self.pruned):
            passes = sorted((e for e in group if e.result.status == "pass"),
                            key=lambda e: -e.speedup)
            if passes:
                return passes[0]
        return self.pruned[0] if self.pruned else None


def _rank(e: Evaluated) -> tuple:
    return (e.proposal.reorders_fp, -e.speedup)


def search(harness: str | os.PathLike, proposals: Iterable[tuple[str, Proposal]],
           out: str | os.PathLike, *, prune: RunOptions = PRUNE,
           confirm: RunOptions | None = None, keep: int = KEEP,
           rungs: Sequence[RunOptions] = (RUNG,), eta: int = ETA,
           baselines: Iterable[tuple[str, Proposal | None, dict]] = (),
           log: Callable[[str], None] = lambda s: None) -> SearchOutcome:
    """Evaluate ``(strategy name, proposal)`` pairs on ``harness`` (see the module docstring),
    then ``baselines`` — ``(mode, built config or None, BaselineEntry fields)`` — with the
    confirming run's options in stage ``baseline``, unless ref itself does not run."""
    out = Path(out)
    outcome = SearchOutcome()
    _search(outcome, harness, proposals, out, prune=prune, confirm=confirm, keep=keep,
            rungs=rungs, eta=eta, log=log)
    if not outcome.ref_failed:
        outcome.baselines = _baselines(harness, baselines, out / "baseline",
                                       confirm or RunOptions(), log)
    return outcome


def _baselines(harness, todo: Iterable[tuple[str, Proposal | None, dict]], out: Path,
               options: RunOptions, log: Callable[[str], None]) -> list:
    entries, session = [], None
    with ExitStack() as stack:   # the session opens at the first config to measure
        for mode, p, fields in todo:
            if p is not None and p.build_error is not None:
                fields = {**fields, "reason": f"not built: {p.build_error}"}
            elif p is not None:
                session = session or stack.enter_context(Session(harness, options, out=out))
                result = session.evaluate(p.binary, kernel=p.kernel,
                                          launch_override=p.launch_override,
                                          label=f"{mode}: {p.label}", source=p.source,
                                          build=p.build, strategy=f"inductor {mode}",
                                          params=p.params)
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


def _search(outcome: SearchOutcome, harness, proposals, out: Path, *, prune, confirm, keep,
            rungs, eta, log) -> None:
    seen: dict[tuple, str] = {}   # (code digest, launch) -> the first proposal's label
    with Session(harness, prune, out=out / "prune") as session:
        policy = session.harness.policy
        for strategy, p in proposals:
            if p.build_error is not None:
                outcome.skipped.append((strategy, p, f"not built: {p.build_error}"))
                log(f"    skipped {p.label}: not built")
                continue
            key = (_digest(p), repr(p.launch_override))
            if key in seen:  # e.g. a register cap it never reaches: the same machine code
                outcome.skipped.append((strategy, p, f"the same code and launch as "
                                        f"{seen[key]}"))
                continue
            seen[key] = p.label
            if p.reorders_fp and policy.mode == "tolerance" and not policy.note.strip():
                outcome.skipped.append((strategy, p, "may reorder floating-point operations, "
                                        "and the tolerance policy has no note saying why "
                                        "that is acceptable"))
                continue
            result = session.evaluate(p.binary, kernel=p.kernel,
                                      launch_override=p.launch_override, label=p.label,
                                      source=p.source, build=p.build, strategy=strategy,
                                      params=p.params)
            e = Evaluated(strategy, p, result, session.evaluated, "prune")
            outcome.pruned.append(e)
            log(f"    [{e.attempt}] {strategy} {p.label}: {_short(result)}")
            if session.setup_failed is not None:
                outcome.reason = f"ref itself does not run on this harness: {result.reason}"
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
                          f"({best.proposal.label})")
        return
    for n, options in enumerate(rungs, 1):
        size = max(keep, math.ceil(len(pool) / eta))
        if not keep < size < len(pool):
            continue
        stage, rung = f"rung{n}", []
        with Session(harness, options, out=out / stage) as session:
            for before in pool[:size]:
                rung.append(_evaluate(session, before, stage))
                log(f"    {stage} {before.strategy} {before.proposal.label}: "
                    f"{_short(rung[-1].result)}")
        outcome.rungs.append(rung)
        pool = sorted((e for e in rung if e.speedup > 1.0), key=_rank)
        if not pool:
            outcome.reason = (f"no candidate beat ref in {stage}: {len(rung)} measured again, "
                              f"best {_short(outcome.best.result)}")
            return
    with Session(harness, confirm or RunOptions(), out=out / "confirm") as session:
        for before in pool[:keep]:
            e = _evaluate(session, before, "confirm")
            outcome.confirmed.append(e)
            log(f"    confirm {before.strategy} {before.proposal.label}: {_short(e.result)}")
            if e.faster and outcome.winner is None:
                outcome.winner, outcome.chosen_by = e, before
                break  # finalists are in preference order: the first confirmed one wins
    if outcome.winner is None:
        best = outcome.best
        outcome.reason = (f"no candidate beat ref in the confirming run: "
                          f"{len(outcome.confirmed)} confirmed, best "
                          f"{_short(best.result) if best else '-'}")


def _evaluate(session: Session, before: Evaluated, stage: str) -> Evaluated:
    """``before``'s proposal judged again in ``session`` (a later stage)."""
    p = before.proposal
    result = session.evaluate(p.binary, kernel=p.kernel, launch_override=p.launch_override,
                              label=p.label, source=p.source, build=p.build,
                              strategy=before.strategy, params=p.params)
    return Evaluated(before.strategy, p, result, session.evaluated, stage)


def _digest(p: Proposal) -> str:
    return sha256(Path(p.binary).read_bytes())


def _short(result: Result) -> str:
    s = result.speed
    if result.status == "pass" and s:
        lo, hi = s.reported_ci95
        return f"pass {s.speedup:.3f}x [{lo:.3f}, {hi:.3f}]"
    return f"{result.status}: {result.reason}"


__all__ = ["ETA", "Evaluated", "KEEP", "PRUNE", "RUNG", "SearchOutcome", "search"]
