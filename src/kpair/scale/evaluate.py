"""An evaluation batch over several devices: one ``Session`` per device, candidates dealt out.

``evaluate_on(harness, requests, options, devices, out)`` opens a session per device under
``out/devices/<d>/`` (its results, its worker.log) as that device's pool worker, hands each
request to the first free device, and yields ``RequestOutcome`` in completion order. The parent
alone appends to ``out/attempts.jsonl``: one file, in completion order, each line numbered in
that order and naming the device that judged it (``device``) and its result file relative to
``out``. A request that is bad in itself (a missing file) is an ``RequestOutcome`` with ``error``;
a device whose session cannot start gives its candidates to the others.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .._util import make_dirs
from ..options import RunOptions
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


def evaluate_on(harness: Path, requests: Iterable[dict], options: RunOptions,
                devices: Sequence[int], out: Path) -> Iterator[RequestOutcome]:
    """Judge every request (``{"binary": ..., "kernel": ..., ...}`` as ``kpair evaluate
    --jsonl`` reads them) on a pool of sessions, one per device."""
    make_dirs(out)
    first = taken_numbers(out)  # a re-used directory: numbering goes on after it

    @contextlib.contextmanager
    def open_worker(device: int):
        with Session(harness, replace(options, device=device), out=out / DEVICES / str(device),
                     record=False) as session:
            def judge(req: dict) -> tuple[Result, Attempt | None]:
                return session.attempt(
                    req["binary"], kernel=req.get("kernel"),
                    launch_override=req.get("launch_override"), label=req.get("label"),
                    source=req.get("source"), build=req.get("build"),
                    strategy=req.get("strategy"), params=req.get("params"))
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


__all__ = ["RequestOutcome", "evaluate_on"]
