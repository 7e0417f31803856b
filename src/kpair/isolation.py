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
import json
import os
import selectors
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

from ._util import private_tempdir, sweep_stale_tempdirs
from .errors import KpairError, WorkerFailed
from .pipeline import SAMPLES, Facts, RunOptions, execute
from .result import Result, error_result

LOG = "worker.log"
_MAX_MESSAGE = 256 << 20  # a result with every mismatch listed stays far below this

#: The check whose extra launches run in a trust stage (named when one of them crashes).
_STAGE_CHECK = {"trust:poison": "poisoned_outputs", "trust:differential": "differential",
                "trust:timing": "timing_integrity"}


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
    read_fd, write_fd = os.pipe()
    cmd = [sys.executable, "-I", "-c", _BOOT, json.dumps(_import_path()), str(root),
           "--channel", str(write_fd), "--parent", str(os.getpid()),
           "--options", json.dumps(options.to_json())]
    stage: str | None = None
    final: dict | None = None
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    cwd=scratch, env=_worker_env(), pass_fds=(write_fd,),
                                    start_new_session=True)
        finally:
            os.close(write_fd)
        try:
            deadline = time.monotonic() + options.timeout_s
            for message in _messages(read_fd, deadline):
                if "stage" in message and isinstance(message["stage"], str):
                    stage = message["stage"]
                elif "result" in message:
                    final = message
            timed_out = time.monotonic() >= deadline and proc.poll() is None
            if timed_out:
                _kill_group(proc)
            code = proc.wait(timeout=max(0.0, deadline - time.monotonic()) + 5)
        except BaseException:
            _kill_group(proc)  # Ctrl-C, SIGTERM handlers, a bug: the worker never outlives us
            raise
        finally:
            os.close(read_fd)
            _kill_group(proc)  # anything the worker left in its group
    if timed_out:
        return error_result(root, f"timed out after {options.timeout_s:g} s in stage "
                            f"{stage!r}; the worker was killed", stage=stage, kind="Timeout",
                            exit_code=WorkerFailed.exit_code), None
    if final is None:
        return error_result(root, _describe_exit(code, stage), stage=stage,
                            kind=WorkerFailed.__name__, exit_code=WorkerFailed.exit_code), None
    try:
        result = Result.from_json(final["result"], path="worker message")
        samples = base64.b64decode(final["samples"], validate=True) \
            if final.get("samples") is not None else None
    except (KpairError, ValueError, TypeError) as e:
        return error_result(root, f"the worker's result is not valid: {e}", stage=stage,
                            kind=WorkerFailed.__name__, exit_code=WorkerFailed.exit_code), None
    return result, samples


def _messages(fd: int, deadline: float):
    """JSON objects, one per line, from ``fd`` until EOF or ``deadline``. Lines that are not
    JSON objects are dropped: the channel is kpair's, but a candidate must not crash it."""
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    buf = b""
    try:
        while (left := deadline - time.monotonic()) > 0:
            if not sel.select(timeout=min(left, 1.0)):
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            buf += chunk
            if len(buf) > _MAX_MESSAGE:
                break
            *lines, buf = buf.split(b"\n")
            for line in lines:
                with contextlib.suppress(ValueError):
                    obj = json.loads(line)
                    if isinstance(obj, dict):
                        yield obj
    finally:
        sel.close()


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
    channel = os.fdopen(args.channel, "w", buffering=1)
    # Nothing printed by the worker or a kernel reaches the channel: it is a separate fd.
    os.set_inheritable(args.channel, False)

    def send(message: dict) -> None:
        channel.write(json.dumps(message) + "\n")
        channel.flush()

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
