"""Process isolation: both halves of the worker protocol.

A harness runs in a worker process so that a kernel that faults, poisons its context or hangs
costs only that process. ``run_isolated`` (the parent) starts ``worker_main`` (the child) and
gives it:

- no path it could write a verdict to: the child reports over a pipe (``--channel FD``), as
  JSON lines, ``{"stage": name}`` as it goes and one final ``{"result": ..., "samples": ...}``;
  the parent reads that with a deadline, validates it as a ``Result`` and writes
  ``result.json`` (and ``samples.npz``) itself;
- an environment of its own: ``python -I`` (no current directory on the import path, no
  ``PYTHON*`` variables), the parent's resolved import path minus the current directory, a
  private scratch directory as its working directory, and stdout/stderr sent to a log file
  beside the result (``worker.log``, named in ``result.json``), never to the terminal;
- a lifetime bound to the parent's: its own process group, killed on timeout, on Ctrl-C and on
  any exception in the parent; ``PR_SET_PDEATHSIG`` kills it if the parent dies (SIGKILL
  included). Scratch directories carry their owner's pid, and each run sweeps those whose
  owner is gone.

What the parent can and cannot trust is in docs/format.md ("Trust model").
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import selectors
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

from ._util import private_tempdir, sweep_stale_tempdirs, write_bytes_atomic
from .errors import KpairError, WorkerFailed
from .formats import convert, to_builtins
from .pipeline import SAMPLES, Facts, RunOptions, execute
from .replay import Reproduction
from .result import Result, error_result
from .snapshot import sha256

LOG = "worker.log"
LOG_CAP = 1 << 20          # bytes of worker output kept in the log
_GRACE_S = 5.0             # for a worker to exit once it has sent its result
_MAX_MESSAGE = 256 << 20  # a result with every mismatch listed stays far below this

#: The check whose extra launches run in a trust stage (named when one of them crashes).
_STAGE_CHECK = {"trust:poison": "poisoned_outputs", "trust:mutate": "differential",
                "trust:differential": "differential", "trust:timing": "timing_integrity"}


# ====================================================================== parent


def run_isolated(root: str | os.PathLike, options: RunOptions | None = None, *,
                 out: str | os.PathLike | None = None) -> Result:
    """Run a harness in an isolated worker and write ``result.json`` (atomically).

    Returns the Result. Whatever happens in the worker — an exception, a crash, a hang, a
    forged or garbled message — the written result says so, and only a completed, correct
    run says ``"correct": true``.
    """
    root = Path(root).resolve()
    options = options or RunOptions()
    out_path = Path(out) if out else root / "result.json"
    sweep_stale_tempdirs()
    started = time.monotonic()
    result, samples = _run_once(root, options, out_path.with_name(LOG))
    if result.status == "error" and result.error.stage == "trust:mutate":
        # ref itself cannot take a mutated input (it faulted, or hung): the mutation says
        # nothing about opt, so the differential runs are dropped, with a warning.
        why = result.error.message
        options = replace(options, skip_checks=(*options.skip_checks, "differential"))
        result, samples = _run_once(root, options, out_path.with_name(LOG))
        result = result.replace(warnings=[*(result.warnings or []), (
            f"differential: dropped, ref itself failed on a mutated input ({why})")])
    result = result.replace(wall_s=round(time.monotonic() - started, 3), log=LOG,
                            environment=with_device_index(result.environment, options))
    write_outcome(result, samples, out_path)
    return result


def with_device_index(environment: dict | None, options: RunOptions) -> dict:
    """The environment with the device a run was given, also when the worker died before it
    could say (a crash, a hang): every result names the device it belongs to."""
    return {"device_index": options.ordinal, **(environment or {})}


def write_outcome(result: Result, samples: bytes | None, out_path: Path) -> Result:
    """Write ``result.json`` and, for a timed result, ``samples.npz`` beside it."""
    if samples is not None and result.speed is not None:
        write_bytes_atomic(out_path.with_name(SAMPLES), samples)
    result.write(out_path)
    return result


def _run_once(root: Path, options: RunOptions, log_path: Path) -> tuple[Result, bytes | None]:
    with private_tempdir("run") as scratch, _Worker(root, options, scratch, log_path) as w:
        outcome = w.wait_result(time.monotonic() + options.timeout_s)
        w.pump.run(time.monotonic() + _GRACE_S, want="")  # the rest of its output, to the log
        return outcome


class _Worker:
    """One worker process, from the parent's side: started in ``scratch`` with its output to
    ``log_path``, messages read through a ``_Pump``, and killed (with its whole process group)
    when the parent leaves the ``with`` block by any way, an exception included."""

    def __init__(self, root: Path, options: RunOptions, scratch: Path, log_path: Path, *,
                 session: bool = False, extra: tuple[str, ...] = ()):
        self.root, self.options = root, options
        key = secrets.token_bytes(32)
        channel_r, channel_w = os.pipe()
        output_r, output_w = os.pipe()
        cmd = [sys.executable, "-I", "-c", _BOOT, json.dumps(_import_path()), str(root),
               "--channel", str(channel_w), "--parent", str(os.getpid()),
               "--options", json.dumps(options.to_json()), *extra] + \
            (["--session"] if session else [])
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=output_w,
                                         stderr=output_w, cwd=scratch, env=_worker_env(),
                                         pass_fds=(channel_w,), start_new_session=True)
        finally:
            os.close(channel_w)
            os.close(output_w)
        self.pump = _Pump(channel_r, output_r, log_path, key)
        try:
            self.proc.stdin.write(key)  # the key that signs the worker's messages
            self.proc.stdin.flush()
            if not session:
                self.proc.stdin.close()
        except OSError:
            pass  # it died at once: wait_result says how

    def __enter__(self) -> _Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        _kill_group(self.proc)  # the worker's group: anything it left behind
        self.pump.close()

    def send(self, message: dict) -> bool:
        """A request to a session worker; False if it is gone."""
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
            return True
        except (OSError, ValueError):
            return False

    def wait_result(self, deadline: float, *, key: str = "result"
                    ) -> tuple[Result, bytes | None]:
        """The next message carrying ``key`` (as a validated Result and its samples), or an
        error Result saying why none came: the worker crashed, exited, or ran past
        ``deadline`` (then it is killed)."""
        message = self.pump.run(deadline, want=key)
        stage = self.pump.stage
        if message is None:
            try:
                code: int | None = self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                code = None
                _kill_group(self.proc)
            if code is None:
                return error_result(self.root, f"timed out after {self.options.timeout_s:g} s "
                                    f"in stage {stage!r}; the worker was killed", stage=stage,
                                    kind="Timeout", exit_code=WorkerFailed.exit_code), None
            return error_result(self.root, _describe_exit(code, stage), stage=stage,
                                kind=WorkerFailed.__name__,
                                exit_code=WorkerFailed.exit_code), None
        if message.get(key) is None:  # a session's setup that needed no verdict
            return None, None  # type: ignore[return-value]
        try:
            result = Result.from_json(message[key], path="worker message")
            samples = base64.b64decode(message["samples"], validate=True) \
                if message.get("samples") is not None else None
        except (KpairError, ValueError, TypeError, KeyError) as e:
            return error_result(self.root, f"the worker's result is not valid: {e}",
                                stage=stage, kind=WorkerFailed.__name__,
                                exit_code=WorkerFailed.exit_code), None
        if samples is not None and (result.speed is None or
                                    sha256(samples) != result.speed.samples_sha256):
            return error_result(self.root, "the worker's samples do not match the sha256 in "
                                "its result", stage="measure", kind=WorkerFailed.__name__,
                                exit_code=WorkerFailed.exit_code), None
        return result, samples


def replay_isolated(snapshot: str | os.PathLike, runs: int = 3, *, timeout_s: float = 600.0,
                    log: str | os.PathLike | None = None) -> Reproduction:
    """Replay a snapshot's own code object ``runs`` times in an isolated worker and say
    whether it reproduces the captured post-state (``kpair.replay.Reproduction``)."""
    root = Path(snapshot).resolve()
    sweep_stale_tempdirs()
    options = RunOptions(timeout_s=timeout_s)
    with private_tempdir("replay") as scratch:
        log_path = Path(log) if log else scratch / LOG
        with _Worker(root, options, scratch, log_path,
                     extra=("--reproduce", str(runs))) as w:
            message = w.pump.run(time.monotonic() + timeout_s, want="reproduction")
            if message is not None:
                try:
                    return convert(message["reproduction"], Reproduction,
                                   path="worker message")
                except KpairError as e:
                    why = f"the worker's report is not valid: {e}"
            else:
                why = _describe_exit(w.proc.poll(), w.pump.stage) \
                    if w.proc.poll() is not None else f"timed out after {timeout_s:g} s"
    return Reproduction(snapshot=str(root), kernel="", runs=runs, status="error", error=why)


class _Pump:
    """Reads the worker's channel and its output, until a wanted message, both ends closing,
    or a deadline.

    Channel lines are ``<hmac-sha256 hex> <json>``, signed with the key the worker got on its
    stdin; a line that does not verify is dropped (and counted), so output a candidate writes
    to any file descriptor it finds cannot pass for kpair's. The output (the worker's stdout
    and stderr, kernels' included) goes to the log file, at most ``LOG_CAP`` bytes of it.
    """

    def __init__(self, channel: int, output: int, log_path: Path, key: bytes):
        self.channel, self.output, self.key = channel, output, key
        self.log = open(log_path, "wb")  # noqa: SIM115 - closed by close()
        self.logged = self.dropped = self.forged = 0
        self.stage: str | None = None
        self.messages: list[dict] = []
        self.open_fds = {channel, output}
        self._buf = b""

    def run(self, deadline: float, *, want: str) -> dict | None:
        """Read until a message with key ``want`` arrives (returned), both pipes end, or the
        deadline passes (None)."""
        sel = selectors.DefaultSelector()
        for fd in self.open_fds:
            sel.register(fd, selectors.EVENT_READ)
        try:
            while True:
                for i, m in enumerate(self.messages):
                    if want in m:
                        return self.messages.pop(i)
                left = deadline - time.monotonic()
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
                        self._from_channel(chunk)
        finally:
            sel.close()

    def _to_log(self, chunk: bytes) -> None:
        room = max(0, LOG_CAP - self.logged)
        self.log.write(chunk[:room])
        self.logged += min(room, len(chunk))
        self.dropped += max(0, len(chunk) - room)

    def _from_channel(self, chunk: bytes) -> None:
        self._buf += chunk
        if len(self._buf) > _MAX_MESSAGE:
            self._buf = b""
            self.forged += 1
            return
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            mac, _, body = line.partition(b" ")
            want = hmac.new(self.key, body, hashlib.sha256).hexdigest().encode()
            if not hmac.compare_digest(mac, want):
                self.forged += 1
                continue
            message = json.loads(body)
            if "stage" in message:
                self.stage = message["stage"]
            else:
                self.messages.append(message)

    def close(self) -> None:
        if self.dropped or self.forged:
            self.log.write(f"\n[kpair: {self.dropped} more bytes of output dropped; "
                           f"{self.forged} unsigned channel lines ignored]\n".encode())
        self.log.close()
        for fd in (self.channel, self.output):
            with contextlib.suppress(OSError):
                os.close(fd)


def _import_path() -> list[str]:
    """Where the worker finds kpair and its dependencies: this process's resolved path,
    without the current directory (a ``kpair/`` folder there must not replace kpair)."""
    cwd = os.getcwd()
    here = str(Path(__file__).resolve().parent.parent)
    return [here] + [p for p in sys.path if p and os.path.isabs(p) and p != cwd and p != here]


def _worker_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


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

#: The worker's first lines, run under ``python -I``: the import path comes from the parent.
_BOOT = ("import sys, json; sys.path[:0] = json.loads(sys.argv.pop(1)); "
         "from kpair.isolation import worker_main; sys.exit(worker_main(sys.argv[1:]))")


def worker_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="kpair worker")
    p.add_argument("harness", type=Path)
    p.add_argument("--channel", type=int, required=True)
    p.add_argument("--parent", type=int, required=True)
    p.add_argument("--options", default="{}")
    p.add_argument("--session", action="store_true",
                   help="after setup, judge candidates read from stdin, one per line")
    p.add_argument("--reproduce", type=int, metavar="RUNS",
                   help="HARNESS is a snapshot: replay its own code object RUNS times")
    args = p.parse_args(argv)
    _die_with_parent(args.parent)
    requests = sys.stdin.buffer
    key = requests.read(32)
    if not args.session:
        requests.close()
    sys.dont_write_bytecode = True  # nothing written beside kpair's code from here on
    channel = os.fdopen(args.channel, "wb", buffering=0)
    # Nothing printed by the worker or a kernel reaches the channel: it is a separate fd.
    os.set_inheritable(args.channel, False)

    def send(message: dict) -> None:
        body = json.dumps(message).encode()
        channel.write(hmac.new(key, body, hashlib.sha256).hexdigest().encode() + b" " + body
                      + b"\n")

    from ._util import utc_now

    facts = Facts(harness=str(args.harness), started=utc_now())
    current: dict[str, str | None] = {"stage": None}

    def stage(name: str) -> None:
        current["stage"] = name
        send({"stage": name})

    def guarded(job) -> tuple[Result, bytes | None, bool]:
        """(result, samples, whether the process is still fit for the next job)."""
        try:
            result, samples = job()
            return result, samples, True
        except KpairError as e:
            return error_result(args.harness, e, stage=current["stage"],
                                facts=facts.keep()), None, False
        except Exception as e:  # noqa: BLE001 - an unexpected bug still must not claim a verdict
            return error_result(args.harness, f"{type(e).__name__}: {e}",
                                stage=current["stage"], kind="InternalError",
                                traceback=traceback.format_exc(), facts=facts.keep()), None, False

    def reply(result: Result, samples: bytes | None, **extra: object) -> None:
        send({"result": result.to_json(), **extra,
              "samples": base64.b64encode(samples).decode() if samples is not None else None})

    if args.reproduce is not None:
        send({"reproduction": to_builtins(_reproduce(args.harness, args.reproduce))})
        return 0
    options = RunOptions.from_json(json.loads(args.options))
    if not args.session:
        result, samples, _ = guarded(lambda: execute(args.harness, options, facts=facts,
                                                     stage=stage))
        reply(result, samples)
        return 0
    return _serve(args.harness, options, facts, stage, guarded, reply, send, requests)


def _reproduce(root: Path, runs: int):
    from .backends import open_device
    from .replay import Reproduction, reproduce
    from .snapshot import Snapshot

    try:
        snapshot = Snapshot.open(root)
        with open_device(snapshot.manifest.backend) as device:
            device.seal()
            return reproduce(device, snapshot, runs)
    except KpairError as e:
        return Reproduction(snapshot=str(root), kernel="", runs=runs, status="error",
                            error=f"{type(e).__name__}: {e}")


def _serve(harness: Path, options: RunOptions, facts: Facts, stage, guarded, reply, send,
           requests) -> int:
    """A session worker: set the harness up once, then judge each candidate that arrives on
    stdin (``{"id", "image", "kernel", "format", "launch_override", "label"}``, the image in
    base64) and reply ``{"id", "result", "samples"}``. After an error the worker exits: the
    parent starts a fresh one for the next candidate."""
    from .pipeline import Candidate, close, evaluate, prepare

    holder: dict = {}

    def setup():
        holder["run"], failed = prepare(harness, options, facts=facts, stage=stage)
        return failed, None

    failed, _, fit = guarded(setup)
    send({"ready": failed.to_json() if failed is not None else None})
    if failed is not None or not fit:
        return 0
    run = holder["run"]
    try:
        for line in requests:
            req = json.loads(line)
            cand = Candidate(base64.b64decode(req["image"]), req["kernel"], req["format"],
                             req.get("launch_override"), req.get("label", ""))
            result, samples, fit = guarded(lambda c=cand: evaluate(run, c, stage))
            reply(result, samples, id=req["id"])
            if not fit:
                return 0
    finally:
        close(run)
    return 0


def _die_with_parent(parent: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux); if the parent is
    already gone, go now."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)
