"""The KernelBench drivers' scheduler: per problem a chain of stages, the untimed ones
(capture with its torch import and ``torch.compile``, replay, pair) run ``jobs`` at a time,
the timed ones (``kpair run`` and its re-run) one at a time with the GPU to themselves.

- ``Gate``: a readers-writer lock over two ``flock``\\ ed files, shared across processes. An
  untimed stage holds it shared while it may touch the GPU (a capture's program takes it
  itself, after its imports and before its first CUDA call: ``hold_gate_from_env``); a timed
  stage holds it exclusive, so no capture, replay or pair runs on the GPU while a published
  interval is measured. Writers go first: once a timed stage asks, no new shared holder gets
  in (the turnstile), the ones in flight finish, then the timed stage runs.
- ``Scheduler``: problems (``Job``) go through ``Stage``\\ s in order. Untimed stages run in a
  pool of ``jobs`` threads (each stage is a subprocess); timed stages queue, and run in
  phases: once ``timed_batch`` of them wait (or no untimed work is left), the scheduler takes
  the gate exclusive and runs every queued timed stage, then gives it back. A stage starts
  only if its estimated seconds fit what is left before the deadline; a problem not started
  yet is admitted only if its untimed chain and every admitted problem's timed stages still
  fit. Estimates start from ``Stage.est_s`` and follow the measured seconds as the call goes.
- Resume: each problem's stage records are saved in ``<work>/<job>/state.json`` as each
  stage ends, so a call cut short (deadline, kill) continues a half-done problem at its first
  stage without a record; a decided problem is written by the driver's ``finish`` and skipped
  by the next call.

Every stage, its start, end and kind, goes into ``Scheduler.log`` (what the CPU tests check:
no timed stage overlaps an untimed one); a stage that holds the gate shared starts and ends
in the log while it holds it (``gate_s``: its wait).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

#: The environment variable that names the gate's folder to a captured program.
GATE_ENV = "KB_GPU_GATE"
#: GPU memory one untimed job may take besides its problem's bytes: a CUDA context with
#: PyTorch's modules loaded eagerly (capture asks for CUDA_MODULE_LOADING=EAGER), Inductor's
#: autotuning workspace and the caching allocator's slack (a guess, on the high side).
JOB_CONTEXT_BYTES = 3 << 30


class Abort(Exception):
    """Raised by a stage when the call cannot go on (capture cannot start on this machine):
    the scheduler starts nothing more, lets the stages in flight end, and leaves every
    undecided problem for the next call; ``Scheduler.aborted`` holds the message."""


class Gate:
    """A readers-writer lock over ``folder/gate.turn`` and ``folder/gate.rw`` (``flock``:
    released by the kernel when its holder dies, so a killed capture never keeps it)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.turn, self.rw = self.folder / "gate.turn", self.folder / "gate.rw"

    def _open(self, path: Path):
        return open(path, "a+")   # noqa: SIM115 - held across the with block by the caller

    def acquire_shared(self):
        """Take the gate shared; returns the open file to give to ``release``."""
        turn = self._open(self.turn)
        try:
            fcntl.flock(turn, fcntl.LOCK_EX)   # wait behind a timed stage that asked first
            rw = self._open(self.rw)
            fcntl.flock(rw, fcntl.LOCK_SH)
        finally:
            fcntl.flock(turn, fcntl.LOCK_UN)
            turn.close()
        return rw

    @staticmethod
    def release(handle) -> None:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()

    @contextlib.contextmanager
    def shared(self):
        handle = self.acquire_shared()
        try:
            yield
        finally:
            self.release(handle)

    @contextlib.contextmanager
    def exclusive(self):
        turn = self._open(self.turn)
        fcntl.flock(turn, fcntl.LOCK_EX)   # new shared holders wait from here on
        rw = self._open(self.rw)
        try:
            fcntl.flock(rw, fcntl.LOCK_EX)   # the ones in flight finish
            yield
        finally:
            fcntl.flock(rw, fcntl.LOCK_UN)
            rw.close()
            fcntl.flock(turn, fcntl.LOCK_UN)
            turn.close()


_HELD: list = []


def hold_gate_from_env() -> float:
    """In a captured program: take the gate named by ``KB_GPU_GATE`` shared and keep it until
    the process ends (the capture's GPU work, its snapshots' writing included, is then never
    concurrent with a timed stage). Seconds waited (0.0 without the variable)."""
    folder = os.environ.get(GATE_ENV)
    if not folder or _HELD:
        return 0.0
    t0 = time.monotonic()
    _HELD.append(Gate(Path(folder)).acquire_shared())
    return round(time.monotonic() - t0, 3)


def default_jobs(cpu_count: int | None, *, gpu_bytes: int, per_job_bytes: int,
                 gpu_share: float = 0.8) -> int:
    """Untimed jobs at a time: half the CPUs (a ``torch.compile`` takes about two), at most
    what ``gpu_share`` of the GPU's memory holds at ``JOB_CONTEXT_BYTES + per_job_bytes`` a
    job; at least 1."""
    by_cpu = max(1, (cpu_count or 2) // 2)
    by_gpu = max(1, int(gpu_bytes * gpu_share) // max(1, JOB_CONTEXT_BYTES + per_job_bytes))
    return max(1, min(by_cpu, by_gpu))


@dataclass(frozen=True)
class Stage:
    """One step of a problem. ``run(job, timeout_s)`` returns the stage's record (a dict,
    saved in the job's state); a record with ``"stop"`` (the outcome) decides the problem
    there. ``timed``: run alone, gate exclusive; else in the pool, holding the gate shared
    unless ``gate_inside`` (the stage's program takes it itself)."""

    name: str
    run: Callable[[Job, float], dict]
    est_s: float
    timed: bool = False
    gate_inside: bool = False


@dataclass
class Job:
    """One problem: ``key``, its folder (``state.json``: the stage records so far) and what
    the driver keeps beside (``data``)."""

    key: str
    folder: Path
    data: dict = field(default_factory=dict)
    state: dict = field(default_factory=dict)

    def load(self) -> Job:
        with contextlib.suppress(OSError, ValueError):
            got = json.loads((self.folder / "state.json").read_text())
            if isinstance(got, dict):
                self.state = got
        return self

    def save(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / "state.tmp"
        tmp.write_text(json.dumps(self.state))
        os.replace(tmp, self.folder / "state.json")

    @property
    def started(self) -> bool:
        return bool(self.state)

    @property
    def stopped(self) -> str | None:
        for rec in self.state.values():
            if isinstance(rec, dict) and rec.get("stop"):
                return rec["stop"]
        return None


class Scheduler:
    """Runs ``jobs`` through ``stages`` (see the module's docstring). ``finish(job)`` is
    called, in the scheduler's thread, for each problem decided (every stage done, or one
    stopped it); problems the deadline left are in ``left`` after ``run``."""

    def __init__(self, stages: list[Stage], *, jobs: int, deadline: float, gate: Gate,
                 finish: Callable[[Job], None], timed_batch: int | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 say: Callable[[str], None] = lambda s: None):
        if not stages or len({s.name for s in stages}) != len(stages):
            raise ValueError("stages need distinct names")
        self.stages, self.jobs, self.deadline, self.gate = stages, max(1, jobs), deadline, gate
        self.finish, self.clock, self.say = finish, clock, say
        self.timed_batch = max(1, timed_batch or self.jobs)
        self.seen: dict[str, list[float]] = {s.name: [] for s in stages}
        self.log: list[dict] = []
        self.left: list[Job] = []
        self.aborted: str | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ estimates
    def est(self, stage: Stage) -> float:
        seen = self.seen[stage.name]
        return statistics.fmean(seen) if seen else stage.est_s

    def remaining(self) -> float:
        return self.deadline - self.clock()

    def next_stage(self, job: Job) -> Stage | None:
        if job.stopped:
            return None
        return next((s for s in self.stages if s.name not in job.state), None)

    def _todo(self, job: Job, timed: bool) -> float:
        return sum(self.est(s) for s in self.stages
                   if s.name not in job.state and s.timed == timed)

    # ------------------------------------------------------------------ stages
    def _run_stage(self, stage: Stage, job: Job) -> dict:
        """One stage, timed into the log; its record (errors become a stopping record)."""
        timeout = max(1.0, self.remaining())
        t0 = self.clock()
        entry = {"job": job.key, "stage": stage.name, "timed": stage.timed, "start": t0}
        try:
            if stage.timed or stage.gate_inside:
                rec = stage.run(job, timeout)
            else:
                with self.gate.shared():   # its start once it holds the gate
                    entry["start"] = self.clock()
                    entry["gate_s"] = round(entry["start"] - t0, 3)
                    try:
                        rec = stage.run(job, timeout)
                    finally:   # its end while it holds the gate: a timed stage may start next
                        entry["end"] = self.clock()
        except Abort as e:
            rec = {"cut": True, "abort": str(e)[:2000]}
        except Exception as e:  # noqa: BLE001 - one problem's failure must not end the call
            rec = {"stop": "driver error", "error": f"{type(e).__name__}: {e}"[:2000]}
        entry.setdefault("end", self.clock())
        rec = dict(rec or {})
        rec.setdefault("wall_s", round(entry["end"] - t0, 3))
        with self._lock:
            self.log.append(entry)
            if not rec.get("stop") and not rec.get("cut"):
                self.seen[stage.name].append(entry["end"] - t0)
        return rec

    def _record(self, job: Job, stage: Stage, rec: dict) -> None:
        if rec.get("abort") and not self.aborted:
            self.aborted = rec["abort"]
            self.say(f"stopping: {self.aborted}")
        if rec.get("cut"):   # ran out of its time: not a record, done again next call
            return
        job.state[stage.name] = rec
        job.save()

    # ------------------------------------------------------------------ the loop
    def run(self, jobs: list[Job]) -> list[Job]:
        """Every job until decided or left by the deadline; the decided ones, in order."""
        pool_q: deque[Job] = deque()
        timed_q: deque[Job] = deque()
        admitted: list[Job] = []
        decided: list[Job] = []
        fresh = deque(j for j in jobs if not j.started)

        def route(job: Job) -> None:
            stage = self.next_stage(job)
            if stage is None:
                decided.append(job)
                if job in admitted:
                    admitted.remove(job)
                self.finish(job)
            elif stage.timed:
                timed_q.append(job)
            else:
                pool_q.append(job)

        for job in jobs:   # half-done problems first: their work is partly paid for
            if job.started:
                admitted.append(job)
                route(job)
        inflight: dict[Future, tuple[Job, Stage]] = {}
        with ThreadPoolExecutor(self.jobs) as pool:
            while True:
                for fut in [f for f in inflight if f.done()]:
                    job, stage = inflight.pop(fut)
                    self._record(job, stage, fut.result())
                    if stage.name in job.state:
                        route(job)
                    else:
                        self._leave(job, admitted)
                if self.aborted:   # nothing new starts; what is queued is left
                    for job in [*pool_q, *timed_q]:
                        self._leave(job, admitted)
                    pool_q.clear()
                    timed_q.clear()
                while len(inflight) < self.jobs and not self.aborted:
                    job = self._next_pool(pool_q, fresh, admitted)
                    if job is None:
                        break
                    stage = self.next_stage(job)
                    inflight[pool.submit(self._run_stage, stage, job)] = (job, stage)
                if timed_q and (len(timed_q) >= self.timed_batch
                                or not (inflight or pool_q or fresh)):
                    self._timed_phase(timed_q, route, admitted)
                    continue
                if not (inflight or pool_q or timed_q):
                    break
                if inflight:
                    wait(list(inflight), timeout=0.5, return_when=FIRST_COMPLETED)
        self.left += list(fresh)
        return decided

    def _leave(self, job: Job, admitted: list[Job]) -> None:
        if job in admitted:
            admitted.remove(job)
        self.left.append(job)

    def _next_pool(self, pool_q: deque[Job], fresh: deque[Job], admitted: list[Job]
                   ) -> Job | None:
        """The next untimed stage's job that fits: an admitted one's, else a fresh problem
        whose untimed chain and timed stages fit beside every admitted problem's."""
        while pool_q:
            job = pool_q.popleft()
            stage = self.next_stage(job)
            if self.est(stage) <= self.remaining():
                return job
            self.say(f"{job.key}: no time for {stage.name} ({self.est(stage):.0f} s "
                     f"expected, {self.remaining():.0f} s left); left for the next call")
            self._leave(job, admitted)
        if not fresh:
            return None
        job = fresh[0]
        timed_backlog = sum(self._todo(j, timed=True) for j in admitted)
        need = self._todo(job, timed=False) + self._todo(job, timed=True) + timed_backlog
        if need > self.remaining():
            self.say(f"no time to start {job.key} or any after it ({need:.0f} s expected with "
                     f"the timed stages queued, {self.remaining():.0f} s left)")
            self.left += list(fresh)
            fresh.clear()
            return None
        fresh.popleft()
        admitted.append(job)
        return job

    def _timed_phase(self, timed_q: deque[Job], route, admitted: list[Job]) -> None:
        """Every queued timed stage, one at a time, the gate exclusive throughout (the stages
        they lead to that are timed too run in the same phase)."""
        t0 = self.clock()
        with self.gate.exclusive():
            waited = self.clock() - t0
            self.say(f"timed phase: {len(timed_q)} waiting (gate taken after {waited:.1f} s)")
            while timed_q:
                job = timed_q.popleft()
                stage = self.next_stage(job)
                if self.est(stage) > self.remaining():
                    self.say(f"{job.key}: no time for {stage.name} ({self.est(stage):.0f} s "
                             f"expected, {self.remaining():.0f} s left); left for the next "
                             "call")
                    self._leave(job, admitted)
                    continue
                rec = self._run_stage(stage, job)
                rec.setdefault("gate_wait_s", round(waited, 3))
                self._record(job, stage, rec)
                if stage.name in job.state:
                    route(job)
                else:
                    self._leave(job, admitted)


def overlaps(log: list[dict]) -> list[tuple[dict, dict]]:
    """Pairs (timed entry, untimed entry) of the log whose [start, end] intervals overlap."""
    timed = [e for e in log if e["timed"]]
    other = [e for e in log if not e["timed"]]
    return [(t, o) for t in timed for o in other
            if t["start"] < o["end"] and o["start"] < t["end"]]


def simulate(n: int, *, jobs: int, pool_s: float, timed_s: float, timed_batch: int | None = None,
             deadline: float = float("inf")) -> dict:
    """What ``Scheduler`` is expected to do with ``n`` problems whose untimed stages take
    ``pool_s`` seconds (one job's slot, one after the other) and timed ones ``timed_s`` (the
    GPU alone): waves of ``jobs`` untimed chains; a timed phase once ``timed_batch`` (default
    ``jobs``) problems wait or nothing untimed is left, after the chains in flight end (the
    gate's drain); no problem admitted whose chain and the timed backlog do not fit the
    deadline. Seconds, problems decided, and the seconds the GPU was taken for timed stages.
    A model for planning calls (``plan`` of the drivers), not a measurement."""
    batch = max(1, timed_batch or jobs)
    now, decided, queued, started, timed_total = 0.0, 0, 0, 0, 0.0
    slots: list[float] = []   # end times of the untimed chains in flight
    while True:
        while len(slots) < jobs and started < n and \
                now + pool_s + (queued + len(slots) + 1) * timed_s <= deadline:
            slots.append(now + pool_s)
            started += 1
        if queued and (queued >= batch or not slots):
            drained = max([now, *slots])   # the chains in flight end before the gate is taken
            now = drained + queued * timed_s
            timed_total += queued * timed_s
            decided, queued = decided + queued, len(slots)   # those wait for the next phase
            slots = []
            continue
        if not slots:
            break
        first = min(slots)
        slots.remove(first)
        now, queued = max(now, first), queued + 1
    return {"problems": n, "decided": decided, "expected_s": round(now, 1),
            "timed_s": round(timed_total, 1), "untimed_s": round(now - timed_total, 1)}
