"""Harness jobs: one harness verified on one device, the resume rule, and the local runner.

``HarnessJob`` names a harness, where its result goes and (for ``verify --each``) the device
it must run on. ``run_job`` runs it in an isolated worker and never raises: whatever goes
wrong around the worker is an ``error`` Result too, so one job's trouble never ends a batch.
``run_local`` spreads jobs over a ``DevicePool``; ``kpair.scale.ray`` runs the same jobs as
Ray tasks. Both yield ``(job, device, Result)`` in completion order, and the parent has written
each result before it is yielded.

The resume rule (``finished``): a job is not run again when an interrupted batch of the same
options left a journal (``Journal``), and its result file was written after that journal and
after every input file of the harness (each file listed in ``MANIFEST.sha256`` and the
manifest itself), says ``pass`` or ``fail``, and names the current manifest's sha256 as its
``inputs_digest``. An ``error`` is always run again. ``--fresh`` drops the journal.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .. import progress
from .._util import utc_now, write_text_atomic
from ..errors import FormatError
from ..harness import MANIFEST
from ..isolation import run_isolated, with_device_index
from ..options import RunOptions
from ..result import Result, error_result
from ..snapshot import sha256
from .pool import DevicePool, Task

#: Left in a release root while a batch runs; its presence at start means one was interrupted.
JOURNAL = ".kpair-verify.json"


@dataclass(frozen=True)
class HarnessJob:
    """Verify ``harness``, writing ``out`` (result.json; samples.npz and worker.log beside it),
    on ``device`` (None: any device of the pool)."""

    key: str
    harness: Path
    out: Path
    device: int | None = None


def run_job(job: HarnessJob, options: RunOptions, device: int) -> Result:
    """The job's Result on ``device``, written to ``job.out``; never raises."""

    options = replace(options, device=device, device_options={
        k: v for k, v in (options.device_options or {}).items() if k != "device"} or None)
    try:
        job.out.parent.mkdir(parents=True, exist_ok=True)
        return run_isolated(job.harness, options, out=job.out)
    except Exception as e:  # noqa: BLE001 - one operator's trouble must not end the batch
        result = error_result(job.harness, f"{type(e).__name__}: {e}", stage="run",
                              kind=type(e).__name__)
        result = result.replace(environment=with_device_index(None, options))
        with contextlib.suppress(OSError):
            result.write(job.out)
        return result


def run_local(jobs: Iterable[HarnessJob], options: RunOptions, devices: Sequence[int]
              ) -> Iterator[tuple[HarnessJob, int, Result]]:
    """Every job on a pool of ``devices``, one in flight per device; completion order."""
    tasks = [Task(j.key, j, j.device) for j in jobs]
    started = itertools.count(1)  # the k of "harness k of n", as devices take them

    def open_worker(device: int):
        def work(job: HarnessJob) -> Result:
            where = f"{job.key} on device {device}" if len(devices) > 1 else job.key
            with progress.task(where, next(started), len(tasks)):
                return run_job(job, options, device)

        return contextlib.nullcontext(work)

    for done in DevicePool(devices).run(tasks, open_worker):
        result = done.value
        if done.error is not None:  # run_job does not raise; a pool fault still gets a row
            result = error_result(done.task.payload.harness, done.error, stage="run")
        yield done.task.payload, done.device, result


# ------------------------------------------------------------------ resume


@dataclass(frozen=True)
class Journal:
    """What an unfinished batch was run with; a resumed batch keeps only results it made."""

    path: Path
    settings: dict

    @classmethod
    def begin(cls, root: Path, settings: dict, *, fresh: bool) -> tuple[Journal, bool]:
        """Start a batch: (the journal, whether it resumes an interrupted one with the same
        settings). A journal of other settings, or ``fresh``, starts over."""
        path = root / JOURNAL
        if not fresh and path.is_file():
            try:
                old = json.loads(path.read_text())
            except (OSError, ValueError):
                old = None
            if isinstance(old, dict) and old.get("settings") == settings:
                return cls(path, settings), True
        write_text_atomic(path, json.dumps({"started": utc_now(), "pid": os.getpid(),
                                            "settings": settings}, sort_keys=True))
        return cls(path, settings), False

    def end(self) -> None:
        """The batch is complete (its index written): nothing is left to resume."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def finished(job: HarnessJob, journal: Journal) -> Result | None:
    """The job's result if the resume rule (module docstring) lets it stand, else None."""

    try:
        made = job.out.stat().st_mtime_ns
        if made <= journal.path.stat().st_mtime_ns:
            return None
        manifest = job.harness / MANIFEST
        inputs = [manifest] + [job.harness / line.split("  ", 1)[1]
                               for line in manifest.read_text().splitlines() if "  " in line]
        if any(made <= p.stat().st_mtime_ns for p in inputs):
            return None
        result = Result.read(job.out)
    except (OSError, FormatError, IndexError):
        return None

    if result.status not in ("pass", "fail") or \
            result.inputs_digest != sha256(manifest.read_bytes()):
        return None
    return result


__all__ = ["HarnessJob", "JOURNAL", "Journal", "finished", "run_job", "run_local"]
