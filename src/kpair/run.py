"""Running a pair harness: the in-process job, and the isolated runner around it.

``execute`` does the work in the current process: verify the harness, place the regions,
replay ref (it must reproduce the captured post-state: that is what makes the replay
faithful), replay opt and judge it under the policy, then time both with the ABBA meter.
``run_harness`` runs ``execute`` in a child process (``python -m kpair.worker``) with a time
limit, so a kernel that faults, poisons its context or hangs becomes an ``error`` result
naming the stage it died in, and the caller — a batch, a release — goes on.

With the trust checks on (the default; ``RunOptions(checks=False)`` / ``--no-checks`` turns
them off), ``kpair.audit.Audit`` repeats ref and opt, poisons write-only outputs, guards every
region, runs mutated inputs and cross-checks the timer; each check lands in ``result["trust"]``
and the first one that fails makes the status ``fail`` with its reason.

Statuses: ``pass`` (opt correct under the policy and every trust check, speed measured),
``fail`` (opt incorrect, or a trust check failed; ``speed`` null), ``error`` (no verdict could
be reached). Exit codes: 0 pass, 1 fail, else the error's ``exit_code`` (3 bad input files,
4 backend/architecture/symbol/ABI, 5 runtime). Only ``pass`` results carry
``"correct": true``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import __version__
from ._util import utc_now
from .errors import KpairError, UsageError, WorkerFailed
from .snapshot import sha256, write_json_atomic

RESULT_SCHEMA = "kpair.result"
RESULT_VERSION = 1
EXIT_PASS, EXIT_FAIL = 0, 1


@dataclass(frozen=True)
class RunOptions:
    """How to run a harness. Measurement defaults come from harness.json's ``measure``."""

    backend_options: dict | None = None
    relocate: bool = False
    cache: str = "cold"
    aa: bool = False
    min_blocks: int | None = None
    max_blocks: int | None = None
    rel_ci: float | None = None
    time_cap_s: float | None = None
    seed: int | None = None
    timeout_s: float = 600.0
    checks: bool = True
    skip_checks: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        from .trust import CHECKS

        object.__setattr__(self, "skip_checks", tuple(self.skip_checks))
        unknown = [c for c in self.skip_checks if c not in CHECKS]
        if unknown:
            raise UsageError(f"unknown check {unknown[0]!r} (one of {', '.join(CHECKS)})")

    def to_json(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()
                if v is not None}

    @classmethod
    def from_json(cls, obj: dict) -> RunOptions:
        return cls(**obj)


def _base_result(root: Path) -> dict:
    return {"schema": RESULT_SCHEMA, "schema_version": RESULT_VERSION,
            "kpair_version": __version__, "harness": str(root), "started": utc_now()}


def error_result(root: Path, error: BaseException | str, *, stage: str | None = None,
                 kind: str | None = None, partial: dict | None = None) -> dict:
    """An ``error`` result: never claims correctness, says what failed and where."""
    result = _base_result(root)
    if partial:
        result.update({k: v for k, v in partial.items()
                       if k in ("environment", "replay", "inputs_digest", "ref", "opt", "started")})
    message = str(error)
    result.update({"status": "error", "correct": None, "correctness": None, "speed": None,
                   "error": {"type": kind or type(error).__name__, "message": message,
                             "stage": stage}})
    return result


def execute(root: Path, options: RunOptions, *,
            stage: Callable[[str], None] = lambda s: None,
            samples_path: Path | None = None, result: dict | None = None) -> dict:
    """Run the harness at ``root`` in this process and return its result (not written).

    ``result``, when given, is filled as the run goes, so a caller that catches an error
    still has the environment and replay facts gathered before it.
    """
    from .backends import open_device
    from .harness import Harness
    from .policy import check
    from .replay import Replay

    result = result if result is not None else {}
    stage = _StageClock(stage, result)
    stage("verify")
    h = Harness.open(root)
    result.update(_base_result(root))
    result["inputs_digest"] = h.inputs_digest()
    result["ref"] = {"kernel": h.ref.kernel, "binary": h.ref.binary}
    result["opt"] = {"kernel": h.opt.kernel, "binary": h.opt.binary}
    stage("place")
    device = open_device(h.backend, **(options.backend_options or {}))
    try:
        result["environment"] = device.environment()
        replay = Replay(device, h.snapshot, relocate=options.relocate, cache=options.cache)
        result["replay"] = replay.info.to_json()
        stage("load")
        ref = device.load(h.binary(h.ref), h.ref.kernel, fmt=h.ref.format)
        opt = device.load(h.binary(h.opt), h.opt.kernel, fmt=h.opt.format)
        replay.check_abi(ref, "ref")
        replay.check_abi(opt, "opt")
        hints = {r.name: r.dtype for r in h.snapshot.manifest.regions if r.dtype}
        ref_k, opt_k = (ref, h.launch(h.ref)), (opt, h.launch(h.opt))
        audit = None
        if options.checks:
            from .audit import Audit

            seed = options.seed if options.seed is not None else secrets.randbits(32)
            audit = Audit(replay, h.policy, hints, seed=seed, skip=options.skip_checks,
                          harness=str(root))
            result["checks"] = {"enabled": True, "skipped": list(options.skip_checks),
                                "seed": seed}
        else:
            result["checks"] = {"enabled": False}

        stage("ref")
        ref_runs = audit.baseline(*ref_k) if audit else [replay.run(*ref_k)]
        if audit and audit.found["baseline_determinism"].failed:
            return _fail(result, audit, None, h.policy)
        fidelity = check(h.policy, replay.expected, ref_runs[0], dtype_hints=hints)
        result["replay"]["fidelity"] = fidelity.to_json()
        if not fidelity.passed:
            raise KpairError("the baseline (ref) does not reproduce the captured post-state "
                             f"under the policy, so the replay proves nothing: "
                             f"{fidelity.summary()}")
        if audit:
            stage("trust:poison")
            audit.discover(*ref_k)
        stage("opt")
        verdict = audit.run_opt(*opt_k) if audit else \
            check(h.policy, replay.expected, replay.run(*opt_k), dtype_hints=hints)
        result["correctness"] = {**verdict.to_json(), "policy": h.policy.to_json(),
                                 "summary": verdict.summary()}
        result["correct"] = verdict.passed
        if audit and verdict.passed and audit.failure() is None:
            stage("trust:differential")
            audit.differential(*ref_k, *opt_k)
        if not verdict.passed or (audit and audit.failure()):
            return _fail(result, audit, verdict, h.policy)
        if audit:
            stage("trust:timing")
            audit.timing(*ref_k, *opt_k)
            if audit.failure():  # before ABBA: work the timer misses may outlive the launch
                return _fail(result, audit, verdict, h.policy)

        stage("measure")
        speed = _measure(h, options, replay, audit, {"ref": ref_k, "opt": opt_k}, result,
                         samples_path, stage)
        if audit:
            audit.speed(speed.opt_median_s, speed.ref_median_s)
            if audit.failure():
                return _fail(result, audit, verdict, h.policy)
            _trust_report(result, audit)
        result["status"] = "pass"
        return result
    finally:
        stage(None)
        device.close()


class _StageClock:
    """``stage`` that also adds each stage's wall seconds to ``result["stage_s"]``."""

    def __init__(self, stage: Callable[[str], None], result: dict):
        self.stage, self.times = stage, result.setdefault("stage_s", {})
        self.name: str | None = None
        self.t = time.monotonic()

    def __call__(self, name: str | None) -> None:
        now = time.monotonic()
        if self.name is not None:
            self.times[self.name] = round(self.times.get(self.name, 0.0) + now - self.t, 6)
        self.name, self.t = name, now
        if name is not None:
            self.stage(name)


def _measure(h, options: RunOptions, replay, audit, kernels: dict, result: dict,
             samples_path: Path | None, stage: Callable[[str], None]):
    from .measure import StoppingRule, measure, save_samples

    cfg = {**h.info.get("measure", {}), **{
        k: v for k, v in (("min_blocks", options.min_blocks),
                          ("max_blocks", options.max_blocks),
                          ("rel_ci_halfwidth", options.rel_ci),
                          ("time_cap_s", options.time_cap_s)) if v is not None}}
    rule = StoppingRule(**{k: cfg[k] for k in ("min_blocks", "max_blocks",
                                               "rel_ci_halfwidth", "time_cap_s")
                           if k in cfg})

    def time_one(which: str) -> float:
        kernel, launch = kernels[which]
        if audit is not None:
            return audit.time_one(kernel, launch, which)
        return replay.time_one(kernel, launch)

    clocks_before = replay.device.clocks()
    speed, samples = measure(time_one, rule=rule, seed=options.seed)
    clocks_after = replay.device.clocks()
    result["speed"] = speed.to_json(samples_path.name if samples_path else None)
    if samples_path is not None:
        save_samples(samples, samples_path)
        # The samples archive's CRC catches accidents only; this ties it to the result.
        result["speed"]["samples_sha256"] = sha256(samples_path.read_bytes())
    result["speed"]["cache"] = options.cache
    if clocks_before or clocks_after:
        result["speed"]["clocks_mhz"] = {"before": clocks_before, "after": clocks_after}
    if options.aa:
        stage("aa")
        aa, _ = measure(time_one, rule=rule, seed=options.seed, aa=True)
        result["speed"]["aa_control"] = aa.to_json()
    return speed


def _trust_report(result: dict, audit) -> None:
    findings = audit.findings()
    result["trust"] = {name: f.to_json() for name, f in findings.items()}
    warnings = [f"{name}: {f.reason}" for name, f in findings.items()
                if f.passed is None and f.reason]
    if warnings:
        result["warnings"] = warnings


def _fail(result: dict, audit, verdict, policy) -> dict:
    """A ``fail`` result: the first failed trust check's reason, else the policy verdict's."""
    failure = audit.failure() if audit else None
    corr = result.get("correctness") or {"passed": False, "mode": policy.mode, "regions": [],
                                         "policy": policy.to_json()}
    if failure is not None:
        corr.update(passed=False, failed_check=failure.name,
                    summary=f"FAIL [{failure.name}]: {failure.reason}")
    result["correctness"] = corr
    if audit:
        _trust_report(result, audit)
    result.update(status="fail", correct=False, speed=None)
    return result


def run_harness(root: str | os.PathLike, options: RunOptions | None = None, *,
                out: str | os.PathLike | None = None) -> dict:
    """Run a harness in an isolated worker and write ``result.json`` (atomically).

    Returns the result. Whatever happens in the worker — an exception, a crash, a hang — the
    written result says so, and only a completed, correct run says ``"correct": true``.
    """
    root = Path(root).resolve()
    options = options or RunOptions()
    out_path = Path(out) if out else root / "result.json"
    samples_path = out_path.with_name("samples.npz")
    with tempfile.TemporaryDirectory(prefix="kpair-run-") as tmp:
        tmp = Path(tmp)
        result_tmp, stage_file = tmp / "result.json", tmp / "stage"
        cmd = [sys.executable, "-m", "kpair.worker", str(root), "--result", str(result_tmp),
               "--stage", str(stage_file), "--samples", str(tmp / "samples.npz"),
               "--options", json.dumps(options.to_json())]
        started = time.monotonic()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            code = proc.wait(timeout=options.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            code = None
        stage = stage_file.read_text().strip() if stage_file.exists() else None
        if result_tmp.exists():
            result = json.loads(result_tmp.read_text())
        elif code is None:
            result = error_result(root, f"timed out after {options.timeout_s:g} s in stage "
                                  f"{stage!r}; the worker was killed", stage=stage,
                                  kind="Timeout")
        else:
            result = error_result(root, _describe_exit(code, stage), stage=stage,
                                  kind=WorkerFailed.__name__)
        result["wall_s"] = round(time.monotonic() - started, 3)
        if (tmp / "samples.npz").exists() and result.get("speed"):
            os.replace(tmp / "samples.npz", samples_path)
        write_json_atomic(out_path, result)
    return result


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


#: The check whose extra launches run in a trust stage (named when one of them crashes).
_STAGE_CHECK = {"trust:poison": "poisoned_outputs", "trust:differential": "differential",
                "trust:timing": "timing_integrity"}


def _describe_exit(code: int, stage: str | None) -> str:
    where = f" during stage {stage!r}" if stage else ""
    if stage in _STAGE_CHECK:
        where += (f" (extra launches of the {_STAGE_CHECK[stage]} check: rerun with "
                  f"--skip-check {_STAGE_CHECK[stage]} to leave it out)")
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the worker was killed by {name}{where} (a kernel crashed the process)"
    return f"the worker exited with status {code}{where} without writing a result"


def exit_code(result: dict) -> int:
    if result.get("status") == "pass":
        return EXIT_PASS
    if result.get("status") == "fail":
        return EXIT_FAIL
    return int((result.get("error") or {}).get("exit_code") or WorkerFailed.exit_code)


def summarize(result: dict) -> str:
    """One line for people: the verdict the seed's users expect to read."""
    status = result.get("status")
    if status == "error":
        err = result.get("error") or {}
        return f"ERROR ({err.get('type')}): {err.get('message')}"
    corr = result.get("correctness") or {}
    mode = corr.get("mode", "?")
    if status == "fail":
        summary = corr.get("summary", "opt is incorrect")
        return summary if summary.startswith("FAIL") else f"FAIL: {summary}"
    s = result["speed"]
    lo, hi = s["ci95"]
    line = (f"PASS: {mode}, {s['speedup']:.3f}x faster, slot bias {s['slot_bias']:.4f}, "
            f"CI [{lo:.3f}, {hi:.3f}] ({s['blocks']} blocks, stopped by {s['stopped_by']}; "
            f"replay {result['replay']['mode']})")
    trust = result.get("trust")
    if trust:
        ran = [t for t in trust.values() if t.get("passed") is True]
        line += f"; {len(ran)} trust checks passed"
    for w in result.get("warnings") or []:
        line += f"; WARNING {w}"
    return line


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--aa", action="store_true", help="also run an A/A control (ref vs ref)")
    p.add_argument("--warm", action="store_true", help="warm cache (default: flushed, cold)")
    p.add_argument("--relocate", action="store_true",
                   help="force relocation (test the pointer-patching path)")
    p.add_argument("--min-blocks", type=int)
    p.add_argument("--max-blocks", type=int)
    p.add_argument("--rel-ci", type=float, help="stop when the CI half-width is below this")
    p.add_argument("--time-cap", type=float, help="seconds of measurement at most")
    p.add_argument("--seed", type=int, help="seed of the ABBA schedule and bootstrap")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds before a hung worker is killed (default 600)")
    p.add_argument("--json", action="store_true", help="print result.json instead of a line")
    from .trust import CHECKS

    p.add_argument("--no-checks", action="store_true",
                   help="skip every trust check (guards, poison, repeats, mutations, timing "
                   "cross-checks): faster, and trusts opt not to cheat")
    p.add_argument("--skip-check", action="append", default=[], choices=CHECKS,
                   metavar="CHECK", help=f"skip one trust check (repeatable): {', '.join(CHECKS)}")


def options_from_args(args: argparse.Namespace) -> RunOptions:
    return RunOptions(relocate=args.relocate, cache="warm" if args.warm else "cold",
                      aa=args.aa, min_blocks=args.min_blocks, max_blocks=args.max_blocks,
                      rel_ci=args.rel_ci, time_cap_s=args.time_cap, seed=args.seed,
                      timeout_s=args.timeout, checks=not getattr(args, "no_checks", False),
                      skip_checks=tuple(getattr(args, "skip_check", None) or ()))


def report_and_exit_code(result: dict, as_json: bool, where: Path) -> int:
    if as_json:
        print(json.dumps(result, indent=1))
    else:
        print(summarize(result))
        print(f"result: {where}")
    return exit_code(result)


def harness_main(root: Path, argv: list[str]) -> int:
    """Entry point of a harness's generated ``run_harness.py``."""
    p = argparse.ArgumentParser(prog="run_harness.py",
                                description=f"Run the pair harness in {root}.")
    add_run_arguments(p)
    args = p.parse_args(argv)
    try:
        result = run_harness(root, options_from_args(args))
    except (KpairError, UsageError) as e:
        print(f"kpair: {e}", file=sys.stderr)
        return e.exit_code
    return report_and_exit_code(result, args.json, root / "result.json")
