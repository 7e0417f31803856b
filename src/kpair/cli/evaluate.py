"""``kpair evaluate HARNESS CANDIDATE...``: judge many candidate opts in one session.

With ``--jsonl`` the candidates come from stdin instead, one JSON object per line
(``{"binary": PATH, "kernel": ..., "launch_override": {...}, "label": ..., "source": ...,
"build": ..., "strategy": ..., "params": {...}}``; only ``binary`` is required; or ``{"plan":
PATH, "label": ...}``, a launch plan with its code objects beside it), and each
verdict goes to stdout as one JSON line (``{"n", "label", "status", "summary", "speedup",
"ci95", "combined_ci95", "difference", "failed_check", "reason", "result"}``) — for external
agents. Nothing a candidate prints reaches stdout: it goes to ``OUT/worker.log``. A request
line that is not a JSON object with a ``binary`` gets ``{"error": ...}`` and the session goes
on; no request field is ever executed or interpreted beyond these. With ``--json`` (and no
``--jsonl``) stdout is one JSON document once every candidate is judged (``{"out",
"attempts": [<the lines above>], "exit_code"}``); the per-candidate lines go to stderr.

A candidate file named ``*.json`` is a launch plan (``opt.plan.json``), judged as
``kpair pair --plan`` pairs one: the harness's range against the plan's launches.

A re-used ``-o`` directory keeps its results: numbering goes on after its highest attempt.
Exit status: the highest of the candidates' own — 0 every candidate passed, 1 some failed
correctness and none errored, 2–5 some could not be judged (a bad request line 2, a bad
candidate file 3, ...; ``kpair.errors``); every verdict is in attempts.jsonl either way.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .._util import check_output_dir
from ..errors import InputError, KpairError, UsageError
from ..scale.evaluate import evaluate_on, judge_request
from ..session import result_line
from .base import Command, check_device, parse_launch
from .run import (
    add_pool_arguments,
    add_run_arguments,
    check_harness_dir,
    options_from_args,
    pool_devices,
)

_FIELDS = {"binary", "kernel", "launch_override", "label", "source", "build", "strategy",
           "params", "plan"}


def _request(path: Path) -> dict:
    """A candidate file as a request: a launch plan (``*.json``) or a code object."""
    return {"plan": str(path)} if path.suffix == ".json" else {"binary": str(path)}


def _line(attempt, result, out: Path) -> dict:
    """The JSON line of one verdict: the Result, with its number and file from the
    attempts.jsonl line the session made for it (``kpair.session.result_line``)."""
    return result_line(attempt.n, result, out / attempt.result)


class Evaluate(Command):
    """Judge candidate opts one after another on one harness, in one persistent worker."""

    name = "evaluate"
    help = "judge many candidate opts on one harness (a session)"

    @classmethod
    def add_arguments(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("harness", type=Path, help="pair harness directory (its ref judges)")
        p.add_argument("candidates", nargs="*", type=Path,
                       help="candidate code objects, or launch plans (*.json, their code "
                       "objects beside them)")
        p.add_argument("-o", "--out", type=Path, default=Path("evaluations"),
                       help="results, attempts.jsonl and worker.log (default ./evaluations)")
        p.add_argument("--kernel", help="kernel name in the candidates (default: the "
                       "harness's opt kernel)")
        p.add_argument("--jsonl", action="store_true",
                       help="read candidates from stdin and write verdicts to stdout, one "
                       "JSON object per line")
        add_run_arguments(p)
        add_pool_arguments(p)

    def run(self, args: argparse.Namespace) -> int:
        from ..session import Session  # looked up per call: tests replace Session

        if not args.jsonl and not args.candidates:
            raise UsageError("give candidate files, or --jsonl to read them from stdin")
        if args.jsonl and getattr(args, "json", False):
            raise UsageError("--json (one document) and --jsonl (one line per candidate) "
                             "exclude each other: give one")
        for c in [] if args.jsonl else args.candidates:  # before anything is made
            if not c.is_file():
                raise InputError("no such candidate file" if not c.exists() else
                                 "not a file: a candidate is a code object", path=c)
        options_from_args(args)  # a usage error before anything is touched
        check_harness_dir(args.harness)
        check_output_dir(args.out)
        devices = pool_devices(args, _backend(args.harness))
        check_device(_backend(args.harness), args.device)
        if devices is not None:
            return self._pooled(args, devices)
        worst = 0
        emit = _Emitter(args)
        with Session(args.harness, options_from_args(args), out=args.out) as session:
            requests = self._requests(args) if args.jsonl else (
                _request(c) for c in args.candidates)
            for req in requests:
                if "error" in req:
                    emit(req, f"ERROR: {req['error']}")
                    worst = max(worst, 2)
                    continue
                what = req.get("plan") or req["binary"]
                try:
                    result, attempt = judge_request(session, req, kernel=args.kernel)
                except KpairError as e:
                    emit({"error": str(e), _kind(req): what}, f"ERROR: {e}")
                    worst = max(worst, e.exit_code)
                    continue
                emit(_line(attempt, result, args.out),
                     f"[{attempt.n}] {what}: {result.summary()}")
                worst = max(worst, result.exit_code)
        return emit.end(worst)

    def _pooled(self, args: argparse.Namespace, devices: tuple[int, ...]) -> int:
        """One session per device, candidates dealt out; verdicts in completion order."""

        bad: list[dict] = []

        def valid():  # read by the pool as devices become free (stdin is a stream)
            requests = self._requests(args) if args.jsonl else (
                _request(c) for c in args.candidates)
            for req in requests:
                if "error" in req:
                    print(json.dumps(req) if args.jsonl else f"ERROR: {req['error']}",
                          flush=True, file=sys.stdout if args.jsonl else sys.stderr)
                    bad.append(req)
                else:
                    yield req

        worst = 0
        emit = _Emitter(args)
        for e in evaluate_on(args.harness, valid(), options_from_args(args), devices,
                             args.out):
            binary = e.request.get("plan") or e.request.get("binary")
            if e.error is not None:
                emit({"error": str(e.error), _kind(e.request): binary, "device": e.device},
                     f"ERROR: {e.error}")
                worst = max(worst, getattr(e.error, "exit_code", 5))
                continue
            emit(_line(e.attempt, e.result, args.out) | {"device": e.device},
                 f"[{e.n}] {binary} (device {e.device}): {e.result.summary()}")
            worst = max(worst, e.result.exit_code)
        return emit.end(max(worst, 2) if bad else worst)

    @staticmethod
    def _requests(args: argparse.Namespace):
        for raw in sys.stdin:
            if not raw.strip():
                continue
            try:
                req = json.loads(raw)
            except json.JSONDecodeError as e:
                yield {"error": f"not JSON: {e}"}
                continue
            if not isinstance(req, dict) or \
                    sum(isinstance(req.get(k), str) for k in ("binary", "plan")) != 1:
                yield {"error": "each line must be a JSON object with a string 'binary' "
                       "(a code object) or 'plan' (a launch plan)"}
                continue
            unknown = sorted(set(req) - _FIELDS)
            if unknown:
                yield {"error": f"unknown field {unknown[0]!r} (fields: "
                       f"{', '.join(sorted(_FIELDS))})"}
                continue
            if req.get("launch_override") is not None:
                try:  # the backend's geometry limits, as pair --opt-launch checks them
                    parse_launch(json.dumps(req["launch_override"]), _backend(args.harness),
                                 "launch_override")
                except UsageError as e:
                    yield {"error": str(e), _kind(req): req.get("plan") or req["binary"]}
                    continue
            yield req


class _Emitter:
    """Where each verdict goes: a JSON line on stdout (``--jsonl``); a human line on stdout,
    or on stderr under ``--json``, whose one document ``end`` prints."""

    def __init__(self, args: argparse.Namespace):
        self.jsonl, self.json, self.out = args.jsonl, args.json and not args.jsonl, args.out
        self.lines: list[dict] = []

    def __call__(self, line: dict, human: str) -> None:
        if self.jsonl:
            print(json.dumps(line), flush=True)
            return
        self.lines.append(line)
        print(human, flush=True, file=sys.stderr if self.json else sys.stdout)

    def end(self, code: int) -> int:
        if self.json:
            print(json.dumps({"out": str(self.out), "attempts": self.lines,
                              "exit_code": code}, indent=1))
        elif not self.jsonl:
            print(f"attempts: {self.out / 'attempts.jsonl'}")
        return code


def _kind(req: dict) -> str:
    return "plan" if req.get("plan") is not None else "binary"


def _backend(harness: Path) -> str:
    try:
        spec = json.loads((harness / "harness.json").read_text())
    except (OSError, ValueError):
        return "host"  # the session's own open says what is wrong with it
    return spec.get("backend", "host") if isinstance(spec, dict) else "host"
