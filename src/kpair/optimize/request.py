"""``kpair optimize`` as one call: what to optimize (a program, snapshots or harnesses:
``OptimizeTarget``), how (``OptimizeOptions``, with ``measurement_options`` for the three
measurements), into which release (``optimize_release``). The CLI only parses and prints.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from .._util import check_output_dir
from ..capture.cudadrv import CudaDriver
from ..capture.cupti import find_cupti
from ..errors import InputError, UsageError
from ..options import RunOptions
from .baseline import MODES, capture_tuned, tuned_configs
from .program import OperatorOutcome, OptimizeOptions, capture_top, optimize
from .search import RUNG
from .strategies.captured import RangeCandidate, check_candidates
from .workbench import (
    operator_from_harness,
    operator_from_snapshot,
    operator_name,
    operators_from_capture,
    quick_options,
)

Log = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class OptimizeTarget:
    """What to optimize: exactly one of a program (``command``: ``python prog.py ARGS``,
    its ``top`` kernels by GPU time among those matching ``kernel_filter``), snapshots
    (a snapshot or a capture directory each) or harnesses. ``level`` and ``name`` override
    the release key of given snapshots and harnesses (``name``: one of them only);
    ``prefix`` goes before every operator name. Inductor's tuned configs are measured as
    the baseline to beat when ``inductor_baseline`` (the program is captured again under
    each mode) or from ``baseline_captures`` (mode → a capture made with it on)."""

    command: tuple[str, ...] = ()
    snapshots: tuple[Path, ...] = ()
    harnesses: tuple[Path, ...] = ()
    top: int = 5
    kernel_filter: str | None = None
    level: int | None = None
    name: str | None = None
    prefix: str = ""
    inductor_baseline: bool = False
    baseline_captures: Mapping[str, Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        given = sum(bool(x) for x in (self.command, self.snapshots, self.harnesses))
        if given != 1:
            raise UsageError("give exactly one of: -- python prog.py, --snapshot, --harness")
        if self.name and len(self.snapshots) + len(self.harnesses) != 1:
            raise UsageError("--name names one operator: give one --snapshot or --harness")
        if self.inductor_baseline and not self.command:
            raise UsageError("--inductor-baseline captures the program again: give it as "
                             "-- python prog.py (or give --baseline-capture MODE=DIR)")
        unknown = [m for m in self.baseline_captures if m not in MODES]
        if unknown:
            raise UsageError(f"--baseline-capture {unknown[0]!r}: the mode is one of "
                             f"{', '.join(MODES)}")


@dataclass(frozen=True)
class OptimizeSummary:
    """What ``optimize_release`` did: one outcome per operator, and the counts."""

    release: Path
    work: Path
    outcomes: tuple[OperatorOutcome, ...]

    @property
    def published(self) -> int:
        return sum(o.status == "published" for o in self.outcomes)

    @property
    def excluded(self) -> int:
        return sum(o.status in ("refused", "failed") for o in self.outcomes)

    @property
    def skipped(self) -> int:
        return sum(o.status == "skipped" for o in self.outcomes)

    @property
    def exit_code(self) -> int:
        """0, or 5 when an operator failed (an error, not a refusal)."""
        return 0 if all(o.status != "failed" for o in self.outcomes) else 5

    def line(self) -> str:
        return (f"kpair optimize: {self.published} published, {self.excluded} excluded, "
                f"{self.skipped} already in {self.release}")

    def to_json(self) -> dict:
        """``kpair optimize --json``'s document."""
        return {
            "release": str(self.release), "work": str(self.work),
            "published": self.published, "excluded": self.excluded, "skipped": self.skipped,
            "exit_code": self.exit_code,
            "operators": [{"key": o.operator.key, "status": o.status, "line": o.line,
                           "snapshot": _str(o.operator.snapshot),
                           "harness": _str(o.operator.harness), "producer": o.producer}
                          for o in self.outcomes]}


def measurement_options(options: OptimizeOptions, *, timeout_s: float | None = None,
                        prune_max_blocks: int = 16, prune_time_cap_s: float = 1.0,
                        rungs: int = 1, time_cap_s: float | None = None,
                        min_blocks: int | None = None, max_blocks: int | None = None,
                        seed: int | None = None) -> OptimizeOptions:
    """``options`` with its three measurements set: the prune stage's short one (one
    replicate, at most ``prune_max_blocks`` ABBA blocks and ``prune_time_cap_s`` seconds,
    no control), ``rungs`` successive-halving rungs each with twice the blocks of the one
    before, and the confirming and publishing runs (``kpair run``'s defaults where None)."""
    if not 0 <= rungs <= 4:
        raise UsageError(f"--rungs takes 0 to 4, not {rungs}")
    timing = {"time_cap_s": time_cap_s, "min_blocks": min_blocks, "max_blocks": max_blocks,
              "seed": seed, "timeout_s": timeout_s}
    return replace(
        options,
        prune=quick_options(RunOptions(seed=seed, timeout_s=timeout_s),
                            max_blocks=prune_max_blocks, time_cap_s=prune_time_cap_s),
        rungs=tuple(replace(RUNG, max_blocks=RUNG.max_blocks * 2 ** i, seed=seed,
                            timeout_s=timeout_s) for i in range(rungs)),
        confirm=RunOptions(**timing), publish=RunOptions(**timing))


def optimize_release(release: str | os.PathLike, target: OptimizeTarget,
                     options: OptimizeOptions | None = None, *,
                     work: str | os.PathLike | None = None, log: Log = _stderr
                     ) -> OptimizeSummary:
    """Optimize ``target``'s operators into the release directory ``release``: capture
    (a program), a base harness per operator, the strategies' search, then publish every
    winner or record the refusal. ``work`` (default ``RELEASE.work`` beside the release)
    keeps what an interrupted run resumes from."""
    options = options or OptimizeOptions()
    release = Path(release)
    work = Path(work) if work is not None else release.with_name(release.name + ".work")
    # Refused before any capture or search: a release or work path that is a file, a
    # special file or in a folder that cannot be written (exit 2).
    check_output_dir(release)
    check_output_dir(work)
    baselines = dict(target.baseline_captures)
    for mode, path in baselines.items():
        if not (Path(path) / "capture.json").is_file():
            raise UsageError(f"--baseline-capture {mode}={path}: {path} holds no "
                             "capture.json")
    if target.command:
        command = list(target.command)
        if not (work / "capture" / "capture.json").is_file():
            # No driver or no CUPTI: exit 4, as capture's, before anything is made.
            CudaDriver()
            find_cupti()
        capture = capture_top(command, work, top=target.top, kernel=target.kernel_filter,
                              log=log)
        operators = operators_from_capture(capture)
        if target.inductor_baseline:
            for mode in MODES:
                baselines.setdefault(mode, capture_tuned(
                    command, work, mode, kernel=target.kernel_filter, log=log))
    else:
        operators = _given_operators(target)
    if target.prefix:
        operators = [replace(op, name=operator_name(target.prefix + op.name))
                     for op in operators]
    if baselines:
        options = replace(options, inductor={mode: tuned_configs(Path(d))
                                             for mode, d in baselines.items()})
    return OptimizeSummary(release, work, tuple(optimize(operators, release, work, options)))


def optimize_range(ref: str | os.PathLike, candidates: Sequence[RangeCandidate],
                   release: str | os.PathLike, options: OptimizeOptions | None = None, *,
                   level: int | None = None, name: str | None = None, prefix: str = "",
                   work: str | os.PathLike | None = None, log: Log = _stderr
                   ) -> OptimizeSummary:
    """``kpair optimize --range``: the range snapshot ``ref`` against its captured
    ``candidates`` (each bound to it, then kpair's retunes of their Triton launches; then
    ``options.strategies`` that apply, none by default), judged on an A/A harness of ref's own
    operations with the same prune, rungs and confirm; the best correct one published into
    ``release`` (its producer in the outcome, ``provenance/range_candidates.json`` listing
    every candidate), or the range refused with the reason. A candidate that cannot be bound
    is recorded with its reason; the others go on."""
    check_candidates(candidates)
    ref = Path(ref)
    if not (ref / "snapshot.json").is_file():
        raise InputError("--range: " + ("not a snapshot directory (no snapshot.json)"
                                         if ref.exists() else "no such snapshot directory"),
                         path=ref)
    options = replace(options or OptimizeOptions(strategies=()),
                      captures=tuple(candidates))
    target = OptimizeTarget(snapshots=(ref,), level=level, name=name, prefix=prefix)
    return optimize_release(release, target, options, work=work, log=log)


def _given_operators(target: OptimizeTarget) -> list:
    operators = []
    for path in target.snapshots:
        if (Path(path) / "capture.json").is_file():
            operators += operators_from_capture(Path(path))
        else:
            operators.append(operator_from_snapshot(path))
    operators += [operator_from_harness(h) for h in target.harnesses]
    if target.level or target.name:
        operators = [replace(op, level=target.level or op.level,
                             name=target.name or op.name) for op in operators]
    return operators


def _str(path: Path | None) -> str | None:
    return None if path is None else str(path)


__all__ = ["OptimizeSummary", "OptimizeTarget", "RangeCandidate", "measurement_options",
           "optimize_range", "optimize_release"]

