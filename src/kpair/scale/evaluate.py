"""An evaluation batch over several devices: one ``Session`` per device, candidates dealt out.

``evaluate_on(harness, requests, options, devices, out)`` opens a session per device under
``out/devices/<d>/`` (its results, its worker.log) as that device's pool worker, hands each
request to the first free device, and yields ``RequestOutcome`` in completion order. The parent
alone appends to ``out/attempts.jsonl``: one file, in completion order, each line numbered in
that order and naming the device that judged it (``device``) and its result file relative to
``out``. A request that is bad in itself (a missing file) is an ``RequestOutcome`` with ``error``;
a device whose session cannot start gives its candidates to the others.

A request is a code object (``{"binary": PATH, ...}``) or a launch plan (``{"plan": PATH}``:
an ``opt.plan.json`` with its code objects beside it, for a range or a candidate with its own
signature); ``judge_request`` sends either to a session.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .._util import make_dirs
from ..candidate import Candidate
from ..errors import InputError
from ..options import RunOptions
from ..plan import Plan
from ..result import Result
from ..session import Attempt, Session, record_attempt, taken_numbers
from .pool import DevicePool, Task

DEVICES = "devices"


@dataclass(frozen=True)
class RequestOutcome:
    """One request's outcome: its number in completion order, the device, and the Result (or
    the error that kept it from being judged)."""

    n: int
    request: dict
    device: int
    result: Result | None
    attempt: Attempt | None
    error: Exception | None = None


def plan_candidate(path: str | Path, *, label: str | None = None) -> Candidate:
    """The launch plan at ``path`` as a candidate (format ``plan``: the session's worker
    reads it and its code objects, and checks it against the harness's range, before any
    launch). The plan file itself is read here, so a malformed one is refused at once."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"plan {path}: no such file" if not path.exists() else
                         f"plan {path}: not a regular file")
    plan = Plan.read(path)
    return Candidate(image=path.read_bytes(), format="plan", binary=path,
                     kernel=" ; ".join(dict.fromkeys(x.label for x in plan.launches)),
                     label=label or str(path))


def judge_request(session: Session, req: dict, *, kernel: str | None = None
                  ) -> tuple[Result, Attempt | None]:
    """Judge one request on ``session``: a plan (``plan``) or a code object (``binary``,
    its kernel ``req["kernel"]``, else ``kernel``, else the harness's opt kernel)."""
    if req.get("plan") is not None:
        return session.attempt_candidate(plan_candidate(req["plan"], label=req.get("label")))
    return session.attempt(
        req["binary"], kernel=req.get("kernel") or kernel,
        launch_override=req.get("launch_override"), label=req.get("label"),
        source=req.get("source"), build=req.get("build"), strategy=req.get("strategy"),
        params=req.get("params"))


def evaluate_on(harness: Path, requests: Iterable[dict], options: RunOptions,
                devices: Sequence[int], out: Path) -> Iterator[RequestOutcome]:
    """Judge every request (``{"binary": ..., "kernel": ..., ...}`` or ``{"plan": ...}``, as
    ``kpair evaluate --jsonl`` reads them) on a pool of sessions, one per device."""
    make_dirs(out)
    first = taken_numbers(out)  # a re-used directory: numbering goes on after it

    @contextlib.contextmanager
    def open_worker(device: int):
        with Session(harness, replace(options, device=device), out=out / DEVICES / str(device),
                     record=False) as session:
            def judge(req: dict) -> tuple[Result, Attempt | None]:
                return judge_request(session, req)
            yield judge

    tasks = (Task(str(i), req) for i, req in enumerate(requests))
    n = first
    for done in DevicePool(devices).run(tasks, open_worker):
        n += 1
        if done.error is not None:
            yield RequestOutcome(n, done.task.payload, done.device, None, None, done.error)
            continue
        result, attempt = done.value
        if attempt is not None:
            attempt = attempt.replace(n=n, device=done.device,
                                      result=f"{DEVICES}/{done.device}/{attempt.result}")
            record_attempt(out, attempt)
        yield RequestOutcome(n, done.task.payload, done.device, result, attempt)


__all__ = ["RequestOutcome", "evaluate_on", "judge_request", "plan_candidate"]
