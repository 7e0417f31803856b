"""Process isolation: both halves of a worker, over the protocol of ``kpair.protocol``.

A harness runs in a worker process so that a kernel that faults, poisons its context or hangs
costs only that process. The parent starts ``worker_main`` (the child) with ``start`` — the
one way a worker is started, for ``kpair run`` (``run_isolated``) and for sessions
(``kpair.session``) alike — and gives it:

- no path it could write a verdict to: the child reports over a pipe (``--channel FD``),
  signed lines of ``kpair.protocol`` (``Stage`` as it goes, ``Ready`` once set up, then a
  ``VerdictMessage`` per candidate); the parent reads them with a deadline, validates each Result
  and writes ``result.json`` (and ``samples.npz``) itself (``JudgedResult.write``);
- an environment of its own: ``python -I`` (no current directory on the import path, no
  ``PYTHON*`` variables; glibc's allocator asked for huge pages, ``WORKER_MALLOC``), the
  parent's resolved import path minus the current directory, a private scratch directory as
  its working directory, and stdout/stderr sent to a log file beside the result
  (``worker.log``, named in ``result.json``), never to the terminal;
- a lifetime bound to the parent's: its own process group, killed when it hangs (below), on
  Ctrl-C and on any exception in the parent; ``PR_SET_PDEATHSIG`` kills it if the parent
  dies (SIGKILL included) — it is forked from a thread that lives as long as the parent
  (``_spawn``), since that signal follows the forking thread. An idle session worker waiting
  for its next candidate is never timed: the hang limit runs only while it is judging.
  Scratch directories carry their owner's pid, and each run sweeps those whose owner is
  gone.

The hang limit: with ``RunOptions.timeout_s`` set (``--timeout``), a worker has that many
seconds for its setup and for each candidate. Without it (the default), the limit follows
ref's own time: the parent times ref's stage (its baseline runs, restores and checks
included) as the worker reports it, and from then on kills a worker that sends no sign of
progress (a stage, a measurement tick) for ``hang_limit(ref_s)`` = max(``HANG_FLOOR_S``,
``HANG_FACTOR`` x that time) seconds; before ref has run, setup may go ``SETUP_LIMIT_S``
without news. opt's code runs only after ref's stage, so a hanging opt costs seconds, not
minutes. The worker's stages and ticks also feed the parent's progress display
(``kpair.progress``).

The setup/retry rule lives in ``start`` and nowhere else: when ref itself cannot take a
mutated input (the worker faulted or hung during stage ``trust:mutate``), the mutation says
nothing about opt, so setup is run again without the differential check and every Result of
that worker carries the warning ``differential: dropped, ref itself failed on a mutated input
(...)``.

What the parent can and cannot trust is in docs/format.md ("Trust model").
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import secrets
import selectors
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import replace as replace_
from pathlib import Path

from . import progress
from ._util import (
    check_output,
    child_command,
    kill_group,
    private_tempdir,
    sweep_stale_tempdirs,
    utc_now,
    write_bytes_atomic,
)
from .backends import open_device
from .errors import KpairError, WorkerFailed
from .pipeline import SAMPLES, Candidate, Facts, RunOptions, close, evaluate, own_candidate, prepare
from .protocol import (
    KEY_BYTES,
    Channel,
    InvalidLine,
    Judge,
    Reader,
    Ready,
    ReproductionMessage,
    Stage,
    Tick,
    VerdictMessage,
    WorkerMessage,
    decode_request,
    encode_request,
    options_arg,
    read_options,
    read_result,
)
from .replay import Reproduction, reproduce
from .replay import Reproduction as ReproductionReport
from .result import Result, error_result
from .snapshot import Snapshot, sha256

LOG = "worker.log"
LOG_CAP = 1 << 20          # bytes of worker output kept in the log
_GRACE_S = 5.0             # for a worker to exit once it has sent its result
_TICK_S = 0.5              # the worker sends a measurement tick at most this often

#: The hang limit without --timeout (module docstring): seconds of silence allowed once ref's
#: stage has been timed, at least HANG_FLOOR_S and HANG_FACTOR times that stage's time ...
HANG_FLOOR_S = 15.0
HANG_FACTOR = 50.0
#: ... and before it, during setup (verifying, placing and loading a large snapshot).
SETUP_LIMIT_S = 600.0
#: The stage whose wall time sets the hang limit.
REF_STAGE = "ref"


def hang_limit(ref_s: float) -> float:
    """Seconds a worker may go without news once ref's stage took ``ref_s`` seconds."""
    return max(HANG_FLOOR_S, HANG_FACTOR * ref_s)

#: The stage in which ref runs alone on the mutated inputs (see ``start``).
MUTATE_STAGE = "trust:mutate"

#: The check whose extra launches run in a trust stage (named when one of them crashes).
_STAGE_CHECK = {"trust:poison": "poisoned_outputs", MUTATE_STAGE: "differential",
                "trust:differential": "differential", "trust:timing": "timing_integrity"}


# ====================================================================== parent


def beside(out: str | os.PathLike) -> tuple[Path, Path]:
    """The samples file and worker log that belong to the result at ``out``: ``samples.npz``
    and ``worker.log`` beside a ``result.json``; ``<stem>.samples.npz`` and
    ``<stem>.worker.log`` beside any other name (``r2.json``: ``r2.samples.npz``), so that
    every result has its own."""
    out = Path(out)
    if out.name == "result.json":
        return out.with_name(SAMPLES), out.with_name(LOG)
    return out.with_name(f"{out.stem}.{SAMPLES}"), out.with_name(f"{out.stem}.{LOG}")


def check_outputs(out: str | os.PathLike, *, replace: bool) -> None:
    """Refuse, before a run starts, a result path (or its samples file or log) that may not
    be written (``_util.check_output``)."""
    check_output(out, replace=replace)  # first: "" or "." is a directory, not a file name
    for path in beside(out):
        check_output(path, replace=replace)


@dataclass(frozen=True)
class JudgedResult:
    """A verdict as the parent holds it: the validated Result and its raw samples (the bytes
    of the samples file, when speed was measured)."""

    result: Result
    samples: bytes | None = None

    def write(self, path: Path, *, replace: bool = True, log: bytes | None = None) -> Result:
        """Write the result at ``path`` and, beside it (``beside``), its samples (for a timed
        result; the file's name is recorded in ``speed.samples_file``) and ``log`` (the
        worker's output, when given; named in ``log``). Samples and log first: a result
        never names a file that is not there."""
        samples_path, log_path = beside(path)
        result = self.result
        new = [p for p in (samples_path, log_path) if not os.path.lexists(p)]
        try:
            if self.samples is not None and result.speed is not None:
                write_bytes_atomic(samples_path, self.samples, replace=replace)
                result = result.replace(speed=result.speed.replace(
                    samples_file=samples_path.name))
            if log is not None:
                write_bytes_atomic(log_path, log, replace=replace)
                result = result.replace(log=log_path.name)
            result.write(path, replace=replace)
        except BaseException:
            # No result (a full disk): the samples and log this call made go with it.
            for p in new:
                with contextlib.suppress(OSError):
                    p.unlink()
            raise
        return result


def run_isolated(root: str | os.PathLike, options: RunOptions | None = None, *,
                 out: str | os.PathLike | None = None, replace: bool = True) -> Result:
    """Run a harness in an isolated worker and write ``result.json`` (atomically), its
    samples and the worker's log beside it (``beside``).

    Returns the Result. Whatever happens in the worker — an exception, a crash, a hang, a
    forged or garbled message — the written result says so, and only a completed, correct
    run says ``"correct": true``. ``replace=False`` refuses (before the run) an output that
    exists. Nothing is written until the run ends: the log is kept in the scratch directory
    meanwhile, so an interrupted run leaves earlier files as they were.
    """
    root = Path(root).resolve()
    options = options or RunOptions()
    out_path = Path(out) if out else root / "result.json"
    check_outputs(out_path, replace=replace)
    sweep_stale_tempdirs()
    started = time.monotonic()
    with private_tempdir("run") as scratch:
        with start(root, options, scratch, scratch / LOG) as worker:
            outcome = JudgedResult(worker.failed) if worker.failed is not None else \
                worker.verdict(worker.deadline)
            worker.drain()  # the rest of its output, to the log
        log = (scratch / LOG).read_bytes()
        result = outcome.result.replace(wall_s=round(time.monotonic() - started, 3),
                                        environment=with_device_index(
                                            outcome.result.environment, options))
        return replace_(outcome, result=result).write(out_path, replace=replace, log=log)


def with_device_index(environment: dict | None, options: RunOptions) -> dict:
    """The environment with the device a run was given, also when the worker died before it
    could say (a crash, a hang): every result names the device it belongs to."""
    return {"device_index": options.ordinal, **(environment or {})}


def write_outcome(result: Result, samples: bytes | None, out_path: Path) -> Result:
    """Write ``result.json`` and, for a timed result, ``samples.npz`` beside it."""
    return JudgedResult(result, samples).write(out_path)


def start(root: Path, options: RunOptions, scratch: Path, log_path: Path, *,
          session: bool = False) -> Worker:
    """A worker for the harness at ``root``, started and set up: its ``failed`` is the
    Result that ends every judgement on it (None: ready for candidates).

    The setup/retry rule, the one place it is applied: if ref itself cannot take a mutated
    input (the worker faulted or hung during stage ``trust:mutate``), that worker is stopped
    and a fresh one set up with the differential check skipped; its ``warnings`` (added to
    every Result it gives) say so. A ``kpair run`` worker (``session=False``) judges the
    harness's own opt once set up; a session worker waits for ``Worker.judge``.
    """
    worker = Worker(root, options, scratch, log_path, session=session)
    why = worker.mutation_fault()
    if why is not None:
        worker.close()
        options = replace_(options, skip_checks=(*options.skip_checks, "differential"))
        worker = Worker(root, options, scratch, log_path, session=session, warnings=[
            f"differential: dropped, ref itself failed on a mutated input ({why})"])
    return worker


class Worker:
    """One worker process, from the parent's side: started in ``scratch`` with its output to
    ``log_path``, set up (``failed``, by ``deadline``: start plus the timeout), reports read
    through a ``_Pump``, and killed (with its whole process group) by ``close`` — which
    leaving a ``with`` block does by any way, an exception included. Use ``start``, which
    applies the setup/retry rule."""

    def __init__(self, root: Path, options: RunOptions, scratch: Path, log_path: Path, *,
                 session: bool = False, warnings: list[str] | None = None,
                 extra: tuple[str, ...] = ()):
        self.root, self.options, self.warnings = root, options, list(warnings or ())
        self.deadline = self._limit()
        key = secrets.token_bytes(KEY_BYTES)
        channel_r, channel_w = os.pipe()
        output_r, output_w = os.pipe()
        # Nothing secret on the command line (/proc/PID/cmdline is world-readable, also of a
        # non-dumpable process): the options (the check seed with --seed) follow the key on
        # stdin, the worker's private channel.
        cmd = child_command("kpair.isolation", "worker_main", str(root),
                            "--channel", str(channel_w), "--parent", str(os.getpid()),
                            *extra, *(["--session"] if session else []))
        if options.seed is not None:
            hide_argument("--seed")
        try:
            self.proc = _spawn(cmd, stdin=subprocess.PIPE, stdout=output_w,
                               stderr=output_w, cwd=scratch, env=_worker_env(),
                               pass_fds=(channel_w,), start_new_session=True)
        finally:
            os.close(channel_w)
            os.close(output_w)
        self.pump = _Pump(channel_r, output_r, log_path, key)
        try:
            # The key that signs the worker's messages, then the options, one line.
            self.proc.stdin.write(key + options_arg(options).encode() + b"\n")
            self.proc.stdin.flush()
            if not session:
                self.proc.stdin.close()
        except OSError:
            pass  # it died at once: the next wait says how
        self.failed: Result | None = None
        if not extra:  # a harness worker: set up before anything else
            try:
                self.failed = self._ready(self.deadline)
            except BaseException:  # Ctrl-C included: no worker outlives a failed start
                self.close()
                raise

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        kill_group(self.proc)  # the worker's group: anything it left behind
        self.pump.close()

    def _limit(self):
        """The deadline of the next wait: fixed (``--timeout`` from now), or a function of
        the time of the worker's last news and of ref's time (the hang limit)."""
        if self.options.timeout_s is not None:
            return time.monotonic() + self.options.timeout_s
        started = time.monotonic()

        def deadline() -> float:
            pump = getattr(self, "pump", None)
            if pump is None:
                return started + SETUP_LIMIT_S
            news = max(started, pump.news)
            return news + (SETUP_LIMIT_S if pump.ref_s is None else hang_limit(pump.ref_s))

        return deadline

    def drain(self) -> None:
        """Log the rest of the worker's output while it exits (a few seconds at most)."""
        self.pump.run(time.monotonic() + _GRACE_S, want=None)

    def mutation_fault(self) -> str | None:
        """Why setup ended in stage ``trust:mutate`` with an error (ref faulted or hung on a
        mutated input), or None."""
        f = self.failed
        if f is not None and f.status == "error" and f.error.stage == MUTATE_STAGE:
            return f.error.message
        return None

    # -------------------------------------------------------------- judging

    def judge(self, judge: Judge) -> JudgedResult:
        """Send a session worker one candidate and wait (the timeout) for its verdict."""
        deadline = self._limit()
        try:
            self.proc.stdin.write(encode_request(judge))
            self.proc.stdin.flush()
        except (OSError, ValueError):
            return JudgedResult(self._warned(error_result(
                self.root, "the session worker was gone before the candidate could be sent",
                kind="WorkerFailed", exit_code=WorkerFailed.exit_code)))
        return self.verdict(deadline, id=judge.id)

    def verdict(self, deadline: Deadline, *, id: int | None = None) -> JudgedResult:
        """The next ``VerdictMessage`` (its Result validated, its samples checked against their
        sha256), or an error Result saying why none came: the worker crashed, exited, ran
        past ``deadline`` (then it is killed), or sent something that is no verdict."""
        message = self.pump.run(deadline, want=VerdictMessage)
        stage = self.pump.stage
        if not isinstance(message, VerdictMessage):
            return JudgedResult(self._warned(self._no_message(message, deadline)))
        try:
            if message.id != id:
                raise ValueError(f"a verdict for candidate {message.id!r}, not {id!r}")
            result = read_result(message.result)
        except (KpairError, ValueError) as e:
            return JudgedResult(self._warned(self._error(
                f"the worker's result is not valid: {e}", stage)))
        samples = message.samples
        if samples is not None and (result.speed is None or
                                    sha256(samples) != result.speed.samples_sha256):
            return JudgedResult(self._warned(self._error(
                "the worker's samples do not match the sha256 in its result", "measure")))
        return JudgedResult(self._warned(result), samples)

    def reproduction(self, deadline: Deadline, runs: int) -> ReproductionReport:
        """The ``ReproductionMessage`` of a ``--reproduce`` worker, or an error report saying why
        none came."""
        message = self.pump.run(deadline, want=ReproductionMessage)
        if isinstance(message, ReproductionMessage):
            try:
                return message.read()
            except KpairError as e:
                why = f"the worker's report is not valid: {e}"
        elif isinstance(message, InvalidLine):
            why = f"the worker's report is not valid: {message.why}"
        else:
            why = _describe_exit(self.proc.poll(), self.pump.stage) \
                if self.proc.poll() is not None else self._timed_out(self.pump.stage)
        return ReproductionReport(snapshot=str(self.root), kernel="", runs=runs,
                                  status="error", error=why)

    # -------------------------------------------------------------- internals

    def _ready(self, deadline: Deadline) -> Result | None:
        message = self.pump.run(deadline, want=Ready)
        if not isinstance(message, Ready):
            return self._warned(self._no_message(message, deadline))
        if message.failed is None:
            return None
        try:
            return self._warned(read_result(message.failed))
        except KpairError as e:
            return self._warned(self._error(f"the worker's result is not valid: {e}",
                                            self.pump.stage))

    def _no_message(self, message: InvalidLine | None, deadline: Deadline) -> Result:
        """The error Result when no awaited message came (``message``: what came instead)."""
        stage = self.pump.stage
        if isinstance(message, InvalidLine):
            return self._error(f"the worker's message is not valid: {message.why}", stage)
        try:
            code: int | None = self.proc.wait(timeout=max(0.0, _at(deadline) -
                                                          time.monotonic()))
        except subprocess.TimeoutExpired:
            code = None
            kill_group(self.proc)
        if code is None:
            return error_result(self.root, f"{self._timed_out(stage)}; the worker was killed",
                                stage=stage,
                                kind="Timeout", exit_code=WorkerFailed.exit_code)
        return self._error(_describe_exit(code, stage), stage)

    def _timed_out(self, stage: str | None) -> str:
        """Why the worker was given up on, in words (the limit that ran out)."""
        where = f" in stage {stage!r}" if stage else ""
        if self.options.timeout_s is not None:
            return f"timed out after {self.options.timeout_s:g} s{where} (--timeout)"
        ref_s = self.pump.ref_s
        if ref_s is None:
            return (f"timed out{where}: no sign of progress for {SETUP_LIMIT_S:g} s before "
                    "ref's stage ended (--timeout sets another limit)")
        return (f"timed out{where}: no sign of progress for {hang_limit(ref_s):.1f} s (the "
                f"hang limit: max({HANG_FLOOR_S:g} s, {HANG_FACTOR:g} x ref's stage of "
                f"{ref_s:.3g} s); --timeout sets another)")

    def _error(self, message: str, stage: str | None) -> Result:
        return error_result(self.root, message, stage=stage, kind=WorkerFailed.__name__,
                            exit_code=WorkerFailed.exit_code)

    def _warned(self, result: Result) -> Result:
        if not self.warnings:
            return result
        return result.replace(warnings=[*(result.warnings or []), *self.warnings])


def replay_isolated(snapshot: str | os.PathLike, runs: int = 3, *, timeout_s: float = 600.0,
                    log: str | os.PathLike | None = None) -> ReproductionReport:
    """Replay a snapshot's own code object ``runs`` times in an isolated worker and say
    whether it reproduces the captured post-state (``kpair.replay.Reproduction``)."""
    root = Path(snapshot).resolve()
    sweep_stale_tempdirs()
    options = RunOptions(timeout_s=timeout_s)
    with private_tempdir("replay") as scratch:
        log_path = Path(log) if log else scratch / LOG
        with Worker(root, options, scratch, log_path,
                    extra=("--reproduce", str(runs))) as w:
            return w.reproduction(w.deadline, runs)


class _Pump:
    """Reads the worker's channel (through a ``protocol.Reader``: signed lines only) and its
    output, until a wanted message, both ends closing, or a deadline. The output (the
    worker's stdout and stderr, kernels' included) goes to the log file, at most ``LOG_CAP``
    bytes of it."""

    def __init__(self, channel: int, output: int, log_path: Path, key: bytes):
        self.channel, self.output = channel, output
        self.reader = Reader(key)
        # Appended to: a retried worker, or a session's next one, adds to the same log.
        self.log = open(log_path, "ab")  # noqa: SIM115 - closed by close()
        self.logged = self.dropped = 0
        self.stage: str | None = None
        self.messages: list[WorkerMessage | InvalidLine] = []
        self.open_fds = {channel, output}
        self.news = time.monotonic()          # when the last signed message came
        self.ref_s: float | None = None      # the wall time of ref's stage, once it ended
        self._ref_started: float | None = None

    def run(self, deadline: Deadline, *, want: type | None) -> WorkerMessage | InvalidLine | None:
        """Read until a message of type ``want`` (or an ``InvalidLine`` one) arrives (returned),
        both pipes end, or the deadline passes (None). Stages and ticks go on to the
        progress display; a callable ``deadline`` is asked again after every read."""
        sel = selectors.DefaultSelector()
        for fd in self.open_fds:
            sel.register(fd, selectors.EVENT_READ)
        try:
            while True:
                for i, m in enumerate(self.messages):
                    if want is not None and isinstance(m, (want, InvalidLine)):
                        return self.messages.pop(i)
                left = _at(deadline) - time.monotonic()
                if not self.open_fds or left <= 0:
                    return None
                for k, _ in sel.select(timeout=min(left, 1.0)):
                    chunk = os.read(k.fd, 1 << 20)
                    if not chunk:
                        sel.unregister(k.fd)
                        self.open_fds.discard(k.fd)
                    elif k.fd == self.output:
                        self._to_log(chunk)
                    else:
                        for m in self.reader.feed(chunk):
                            self._heard(m)
        finally:
            sel.close()

    def _heard(self, m: WorkerMessage | InvalidLine) -> None:
        now = self.news = time.monotonic()
        if self._ref_started is not None and self.ref_s is None and \
                not (isinstance(m, Stage) and m.name == REF_STAGE):
            self.ref_s = now - self._ref_started  # whatever follows ref's stage ends it
        if isinstance(m, Stage):
            self.stage = m.name
            if m.name == REF_STAGE and self._ref_started is None:
                self._ref_started = now
            progress.stage(m.name)
        elif isinstance(m, Tick):
            progress.measuring(m.meter)
        else:
            self.messages.append(m)

    def _to_log(self, chunk: bytes) -> None:
        room = max(0, LOG_CAP - self.logged)
        self.log.write(chunk[:room])
        self.logged += min(room, len(chunk))
        self.dropped += max(0, len(chunk) - room)

    def close(self) -> None:
        if self.dropped or self.reader.forged:
            self.log.write(f"\n[kpair: {self.dropped} more bytes of output dropped; "
                           f"{self.reader.forged} unsigned channel lines ignored]\n".encode())
        self.log.close()
        for fd in (self.channel, self.output):
            with contextlib.suppress(OSError):
                os.close(fd)


#: A deadline: a monotonic time, or a function giving it (it moves as news comes).
Deadline = float | Callable[[], float]


def _at(deadline: Deadline) -> float:
    return deadline() if callable(deadline) else deadline


#: The thread that starts workers for callers on other threads (see ``_spawn``).
_SPAWNER: concurrent.futures.ThreadPoolExecutor | None = None
_SPAWNER_LOCK = threading.Lock()


def _spawn(cmd: list[str], **kwargs) -> subprocess.Popen:
    """``subprocess.Popen`` from a thread that lives as long as this process.

    The worker asks for ``PR_SET_PDEATHSIG``, and Linux sends that signal when the *thread*
    that forked it ends, not the process. A caller on a short-lived thread (the MCP SDK runs
    each tool call on an anyio worker thread, which exits after 10 s idle) would have its
    idle session worker SIGKILLed, its log empty. So workers are forked from the main thread
    or from one long-lived spawner thread, never from a passing one."""
    global _SPAWNER
    if threading.current_thread() is threading.main_thread():
        return subprocess.Popen(cmd, **kwargs)
    with _SPAWNER_LOCK:
        if _SPAWNER is None:
            _SPAWNER = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="kpair-spawner")
    return _SPAWNER.submit(subprocess.Popen, cmd, **kwargs).result()


#: What the worker asks of glibc's allocator (>= 2.35; older ones ignore it): the mmap'd
#: chunks behind its large buffers (regions of tens of MB: mutated inputs, read-backs,
#: expected outputs) on transparent huge pages where the kernel offers them (``madvise``
#: mode). A fresh 32 MiB buffer then faults in 2 MiB pages, not 8,192 pages of 4 KiB: 3.6 ms
#: instead of 17 ms to allocate on the 2-CPU CI machine (benchmarks/worker_alloc.py).
WORKER_MALLOC = "glibc.malloc.hugetlb=1"


def _worker_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    tunables = env.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" not in tunables:   # a value the user chose stays
        env["GLIBC_TUNABLES"] = f"{tunables}:{WORKER_MALLOC}" if tunables else WORKER_MALLOC
    return env


def hide_argument(flag: str) -> int:
    """Overwrite with ``*`` the value of ``flag`` (``--seed N`` or ``--seed=N``) where the
    kernel keeps this process's own command line, the memory /proc/PID/cmdline shows to every
    process on the machine (a candidate walking up from its executor included); Python has
    its own copy (``sys.argv``), which stays. Returns the bytes hidden (0 where there is none,
    or off Linux)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])   # arg_start, arg_end (Linux 3.5+)
        with open("/proc/self/cmdline", "rb") as f:
            shown = f.read()
    except (OSError, IndexError, ValueError):
        return 0
    import ctypes

    if not 0 < start < end or end - start != len(shown) or \
            ctypes.string_at(start, end - start) != shown:
        return 0   # the command line was moved (a process title): nothing known to write
    hidden, at, want, tokens = 0, 0, flag.encode(), shown.split(b"\0")
    for i, token in enumerate(tokens):
        lo = None
        if token == want and i + 1 < len(tokens):
            lo, n = at + len(token) + 1, len(tokens[i + 1])
        elif token.startswith(want + b"="):
            lo, n = at + len(want) + 1, len(token) - len(want) - 1
        if lo is not None and n:
            ctypes.memmove(start + lo, b"*" * n, n)
            hidden += n
        at += len(token) + 1
    return hidden


def _describe_exit(code: int | None, stage: str | None) -> str:
    where = f" during stage {stage!r}" if stage else ""
    if stage in _STAGE_CHECK:
        where += (f" (extra launches of the {_STAGE_CHECK[stage]} check: rerun with "
                  f"--skip-check {_STAGE_CHECK[stage]} to leave it out)")
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the worker was killed by {name}{where} (a kernel crashed the process)"
    return f"the worker exited with status {code}{where} without sending a result"


# ====================================================================== child

def worker_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="kpair worker")
    p.add_argument("harness", type=Path)
    p.add_argument("--channel", type=int, required=True)
    p.add_argument("--parent", type=int, required=True)
    p.add_argument("--session", action="store_true",
                   help="after setup, judge candidates read from stdin, one per line")
    p.add_argument("--reproduce", type=int, metavar="RUNS",
                   help="HARNESS is a snapshot: replay its own code object RUNS times")
    args = p.parse_args(argv)
    _die_with_parent(args.parent)
    stdin = sys.stdin.buffer
    key = stdin.read(KEY_BYTES)
    options = stdin.readline().decode() or "{}"
    if not args.session:
        stdin.close()
    sys.dont_write_bytecode = True  # nothing written beside kpair's code from here on
    channel = Channel(args.channel, key)
    # Nothing printed by the worker or a kernel reaches the channel: it is a separate fd.
    os.set_inheritable(args.channel, False)
    with progress.using(_ToParent(channel)):
        if args.reproduce is not None:
            channel.send(ReproductionMessage.of(_reproduce(args.harness, args.reproduce)))
            return 0
        requests = (decode_request(line) for line in stdin) if args.session else None
        return _serve(args.harness, read_options(options), channel, requests)


class _ToParent(progress.Reporter):
    """The worker's progress reporter: stages and measurement ticks (at most one per
    ``_TICK_S``) go to the parent over the channel, which shows them."""

    def __init__(self, channel: Channel):
        super().__init__()
        self.channel, self.sent = channel, 0.0

    def stage(self, name: str) -> None:
        self.channel.send(Stage(name))

    def measuring(self, meter: progress.Meter) -> None:
        now = time.monotonic()
        if now - self.sent >= _TICK_S:
            self.sent = now
            self.channel.send(Tick(meter))


def _serve(harness: Path, options: RunOptions, channel: Channel, requests) -> int:
    """Set the harness up (``Ready``), then judge each candidate (a ``VerdictMessage`` each): the
    ``Judge`` requests of a session (``requests``), or the harness's own opt (None). After an
    error the worker exits: the parent starts a fresh one for the next candidate."""

    facts = Facts(harness=str(harness), started=utc_now())
    current: dict[str, str | None] = {"stage": None}

    def stage(name: str) -> None:  # the stage also goes to the parent, as progress
        current["stage"] = name

    def guarded(job) -> tuple[Result, bytes | None, bool]:
        """(result, samples, whether the process is still fit for the next job)."""
        try:
            result, samples = job()
            return result, samples, True
        except KpairError as e:
            return error_result(harness, e, stage=current["stage"],
                                facts=facts.keep()), None, False
        except Exception as e:  # noqa: BLE001 - an unexpected bug still must not claim a verdict
            return error_result(harness, f"{type(e).__name__}: {e}",
                                stage=current["stage"], kind="InternalError",
                                traceback=traceback.format_exc(), facts=facts.keep()), None, False

    holder: dict = {}

    def setup():
        holder["run"], failed = prepare(harness, options, facts=facts, stage=stage)
        return failed, None

    failed, _, fit = guarded(setup)
    channel.send(Ready.of(failed))
    if failed is not None or not fit:
        return 0
    run = holder["run"]

    def own_opt() -> Candidate:
        return own_candidate(run.harness)   # its kernel, or its launch plan

    try:
        if requests is None:  # kpair run: the harness's own opt, the one candidate
            result, samples, _ = guarded(lambda: evaluate(run, own_opt(), stage))
            channel.send(VerdictMessage.of(result, samples))
            return 0
        for judge in requests:
            result, samples, fit = guarded(lambda j=judge: evaluate(run, j.candidate(), stage))
            channel.send(VerdictMessage.of(result, samples, judge.id))
            if not fit:
                return 0
    finally:
        close(run)
    return 0


def _reproduce(root: Path, runs: int):
    try:
        progress.stage("verify")
        snapshot = Snapshot.open(root)
        progress.stage(f"replay x{runs}")
        with open_device(snapshot.manifest.backend) as device:
            device.seal()
            return reproduce(device, snapshot, runs)
    except KpairError as e:
        return Reproduction(snapshot=str(root), kernel="", runs=runs, status="error",
                            error=f"{type(e).__name__}: {e}", exit_code=e.exit_code)



def _die_with_parent(parent: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux); if the parent is
    already gone, go now."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)
