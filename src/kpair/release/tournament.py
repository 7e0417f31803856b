"""The release tournament: per operator, every producer's candidate judged the same way, and
the best correct one published.

A ``Contest`` is one operator: its ref (a range snapshot or a dispatch snapshot), the policy
its candidates are judged under, and an ordered list of ``Entrant``\\ s, each a candidate of
one producer (``PRODUCERS``: Inductor's default, max-autotune and coordinate-descent choices,
kpair's own search, a launch plan, a single-dispatch retune) in any form ``kpair pair`` takes
(an ``--opt-capture`` snapshot, a ``--plan``, a same-layout ``--opt``). ``play`` judges every
entrant by the same ``create_harness`` + ``run_isolated`` under the same ``RunOptions`` and
``choose`` picks the winner: among the entrants that pass and whose reported interval lies
above 1.0 (``store.not_faster``, the rule of ``release add``), the one with the largest
speedup estimate, ties to the earlier entrant. ``settle`` writes the outcome into the release
in the layout of ``kpair.release`` (``level<N>/<op>/harness``, ``provenance``,
``index.json``): the winner's harness (already run: its result is the publication, nothing
runs again) with a row naming its ``producer``, or an ``excluded/`` record whose row carries
one reason of ``EXCLUSION_REASONS`` and the detail. Either way the row lists every entrant
(``EntrantRow``) and the operator's provenance holds every attempt (``tournament.json``, each
attempt's ``result.json`` under ``attempts/``), and the winner's producer records (its
``director_validation.json``: the row's Director figure).

A contest decided before anything is judged (its capture failed, it did not fit, its ref
replays nondeterministically) is settled as excluded with that reason (``Contest.excluded``).
``run_contests`` plays contests in order and skips those the release has already decided,
so an interrupted run resumes; ``RUN_FILE`` keeps each call's wall time.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import msgspec

from .._util import make_dirs, utc_now
from ..errors import KpairError, UsageError
from ..formats import Record, read, write
from ..harness import create_harness
from ..isolation import run_isolated
from ..options import RunOptions
from ..policy import Policy
from ..result import Result, error_result
from .index import (
    EXCLUDED,
    EXCLUSION_REASONS,
    HARNESS,
    INDEX,
    INDUCTOR_PRODUCERS,
    PRODUCERS,
    PROVENANCE,
    EntrantRow,
    ExclusionReason,
    Producer,
    Row,
    build_index,
    check_key,
    harness_speed,
    load_index,
    operator_row,
    rel_dir,
    verdict_interval,
)
from .store import (
    STAGING_PREFIX,
    _copy_inputs,
    _publish,
    _record_exclusion,
    locked,
    not_faster,
    sweep_stale_staging,
)

TOURNAMENT_FILE = "tournament.json"
TOURNAMENT_SCHEMA = "kpair.tournament"
ATTEMPTS = "attempts"
RUN_FILE = "tournament_run.json"
RUN_SCHEMA = "kpair.tournament_run"
Kind = Literal["opt-capture", "plan", "opt"]


@dataclass(frozen=True)
class Entrant:
    """One producer's candidate for an operator: ``candidate`` is what ``kpair pair`` takes
    as ``kind`` (``opt-capture``: a range captured beside ref; ``plan``: an opt.plan.json;
    ``opt``: a same-layout code object, ``opt_kernel`` its kernel). ``provenance``: the
    producer's records (a ``director_validation.json`` there is the row's Director figure
    when this entrant wins); ``note``: one line kept in the row."""

    producer: Producer
    candidate: Path
    kind: Kind = "opt-capture"
    opt_kernel: str | None = None
    provenance: Path | None = None
    note: str | None = None

    def __post_init__(self) -> None:
        if self.producer not in PRODUCERS:
            raise UsageError(f"producer {self.producer!r} is not one of {', '.join(PRODUCERS)}")
        if self.kind not in ("opt-capture", "plan", "opt"):
            raise UsageError(f"entrant kind {self.kind!r} is not opt-capture, plan or opt")


@dataclass(frozen=True)
class Contest:
    """One operator: ``ref`` (a snapshot directory; None when it was never captured), the
    ``policy`` every entrant is judged under (None: byte-exact), the ``entrants`` in order.
    ``excluded`` = (reason, detail): decided before anything is judged. ``notes``: what the
    provenance should say besides the attempts (a producer that was skipped, and why)."""

    level: int
    name: str
    ref: Path | None
    entrants: Sequence[Entrant] = ()
    policy: Path | Policy | None = None
    excluded: tuple[ExclusionReason, str] | None = None
    notes: Sequence[str] = ()

    def __post_init__(self) -> None:
        check_key(self.level, self.name)
        if self.excluded is not None and self.excluded[0] not in EXCLUSION_REASONS:
            raise UsageError(f"exclusion {self.excluded[0]!r} is not one of "
                             f"{', '.join(EXCLUSION_REASONS)}")
        if self.excluded is None and self.ref is None:
            raise UsageError(f"{self.key}: a contest without a ref must say why it is excluded")

    @property
    def key(self) -> str:
        return rel_dir(self.level, self.name)


class EntrantAttempt(Record, kw_only=True, omit_defaults=True):
    """One entrant as ``tournament.json`` keeps it: the row's entry, the candidate's path and
    kind, the seconds pair and run took, and its result.json inside the provenance
    (``attempts/<i>-<producer>.result.json``; absent when the pair was refused)."""

    entrant: EntrantRow
    kind: Kind
    path: str
    pair_s: float
    run_s: float | None = None
    result: str | None = None


class TournamentRecord(Record, kw_only=True):
    """``provenance/tournament.json`` (schema ``kpair.tournament`` v1): every attempt of one
    operator, the winner (its index in ``attempts``; null: none) or the exclusion, and the
    options every entrant ran under."""

    schema: Literal["kpair.tournament"] = TOURNAMENT_SCHEMA
    schema_version: Literal[1] = 1
    level: int
    name: str
    ref: str | None
    policy: str | None
    options: dict
    attempts: list[EntrantAttempt]
    winner: int | None
    exclusion: ExclusionReason | None = None
    detail: str | None = None
    notes: list[str] = []
    written: str = ""

    @classmethod
    def read(cls, path: str | os.PathLike) -> TournamentRecord:
        return read(Path(path), cls, schema=TOURNAMENT_SCHEMA, version=1)


@dataclass
class Judged:
    """What ``judge`` found for one entrant: its row entry, and where it ran."""

    entrant: Entrant
    row: EntrantRow
    harness: Path | None = None
    result: Result | None = None
    pair_s: float = 0.0
    run_s: float | None = None


@dataclass
class Outcome:
    """What ``play`` decided for one contest: the ``winner`` (an index into ``judged``) or
    the ``exclusion`` with its ``detail``; ``row``: the index row ``settle`` wrote."""

    contest: Contest
    judged: list[Judged]
    winner: int | None
    exclusion: ExclusionReason | None = None
    detail: str | None = None
    row: Row | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def published(self) -> bool:
        return self.winner is not None


def _name(path: Path) -> str:
    return path.name or str(path)


def pair_entrant(contest: Contest, entrant: Entrant, harness_dir: Path) -> Judged:
    """Pair ``entrant`` with the contest's ref into ``harness_dir`` (nothing runs). A pair
    that is refused (a region that cannot be bound, a layout that does not match, ...) is
    the entrant's ``refused`` row (``harness`` None), never the tournament's end."""
    t0 = time.monotonic()
    pair = {"opt-capture": {"opt_capture": entrant.candidate}, "plan": {"plan": entrant.candidate},
            "opt": {"opt": entrant.candidate, "opt_kernel": entrant.opt_kernel}}[entrant.kind]
    base = {"producer": entrant.producer, "candidate": _name(entrant.candidate),
            "note": entrant.note}
    try:
        create_harness(contest.ref, harness_dir, policy=contest.policy, **pair)
    except Exception as e:  # noqa: BLE001 - one entrant's pair never ends the tournament
        shutil.rmtree(harness_dir, ignore_errors=True)
        what = str(e) if isinstance(e, (KpairError, OSError)) else f"{type(e).__name__}: {e}"
        reason = (f"pair refused: {what}".splitlines() or [""])[0][:2000]
        return Judged(entrant, EntrantRow(status="refused", reason=reason, **base),
                      pair_s=round(time.monotonic() - t0, 3))
    return Judged(entrant, EntrantRow(status="error", **base), harness_dir,
                  pair_s=round(time.monotonic() - t0, 3))


def judged_of(paired: Judged, result: Result, run_s: float | None, *,
              allow_slower: bool = False) -> Judged:
    """A paired entrant with its run's ``result``: its row (a pass with its speedup, its
    reported interval and whether that lies above 1.0; else the status and reason)."""
    entrant = paired.entrant
    base = {"producer": entrant.producer, "candidate": _name(entrant.candidate),
            "note": entrant.note}
    speed = harness_speed(result)
    if result.status == "pass" and speed is not None:
        why = not_faster(speed)
        row = EntrantRow(status="pass", speedup=speed.speedup,
                         ci95=tuple(verdict_interval(speed)), faster=why is None,
                         reason=None if allow_slower else why, **base)
    else:
        row = EntrantRow(status=result.status, reason=(result.reason or "")[:2000] or None,
                         **base)
    return Judged(entrant, row, paired.harness, result, paired.pair_s, run_s)


def run_entrant(paired: Judged, options: RunOptions, *, allow_slower: bool = False) -> Judged:
    """Run a paired entrant's harness in its own worker (``judged_of`` its result); a
    refused one is returned as it is."""
    if paired.harness is None:
        return paired
    t1 = time.monotonic()
    try:
        result = run_isolated(paired.harness, options)
    except Exception as e:  # noqa: BLE001 - the entrant's error, not the tournament's
        result = error_result(paired.harness, e, stage="run")
    return judged_of(paired, result, round(time.monotonic() - t1, 3), allow_slower=allow_slower)


def judge(contest: Contest, entrant: Entrant, harness_dir: Path, options: RunOptions,
          *, allow_slower: bool = False) -> Judged:
    """Pair ``entrant`` with the contest's ref into ``harness_dir`` and run it in its own
    worker (``pair_entrant`` then ``run_entrant``)."""
    return run_entrant(pair_entrant(contest, entrant, harness_dir), options,
                       allow_slower=allow_slower)


def choose(rows: Sequence[EntrantRow], *, allow_slower: bool = False) -> int | None:
    """The winner among judged entrants: a pass whose interval lies above 1.0 (``faster``;
    ``allow_slower``: any pass) with the largest speedup estimate; the earlier entrant on a
    tie; None when none is."""
    best = None
    for i, r in enumerate(rows):
        if r.status == "pass" and (r.faster or allow_slower) and r.speedup is not None and (
                best is None or r.speedup > rows[best].speedup):
            best = i
    return best


def exclusion_of(rows: Sequence[EntrantRow]) -> tuple[ExclusionReason, str]:
    """Why no entrant won (``choose`` found none), as one of ``EXCLUSION_REASONS`` and the
    detail: some passed but none is faster; none passed and one at least failed correctness;
    or none could be judged at all (refused at pairing, or an error)."""
    if not rows:
        return "capture-failed", "no candidate was captured for this operator"
    each = "; ".join(f"{r.producer}: {r.status}" + (f" ({r.reason})" if r.reason else "")
                     for r in rows)
    if any(r.status == "pass" for r in rows):
        best = max((r for r in rows if r.status == "pass"), key=lambda r: r.speedup or 0.0)
        lo, hi = best.ci95 or (float("nan"),) * 2
        return "no-candidate-faster", (
            f"no candidate faster: the best correct, {best.producer}, is {best.speedup:.3f}x "
            f"[{lo:.3f}, {hi:.3f}], not above 1.0; {each}")[:4000]
    if any(r.status == "fail" for r in rows):
        return "wrong-under-every-candidate", f"no candidate passed: {each}"[:4000]
    return "capture-failed", f"no candidate could be paired and run: {each}"[:4000]


def play(contest: Contest, work: Path, options: RunOptions | None = None, *,
         allow_slower: bool = False, log: Callable[[str], None] | None = None) -> Outcome:
    """Judge every entrant of ``contest`` in order (harnesses under ``work``) and decide:
    the winner, or why there is none. Nothing is written to a release here."""
    options = options or RunOptions()
    if contest.excluded is not None:
        reason, detail = contest.excluded
        return Outcome(contest, [], None, reason, detail, notes=list(contest.notes))
    judged = []
    for i, entrant in enumerate(contest.entrants):
        j = judge(contest, entrant, work / f"{i}-{entrant.producer}", options,
                  allow_slower=allow_slower)
        judged.append(j)
        if log:
            r = j.row
            what = (f"{r.speedup:.3f}x [{r.ci95[0]:.3f}, {r.ci95[1]:.3f}]"
                    if r.speedup is not None and r.ci95 else r.reason or "")
            log(f"{contest.key}: {entrant.producer}: {r.status} {what}".rstrip())
    return decide(contest, judged, allow_slower=allow_slower)


def decide(contest: Contest, judged: list[Judged], *, allow_slower: bool = False) -> Outcome:
    """The contest's outcome from its judged entrants (in entrant order): the winner
    (``choose``), or why there is none (``exclusion_of``); a contest excluded before judging
    keeps its reason. Nothing is written to a release here."""
    if contest.excluded is not None:
        reason, detail = contest.excluded
        return Outcome(contest, [], None, reason, detail, notes=list(contest.notes))
    rows = [j.row for j in judged]
    winner = choose(rows, allow_slower=allow_slower)
    if winner is not None:
        return Outcome(contest, judged, winner, notes=list(contest.notes))
    reason, detail = exclusion_of(rows)
    return Outcome(contest, judged, None, reason, detail, notes=list(contest.notes))


def _record(outcome: Outcome, options: RunOptions, attempts_dir: str) -> TournamentRecord:
    c = outcome.contest
    attempts = []
    for i, j in enumerate(outcome.judged):
        entry = j.row.replace(winner=i == outcome.winner)
        attempts.append(EntrantAttempt(
            entrant=entry, kind=j.entrant.kind, path=str(j.entrant.candidate), pair_s=j.pair_s,
            run_s=j.run_s, result=f"{attempts_dir}/{i}-{j.entrant.producer}.result.json"
            if j.result is not None else None))
    policy = None if c.policy is None else \
        c.policy.mode if isinstance(c.policy, Policy) else str(c.policy)
    return TournamentRecord(
        level=c.level, name=c.name, ref=str(c.ref) if c.ref else None, policy=policy,
        options={k: v for k, v in options.to_json().items() if k != "device"},
        attempts=attempts, winner=outcome.winner, exclusion=outcome.exclusion,
        detail=outcome.detail, notes=list(outcome.notes), written=utc_now())


def _provenance(outcome: Outcome, options: RunOptions, prov: Path) -> None:
    """Write every attempt into ``prov``: tournament.json, each run's result.json, and the
    winner's producer records."""
    prov.mkdir(parents=True, exist_ok=True)
    if outcome.winner is not None:
        src = outcome.judged[outcome.winner].entrant.provenance
        if src is not None and src.is_dir():
            shutil.copytree(src, prov, dirs_exist_ok=True)
    (prov / ATTEMPTS).mkdir(exist_ok=True)
    for i, j in enumerate(outcome.judged):
        if j.result is not None:
            j.result.write(prov / ATTEMPTS / f"{i}-{j.entrant.producer}.result.json")
    write(prov / TOURNAMENT_FILE, _record(outcome, options, ATTEMPTS))


def _entrants(outcome: Outcome) -> list[EntrantRow]:
    return [j.row.replace(winner=i == outcome.winner) for i, j in enumerate(outcome.judged)]


def _shown(outcome: Outcome) -> Judged | None:
    """The attempt an excluded row shows: the best correct one, else the first that failed,
    else the first that ran at all."""
    judged = [j for j in outcome.judged if j.result is not None]
    passed = [j for j in judged if j.row.status == "pass"]
    if passed:
        return max(passed, key=lambda j: j.row.speedup or 0.0)
    failed = [j for j in judged if j.row.status == "fail"]
    return (failed or judged or [None])[0]


def settle(root: str | os.PathLike, outcome: Outcome, options: RunOptions | None = None
           ) -> Row:
    """Write ``outcome`` into the release at ``root`` (under its writer lock) and return its
    row: the winner published as ``level<N>/<op>`` (its harness copied in with its result,
    not run again), or the operator recorded under ``excluded/`` with its reason. An
    operator the release already holds (published or excluded) is refused: a tournament
    decides each operator once."""
    options = options or RunOptions()
    c = outcome.contest
    root = make_dirs(Path(root))
    with locked(root):
        sweep_stale_staging(root)
        old = load_index(root)
        old_ops, old_refused = (old.operators, old.refused) if old else ([], [])
        history = old.verifications if old else []
        if any(r.key == (c.level, c.name) for r in [*old_ops, *old_refused]):
            raise UsageError(f"{c.key} is already decided in {root}")
        staging = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=root))
        try:
            op = staging / "op"
            prov = op / PROVENANCE
            _provenance(outcome, options, prov)
            entrants = _entrants(outcome)
            if outcome.winner is not None:
                win = outcome.judged[outcome.winner]
                dest = root / c.key
                _copy_inputs(win.harness, op / HARNESS)
                result = msgspec.structs.replace(win.result,
                                                 harness=str((dest / HARNESS).resolve()))
                result.write(op / HARNESS / "result.json")
                row = operator_row(c.level, c.name, result, harness_dir=op / HARNESS,
                                   provenance_dir=prov, published=True)
                row = row.replace(producer=win.entrant.producer, entrants=entrants)
                _publish(root, staging, dest, build_index([*old_ops, row], old_refused,
                                                          history))
            else:
                shown = _shown(outcome)
                (op / HARNESS).mkdir(parents=True)
                if shown is not None:
                    result, harness_dir = shown.result, shown.harness
                else:
                    result = error_result(c.ref or "", outcome.detail or outcome.exclusion,
                                          stage="tournament", kind=outcome.exclusion)
                    harness_dir = op / HARNESS   # none: the row's policy is unknown
                result.write(op / HARNESS / "result.json")
                row = operator_row(c.level, c.name, result, harness_dir=harness_dir,
                                   provenance_dir=prov, published=False)
                row = row.replace(reason=outcome.detail, refused_by="optimizer",
                                  exclusion=outcome.exclusion, entrants=entrants)
                _record_exclusion(root, staging, root / EXCLUDED / c.key,
                                  build_index(old_ops, [*old_refused, row], history))
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    outcome.row = row
    return row


def decided(root: str | os.PathLike) -> set[tuple[int, str]]:
    """The operators the release at ``root`` already holds, published or excluded."""
    index = load_index(root) if (Path(root) / INDEX).is_file() else None
    return {r.key for r in [*index.operators, *index.refused]} if index else set()


# --------------------------------------------------------------------------- calls


class Call(Record, kw_only=True):
    """One call of a tournament run: when it started, its wall time, what it decided."""

    started: str
    wall_s: float
    decided: list[str]
    skipped: int


class RunLog(Record, kw_only=True):
    """``<root>/tournament_run.json``: every call of the run that built the release, and
    their wall time together (capture, search, judge and publish, as the driver timed them;
    the library's own calls time the judging and publishing)."""

    schema: Literal["kpair.tournament_run"] = RUN_SCHEMA
    schema_version: Literal[1] = 1
    calls: list[Call] = []
    wall_s: float = 0.0

    @classmethod
    def load(cls, root: str | os.PathLike) -> RunLog:
        path = Path(root) / RUN_FILE
        return read(path, cls, schema=RUN_SCHEMA, version=1) if path.is_file() else cls()


def record_call(root: str | os.PathLike, started: str, wall_s: float, decided_keys: list[str],
                skipped: int) -> RunLog:
    """Append one call to the run's log (``RUN_FILE``) and return the log."""
    log = RunLog.load(root)
    calls = [*log.calls, Call(started=started, wall_s=round(wall_s, 3), decided=decided_keys,
                              skipped=skipped)]
    log = RunLog(calls=calls, wall_s=round(sum(c.wall_s for c in calls), 3))
    write(Path(root) / RUN_FILE, log)
    return log


def run_contests(root: str | os.PathLike, contests: Iterable[Contest], work: str | os.PathLike,
                 options: RunOptions | None = None, *, deadline: float | None = None,
                 allow_slower: bool = False, log: Callable[[str], None] | None = None,
                 record: bool = True) -> list[Outcome]:
    """Play and settle each contest the release has not decided yet, in order, until
    ``deadline`` (a ``time.monotonic()`` value; no contest starts after it). Each contest's
    harnesses live in ``work`` only while it is played. With ``record``, the call is
    appended to ``RUN_FILE``."""
    root, work = Path(root), Path(work)
    t0, started = time.monotonic(), utc_now()
    done = decided(root) if root.is_dir() else set()
    outcomes, skipped = [], 0
    for contest in contests:
        if (contest.level, contest.name) in done:
            skipped += 1
            continue
        if deadline is not None and time.monotonic() >= deadline:
            break
        scratch = work / f"level{contest.level}-{contest.name}"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        try:
            outcome = play(contest, scratch, options, allow_slower=allow_slower, log=log)
            settle(root, outcome, options)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        done.add((contest.level, contest.name))
        outcomes.append(outcome)
        if log:
            log(describe_outcome(outcome))
    if record:
        record_call(root, started, time.monotonic() - t0,
                    [o.contest.key for o in outcomes], skipped)
    return outcomes


def describe_outcome(outcome: Outcome) -> str:
    """One line: the operator, published (by whom, how fast) or excluded (why)."""
    c = outcome.contest
    if outcome.winner is not None:
        r = outcome.judged[outcome.winner].row
        return (f"{c.key}: published {r.producer} {r.speedup:.3f}x "
                f"[{r.ci95[0]:.3f}, {r.ci95[1]:.3f}]")
    return f"{c.key}: excluded {outcome.exclusion}: {outcome.detail}"


def inductor_best(rows: Sequence[EntrantRow]) -> EntrantRow | None:
    """Inductor's best choice among an operator's entrants: the correct one of
    ``INDUCTOR_PRODUCERS`` with the largest speedup estimate (the earlier on a tie); None
    when none of them passed."""
    best = None
    for r in rows:
        if r.producer in INDUCTOR_PRODUCERS and r.status == "pass" and r.speedup is not None \
                and (best is None or r.speedup > best.speedup):
            best = r
    return best


def read_record(root: str | os.PathLike, row: Row) -> TournamentRecord | None:
    """The ``tournament.json`` of a row's provenance, None where there is none."""
    if row.paths.provenance is None:
        return None
    path = Path(root) / row.paths.provenance / TOURNAMENT_FILE
    with contextlib.suppress(FileNotFoundError):
        return TournamentRecord.read(path)
    return None


__all__ = ["ATTEMPTS", "Call", "Contest", "Entrant", "EntrantAttempt", "Judged", "Outcome",
           "RUN_FILE", "RunLog", "TOURNAMENT_FILE", "TournamentRecord", "choose", "decide", "decided",
           "describe_outcome", "exclusion_of", "inductor_best", "judge", "judged_of",
           "pair_entrant", "play", "read_record", "record_call", "run_contests",
           "run_entrant", "settle"]
