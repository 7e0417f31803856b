"""Evaluation sessions: one harness placed once, many candidate opts judged on it.

``with Session(harness, out=DIR) as s: s.evaluate("cand.cubin")`` (or ``s.judge(candidate)``
for a ``kpair.candidate.Candidate``, which comes back judged) starts a persistent isolated
worker (``kpair.isolation.start``, as ``kpair run`` does, with the same setup/retry rule) that
opens the harness, places its regions, runs ref and every baseline the trust checks need
(determinism, poison plan, ref on the mutated inputs, the identical-binary control) once, and
then judges each candidate it is sent (a ``kpair.protocol.Judge``) with the same checks and the
ABBA meter as ``kpair run`` — without a new process, context and placement per candidate. A
candidate that crashes or hangs the worker gets an ``error`` Result; the next one gets a fresh
worker (set up again). Candidates are untrusted as in ``kpair run``: they run only in the
worker, whose output goes to ``DIR/worker.log``.

Every evaluation is appended to ``DIR/attempts.jsonl`` (``Attempt.of`` the judged candidate:
time, candidate sha256, source and build command when given, strategy and parameters,
status, failed check and reason, speedup and intervals) and its result to
``DIR/results/NNNN/result.json``. A re-used ``DIR`` keeps what it held: numbering goes on
after its highest attempt, nothing is replaced; sessions sharing one ``DIR`` keep one
sequence with ``continue_after``.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import progress
from ._util import append_text, make_dirs, private_tempdir, sweep_stale_tempdirs, utc_now
from .candidate import Candidate
from .errors import InputError
from .formats import Record, convert, parse, to_builtins
from .harness import Harness
from .isolation import LOG, JudgedResult, Worker, start
from .options import RunOptions
from .protocol import Judge
from .result import Result, Side, error_result
from .snapshot import detect_format, sha256

ATTEMPTS = "attempts.jsonl"


class Attempt(Record, omit_defaults=True, kw_only=True):
    """One line of ``attempts.jsonl``: a candidate and what became of it."""

    n: int
    time: str
    candidate_sha256: str
    kernel: str
    label: str = ""
    source: str | None = None
    build: str | None = None
    strategy: str | None = None
    params: dict[str, Any] | None = None
    status: str
    failed_check: str | None = None
    reason: str | None = None
    speedup: float | None = None
    ci95: tuple[float, float] | None = None
    combined_ci95: tuple[float, float] | None = None
    difference: str | None = None
    result: str | None = None
    wall_s: float
    device: int | None = None

    @classmethod
    def of(cls, candidate: Candidate, candidate_sha256: str, result: str | None, *,
           device: int | None = None, with_params: bool = True) -> Attempt:
        """The line that records a judged ``candidate`` (its ``result`` and ``attempt``
        number set); ``result``: its result.json, relative to the session's directory."""
        r = candidate.result
        speed = r.speed
        return cls(
            n=candidate.attempt, time=utc_now(), candidate_sha256=candidate_sha256,
            kernel=candidate.kernel, label=candidate.label, source=candidate.source,
            build=candidate.build, strategy=candidate.strategy,
            params=candidate.params if with_params else None, status=r.status,
            failed_check=r.correctness.failed_check if r.correctness else None,
            reason=r.reason, speedup=speed.speedup if speed else None,
            ci95=speed.ci95 if speed else None,
            combined_ci95=speed.combined_ci95 if speed else None,
            difference=speed.difference if speed else None, result=result,
            wall_s=r.wall_s, device=device)


def read_attempts(path: str | os.PathLike) -> list[Attempt]:
    out = []
    for i, line in enumerate(Path(path).read_text().splitlines()):
        if line.strip():
            out.append(convert(parse(line, path=path), Attempt, path=path,
                               field=f"line {i + 1}"))
    return out


class Session:
    """Candidates judged one after another on one harness (see the module docstring)."""

    def __init__(self, harness: str | os.PathLike, options: RunOptions | None = None, *,
                 out: str | os.PathLike | None = None, record: bool = True):
        self.root = Path(harness).resolve()
        self.harness = Harness.open(self.root)  # verified here once; the worker does again
        self.options = options or RunOptions()
        self.out = Path(out) if out is not None else None
        self.record = record  # False: the caller writes the attempts (a pool's one file)
        #: Numbers already taken in a re-used ``out``: new results go after them.
        self._first = 0
        if self.out is not None:
            make_dirs(self.out)
            self._first = taken_numbers(self.out)
        self._stack = contextlib.ExitStack()
        self._worker: Worker | None = None
        self._scratch: Path | None = None
        self.setup_failed: Result | None = None
        self.evaluated = 0
        self.workers_started = 0

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop()
        self._stack.close()

    # ------------------------------------------------------------------ the worker

    def _stop(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._worker = None

    def _start(self) -> None:
        if self._scratch is None:
            sweep_stale_tempdirs()
            self._scratch = self._stack.enter_context(private_tempdir("session"))
        log = (self.out or self._scratch) / LOG
        self._worker = start(self.root, self.options, self._scratch, log, session=True)
        self.workers_started += 1
        if self._worker.failed is not None:  # the baseline itself: no candidate can pass
            self.setup_failed = self._worker.failed
            self._stop()

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, binary: str | os.PathLike | bytes, *, kernel: str | None = None,
                 launch_override: dict | None = None, label: str | None = None,
                 source: str | None = None, build: str | None = None,
                 strategy: str | None = None, params: dict | None = None) -> Result:
        """Judge one candidate code object (a path or its bytes) against the harness's ref:
        all trust checks and the ABBA meter, as ``kpair run`` does. ``kernel`` defaults to
        the harness's opt kernel name; the rest is provenance for attempts.jsonl."""
        return self.attempt(binary, kernel=kernel, launch_override=launch_override,
                            label=label, source=source, build=build, strategy=strategy,
                            params=params)[0]

    def attempt(self, binary: str | os.PathLike | bytes, *, kernel: str | None = None,
                launch_override: dict | None = None, label: str | None = None,
                source: str | None = None, build: str | None = None,
                strategy: str | None = None, params: dict | None = None
                ) -> tuple[Result, Attempt | None]:
        """``evaluate``, and the attempts.jsonl line it made (None without ``out``)."""
        image, where = _load(binary, label)
        judged, attempt = self._attempt(Candidate(
            image, kernel or "", "", launch_override, where, strategy=strategy,
            source=source, build=build, params=params or {}), params is not None)
        return judged.result, attempt

    def judge(self, candidate: Candidate) -> Candidate:
        """``candidate`` (built: its ``image``, or the ``binary`` file holding it) judged as
        ``evaluate`` judges a file: returned with its ``result`` and ``attempt`` number
        (recorded in attempts.jsonl with its provenance when the session has ``out``)."""
        return self._attempt(candidate, True)[0]

    def attempt_candidate(self, candidate: Candidate) -> tuple[Result, Attempt | None]:
        """``judge``, as ``attempt`` answers: the Result and the attempts.jsonl line it made
        (None without ``out``). A launch plan is a Candidate of format ``plan`` whose
        ``binary`` is its opt.plan.json (``kpair.scale.evaluate.plan_candidate``)."""
        judged, attempt = self._attempt(candidate, True)
        return judged.result, attempt

    def continue_after(self, taken: int) -> None:
        """Number the next attempt ``taken + 1`` (sessions sharing one ``out`` directory keep
        one sequence: each is told the highest number before it judges)."""
        self._first = taken - self.evaluated

    def _attempt(self, candidate: Candidate, with_params: bool
                 ) -> tuple[Candidate, Attempt | None]:
        if candidate.image:
            image, where = candidate.image, candidate.label or "bytes"
        elif candidate.binary is not None:
            image, where = _load(candidate.binary, candidate.label or None)
        else:
            raise InputError(f"candidate {candidate.label or '?'}: not built"
                             + (f" ({candidate.build_error})" if candidate.build_error else ""))
        if not image:
            raise InputError(f"candidate {where}: the file is empty")
        kernel = candidate.kernel or self.harness.opt.kernel
        started = time.monotonic()
        self.evaluated += 1
        n = self._first + self.evaluated
        with progress.task(where, n):
            outcome = self._judge(n, replace(candidate, image=image, kernel=kernel,
                                             label=where))
        result = outcome.result.replace(wall_s=round(time.monotonic() - started, 3),
                                        opt=Side(kernel=kernel, binary=where))
        attempt = None
        if self.out is not None:
            path = self.out / "results" / f"{n:04d}" / "result.json"
            result = JudgedResult(result, outcome.samples).write(path, replace=False)
            attempt = Attempt.of(replace(candidate, kernel=kernel, label=where, result=result,
                                         attempt=n),
                                 sha256(image), str(path.relative_to(self.out)),
                                 device=self.options.device, with_params=with_params)
            if self.record:
                self._record(attempt)
        return replace(candidate, kernel=kernel, result=result, attempt=n), attempt

    def result_file(self, n: int) -> Path | None:
        """Where attempt ``n``'s result.json is (None without ``out``)."""
        return None if self.out is None else self.out / "results" / f"{n:04d}" / "result.json"

    def _judge(self, n: int, candidate: Candidate) -> JudgedResult:
        """Candidate ``n`` judged by the worker, started (and set up) on first use; after an
        error that worker is stopped, and the next candidate gets a fresh one."""
        if self.setup_failed is None and self._worker is None:
            self._start()
        if self.setup_failed is not None:
            return JudgedResult(self.setup_failed)
        try:   # a launch plan (format "plan") is read by the worker, from its path
            fmt = "plan" if candidate.format == "plan" else detect_format(candidate.image)
        except Exception as e:  # noqa: BLE001 - a bad candidate file is that candidate's error
            return JudgedResult(error_result(self.root, e, stage="load"))
        outcome = self._worker.judge(Judge.of(n, replace(candidate, format=fmt)))
        if outcome.result.status == "error":
            self._stop()  # crashed, hung, or gave up after an error: a fresh one next time
        return outcome

    def _record(self, attempt: Attempt) -> None:
        record_attempt(self.out, attempt)


def _load(binary: str | os.PathLike | bytes, label: str | None) -> tuple[bytes, str]:
    """A candidate's bytes and its name for people (``label``, else the path)."""
    if isinstance(binary, (bytes, bytearray)):
        return bytes(binary), label or "bytes"
    path = Path(binary)
    if not path.is_file():
        raise InputError(f"candidate {path}: no such file" if not path.exists() else
                         f"candidate {path}: not a regular file")
    try:
        return path.read_bytes(), label or str(path)
    except OSError as e:
        raise InputError(f"candidate {path}: cannot read ({e.strerror or e})") from None


def result_line(n: int, result: Result, result_file: str | os.PathLike) -> dict:
    """One judged candidate as ``kpair evaluate --jsonl`` prints it (and ``kpair mcp``'s
    ``submit_candidate`` answers): its attempt number ``n``, label, status, summary, speedup
    and intervals, the failed check, the reason and where its result.json is."""
    s = result.speed
    return {"n": n, "label": result.opt.binary if result.opt else None,
            "status": result.status, "summary": result.summary(),
            "speedup": s.speedup if s else None, "ci95": list(s.ci95) if s else None,
            "combined_ci95": list(s.combined_ci95) if s and s.combined_ci95 else None,
            "difference": s.difference if s else None,
            "failed_check": result.correctness.failed_check if result.correctness else None,
            "reason": result.reason, "result": str(result_file)}


def record_attempt(out: Path, attempt: Attempt) -> None:
    """Append one line to ``out/attempts.jsonl``."""
    append_text(out / ATTEMPTS, json.dumps(to_builtins(attempt)) + "\n")


def taken_numbers(out: Path) -> int:
    """The highest attempt number a re-used evaluation directory already holds (in
    ``attempts.jsonl`` or as a ``results/NNNN`` folder); 0 for a new one. A session numbers
    its attempts after it: earlier results are never replaced."""
    top = 0
    with contextlib.suppress(OSError):
        for d in (out / "results").iterdir():
            if d.name.isdigit():
                top = max(top, int(d.name))
    with contextlib.suppress(OSError):
        for line in (out / ATTEMPTS).read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                top = max(top, int(json.loads(line).get("n", 0)))
    return top


__all__ = ["ATTEMPTS", "Attempt", "Session", "read_attempts", "record_attempt", "result_line",
           "taken_numbers"]
