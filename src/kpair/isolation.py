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

from ._util import private_tempdir, sweep_stale_tempdirs
from .errors import KpairError, WorkerFailed
from .pipeline import SAMPLES, Facts, RunOptions, execute
from .result import Result, error_result

LOG = "worker.log"
LOG_CAP = 1 << 20          # bytes of worker output kept in the log
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
    samples_path = out_path.with_name(SAMPLES)
    log_path = out_path.with_name(LOG)
    sweep_stale_tempdirs()
    started = time.monotonic()
    with private_tempdir("run") as scratch:
        result, samples = _supervise(root, options, scratch, log_path)
    if result.status == "error" and result.error.stage == "trust:mutate":
        # ref itself cannot take a mutated input (it faulted, or hung): the mutation says
        # nothing about opt, so the differential runs are dropped, with a warning.
        why = result.error.message
        options = replace(options, skip_checks=(*options.skip_checks, "differential"))
        with private_tempdir("run") as scratch:
            result, samples = _supervise(root, options, scratch, log_path)
        result = result.replace(warnings=[*(result.warnings or []), (
            f"differential: dropped, ref itself failed on a mutated input ({why})")])
    result = result.replace(wall_s=round(time.monotonic() - started, 3), log=LOG)
    if samples is not None and result.speed is not None:
        from .snapshot import sha256

        if sha256(samples) != result.speed.samples_sha256:
            result = error_result(root, "the worker's samples do not match the sha256 in its "
                                  "result", stage="measure", kind="WorkerFailed",
                                  exit_code=WorkerFailed.exit_code).replace(log=LOG)
        else:
            _write_bytes_atomic(samples_path, samples)
    result.write(out_path)
    return result


def _supervise(root: Path, options: RunOptions, scratch: Path, log_path: Path
               ) -> tuple[Result, bytes | None]:
    key = secrets.token_bytes(32)
    channel_r, channel_w = os.pipe()
    output_r, output_w = os.pipe()
    cmd = [sys.executable, "-I", "-c", _BOOT, json.dumps(_import_path()), str(root),
           "--channel", str(channel_w), "--parent", str(os.getpid()),
           "--options", json.dumps(options.to_json())]
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=output_w, stderr=output_w,
                                cwd=scratch, env=_worker_env(), pass_fds=(channel_w,),
                                start_new_session=True)
    finally:
        os.close(channel_w)
        os.close(output_w)
    pump = _Pump(channel_r, output_r, log_path, key)
    deadline = time.monotonic() + options.timeout_s
    try:
        proc.stdin.write(key)  # the key that signs the worker's messages, read first thing
        proc.stdin.close()
        pump.run(deadline)
        try:
            code: int | None = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            code = None
    except BaseException:
        _kill_group(proc)  # Ctrl-C, SIGTERM handlers, a bug: the worker never outlives us
        raise
    finally:
        _kill_group(proc)  # the worker's group: anything it left behind
        pump.close()
    stage, final = pump.stage, pump.final
    if code is None:
        return error_result(root, f"timed out after {options.timeout_s:g} s in stage "
                            f"{stage!r}; the worker was killed", stage=stage, kind="Timeout",
                            exit_code=WorkerFailed.exit_code), None
    if final is None:
        return error_result(root, _describe_exit(code, stage), stage=stage,
                            kind=WorkerFailed.__name__, exit_code=WorkerFailed.exit_code), None
    try:
        result = Result.from_json(final.get("result"), path="worker message")
        samples = base64.b64decode(final["samples"], validate=True) \
            if final.get("samples") is not None else None
    except (KpairError, ValueError, TypeError) as e:
        return error_result(root, f"the worker's result is not valid: {e}", stage=stage,
                            kind=WorkerFailed.__name__, exit_code=WorkerFailed.exit_code), None
    return result, samples


class _Pump:
    """Reads the worker's channel and its output until both end (or a deadline).

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
        self.final: dict | None = None
        self._buf = b""

    def run(self, deadline: float) -> None:
        sel = selectors.DefaultSelector()
        open_fds = {self.channel, self.output}
        for fd in open_fds:
            sel.register(fd, selectors.EVENT_READ)
        try:
            while open_fds and (left := deadline - time.monotonic()) > 0:
                for k, _ in sel.select(timeout=min(left, 1.0)):
                    chunk = os.read(k.fd, 1 << 20)
                    if not chunk:
                        sel.unregister(k.fd)
                        open_fds.discard(k.fd)
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
            elif "result" in message:
                self.final = message

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


def _write_bytes_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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
    args = p.parse_args(argv)
    _die_with_parent(args.parent)
    key = sys.stdin.buffer.read(32)
    sys.stdin.close()
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

    samples = None
    try:
        options = RunOptions.from_json(json.loads(args.options))
        result, samples = execute(args.harness, options, facts=facts, stage=stage)
    except KpairError as e:
        result = error_result(args.harness, e, stage=current["stage"], facts=facts.keep())
    except Exception as e:  # noqa: BLE001 - an unexpected bug still must not claim a verdict
        result = error_result(args.harness, f"{type(e).__name__}: {e}",
                              stage=current["stage"], kind="InternalError",
                              traceback=traceback.format_exc(), facts=facts.keep())
    send({"result": result.to_json(),
          "samples": base64.b64encode(samples).decode() if samples is not None else None})
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
