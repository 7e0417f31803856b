"""A work directory as an agent sees it: operators to describe, candidates to submit, winners
to publish. No MCP here: ``kpair.mcp.server`` exposes these methods as tools.

``Workspace(root, options)`` finds the operators under ``root`` (every snapshot directory and
every harness, a harness's own ``capture/`` not counted twice), as ``kpair optimize`` does
(``kpair.optimize.workbench``, which also makes the harnesses). Each operator gets, on first
use, an ``OperatorState`` under ``root/mcp/<operator>/``: the harness candidates are judged
on (a harness operator is its own; a snapshot's is an A/A pair of its captured code object,
``base/``), persistent ``kpair.session.Session`` s writing to one ``evaluations/``
(attempts.jsonl and one result.json per candidate, exactly as ``kpair evaluate`` writes them,
numbered in one sequence) and every candidate's code object (``candidates/NNNN.<ext>``, kept
for ``publish``). Sessions live until ``close``. Every method raises ``KpairError`` with
kpair's own message on bad input.

Two measurements, both with every trust check (a cheat fails either way): a submission is
judged *quick* by default — the light options of ``kpair optimize``'s prune stage
(``kpair.optimize.workbench.quick_options``: one replicate, few ABBA blocks, a short time
cap, no identical-binary control), an exploratory verdict in a fraction of a second for a
short kernel — or *full* on request (``full=True``: the workspace's run options,
replicated and controlled, the verdict ``kpair evaluate`` gives). Each has its own session,
started on first use. ``publish`` always runs the full measurement again (``release add``),
whatever judged the candidate.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ..candidate import Candidate
from ..capture.profile import format_table
from ..capture.profiler import run_profile
from ..capture.workflow import capture_program
from ..describe import describe_operator
from ..errors import KpairError, UsageError
from ..harness import Harness, create_harness
from ..optimize.workbench import (
    Operator,
    base_harness,
    captured_dispatches,
    find_operators,
    pair_harness,
    suffix,
)
from ..options import RunOptions
from ..policy import Policy
from ..release import add_operator
from ..scale.evaluate import plan_candidate
from ..session import Session, result_line, taken_numbers
from ..snapshot import Snapshot
from .build import build_candidate, recompiled_ptx, triton_facts
from .plans import OBJECT_FORMS, build_plan, discard, range_facts

#: What ``submit`` accepts as ``form``, and what each means.
FORMS = {
    "c": "C source of a host kernel (built with cc, as the host backend's code objects are)",
    "cuda": "CUDA C++ source (nvcc -cubin for the harness's architecture); extern \"C\" kernel",
    "ptx": "PTX text: its .entry parameters checked against ref's, then ptxas -> cubin",
    "triton": "the Triton kernel's Python source (same name and signature as the captured one), "
              "compiled with the captured config unless 'config' overrides it",
    "amdgpu-asm": "kpair asm's code.s of ref, edited (assembled back with LLVM)",
    "binary": "a code object (.so, cubin, fatbin, PTX or hsaco): base64 in 'code' or a 'path'",
    "plan": "a launch plan (the JSON text of opt.plan.json in 'code', or its 'path'): kernels "
            "with their own signatures bound to the range's regions, scratch and scalars; "
            "'objects' gives each code object a launch names as {\"form\": one of "
            + ", ".join(OBJECT_FORMS) + ", \"code\" or \"path\"} (triton: also "
            "constants, num_warps, num_stages, signature); checked before anything runs; "
            "the only form a range of several operations takes",
}
QUICK_NOTE = (" [quick measurement: exploratory; full=true, or publish, runs the full "
              "replicated one]")
MAX_TEXT = 200_000


@dataclass
class OperatorState:
    """One operator's evaluation state: its base harness, sessions (``quick``, ``full``:
    made on first use, sharing ``evaluations/``) and candidates."""

    name: str
    #: None for a range snapshot until its first launch plan (``base/`` is made with it).
    harness: Harness | None
    work: Path
    level: int = 1
    snapshot: Path | None = None  # a range snapshot's directory, while harness is None
    sessions: dict[str, Any] = field(default_factory=dict)
    candidates: dict[int, Candidate] = field(default_factory=dict)  # judged, kept on file
    ref_s: float | None = None
    last_sol: dict | None = None
    recompiled_ptx: tuple[str | None, str] | None = None  # (PTX, how), made once
    taken: int = 0  # the highest attempt number in evaluations/ (both sessions number on)

    @property
    def out(self) -> Path:
        return self.work / "evaluations"


class Workspace:
    """Operators under ``root`` and their sessions (see the module docstring)."""

    def __init__(self, root: str | os.PathLike, options: RunOptions | None = None, *,
                 quick: RunOptions | None = None, publish_options: RunOptions | None = None):
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise UsageError(f"work directory {self.root} does not exist")
        self.options = options or RunOptions()  # the full measurement
        #: The quick one (None: every submission is judged in full).
        self.quick = quick
        self.publish_options = publish_options or self.options
        self.lock = threading.RLock()  # tools may be called from worker threads
        self._states: dict[str, OperatorState] = {}

    def close(self) -> None:
        with self.lock:
            for state in self._states.values():
                for session in state.sessions.values():
                    session.close()
            self._states.clear()

    # ------------------------------------------------------------------ operators

    def operators(self) -> dict[str, Operator]:
        """name -> Operator, for every snapshot and harness under the root that is an
        operator (``kpair.optimize.workbench.find_operators``)."""
        return find_operators(self.root)

    def list(self) -> list[dict]:
        out = []
        for name, op in self.operators().items():
            kind, path = op.kind, op.path
            row: dict[str, Any] = {"operator": name, "kind": kind,
                                   "path": str(path.relative_to(self.root))}
            try:
                if kind == "harness":
                    h = Harness.open(path, verify=False)
                    m = h.snapshot.manifest
                    row.update(kernel=h.ref.kernel, format=h.ref.format)
                else:
                    m = Snapshot.open(path).manifest
                    row.update(kernel=m.code.kernel_name, format=m.code.format)
                row.update(backend=m.backend, arch=m.arch, complete=m.complete,
                           grid=list(m.launch.grid), block=list(m.launch.block),
                           region_bytes=sum(r.size for r in m.regions))
            except KpairError as e:
                row["error"] = str(e)
            out.append(row)
        return out

    def _find(self, operator: str) -> Operator:
        ops = self.operators()
        if operator not in ops:
            raise UsageError(f"no operator {operator!r} in {self.root} (operators: "
                             f"{', '.join(sorted(ops)) or 'none'})")
        return ops[operator]

    def state(self, operator: str) -> OperatorState:
        """The operator's state, made on first use (its base harness)."""

        with self.lock:
            if operator in self._states:
                return self._states[operator]
            op = self._find(operator)
            work = self.root / "mcp" / operator
            work.mkdir(parents=True, exist_ok=True)
            if op.kind == "snapshot" and Snapshot.open(op.snapshot).manifest.is_range \
                    and not (work / "base" / "harness.json").is_file():
                # A range is paired with a launch plan: its first one makes base/.
                state = OperatorState(operator, None, work, op.level, snapshot=op.snapshot)
            else:
                state = OperatorState(operator, base_harness(op, work), work, op.level)
            state.taken = taken_numbers(state.out)
            self._states[operator] = state
            return state

    def session(self, state: OperatorState, *, full: bool):
        """The operator's quick or full session (started on first use), ready to number its
        next attempt after every one ``evaluations/`` holds, whichever session made it."""
        mode = "full" if full or self.quick is None else "quick"
        session = state.sessions.get(mode)
        if session is None:
            session = state.sessions[mode] = Session(
                state.harness.root, self.options if mode == "full" else self.quick,
                out=state.out)
        # One numbering for both sessions (calls are serialised by the workspace lock).
        session.continue_after(state.taken)
        return session, mode

    # ------------------------------------------------------------------ describe

    def describe(self, operator: str, *, measure: bool = True, code: bool = True,
                 max_chars: int = MAX_TEXT) -> dict:
        """Everything an agent needs about one operator (see ``kpair.describe.operator``)."""

        with self.lock:
            state = self.state(operator)
            if state.harness is None:
                return self._describe_range(state)
            if measure and state.ref_s is None:
                self._measure_ref(state)
            out = describe_operator(state.harness, code=code, max_chars=max_chars,
                                    ref_s=state.ref_s, sol=state.last_sol,
                                    work=state.work) | {
                "operator": operator, "evaluations": str(state.out),
                "forms": FORMS}
            m = state.harness.snapshot.manifest
            if m.is_range:
                out["range"] = range_facts(m)
            if state.harness.backend == "cuda":
                try:
                    out["triton"] = triton_facts(state.harness)
                except Exception as e:  # noqa: BLE001 - recorded metadata is best effort
                    out["triton"] = {"error": f"unreadable Triton metadata: "
                                              f"{type(e).__name__}: {e}"}
                if code:
                    self._fill_ptx(state, out["code"], out["triton"], max_chars)
            return out

    def _describe_range(self, state: OperatorState) -> dict:
        """A range snapshot before its first plan: what the snapshot says (no harness, no
        session yet: ref is measured once a plan is judged)."""
        m = Snapshot.open(state.snapshot).manifest
        policy = Policy.byte_exact()
        return {"operator": state.name, "backend": m.backend, "arch": m.arch,
                "complete": m.complete, "kernel": m.code.kernel_name,
                "regions": [{"name": r.name, "address": hex(r.address), "size": r.size,
                             "dtype": r.dtype, "role": r.role} for r in m.regions],
                "policy": policy.to_json(), "policy_text": [policy.mode],
                "ref_time_us": None,
                "ref_time_note": "a range is judged against a launch plan: ref is measured "
                                 "when the first plan is submitted (form 'plan')",
                "range": range_facts(m), "evaluations": str(state.out), "forms": FORMS}

    def _fill_ptx(self, state: OperatorState, code: dict, triton: dict,
                  max_chars: int) -> None:
        """ref's PTX when capture kept none and Triton's cache has none: the captured
        Triton source compiled again (once per operator)."""
        if code.get("ptx") or "error" in triton:
            return
        if state.recompiled_ptx is None:
            state.recompiled_ptx = recompiled_ptx(state.harness, state.work / "ref-ptx")
        text, how = state.recompiled_ptx
        if text is not None:
            code["ptx"] = text if len(text) <= max_chars else \
                text[:max_chars] + f"\n... [{len(text) - max_chars} more characters]"
            code["ptx_from"] = how
        else:
            code["ptx_from"] = f"{code.get('ptx_from')}; {how}"

    def _measure_ref(self, state: OperatorState) -> None:
        """ref against itself through the session: ref's time (and the setup paid once)."""
        h = state.harness
        session, mode = self.session(state, full=False)
        if h.snapshot.manifest.is_range:   # a range is paired with a plan: its own
            base = replace(plan_candidate(h.root / h.spec.plan),
                           label="ref (baseline measurement)")
        else:
            base = Candidate(h.binary(h.ref), h.ref.kernel, label="ref (baseline measurement)")
        judged = session.judge(replace(base, strategy="mcp:baseline",
                                       params={"judged": mode}))
        state.taken, result = judged.attempt, judged.result
        if result.speed is not None:
            state.ref_s = result.speed.debug_only.get("ref_median_us", 0) * 1e-6 or None
        if result.sol is not None:  # ref's time against the floor (opt here is ref again)
            state.last_sol = result.sol.replace(opt_s=None, opt_fraction=None).to_json()

    # ------------------------------------------------------------------ submit

    def submit(self, operator: str, form: str, *, code: str | None = None,
               path: str | None = None, kernel: str | None = None,
               ptxas_options: list[str] | None = None, config: dict | None = None,
               launch_override: dict | None = None, label: str | None = None,
               full: bool = False, objects: dict | None = None) -> dict:
        """Build a candidate of ``form`` (``FORMS``), refuse an ABI mismatch before anything
        launches, and judge it in the operator's quick session (``full``: the full one): the
        verdict as ``kpair evaluate --jsonl`` prints it, which measurement gave it, build
        seconds and judge seconds."""
        if form not in FORMS:
            raise UsageError(f"form must be one of {', '.join(FORMS)}, not {form!r}")
        if (code is None) == (path is None) and form != "binary":
            raise UsageError("give the candidate as 'code' (its text) or 'path', one of them")
        if objects is not None and form != "plan":
            raise UsageError("'objects' go with form 'plan'")
        with self.lock:
            state = self.state(operator)
            if form == "plan":
                return self._submit_plan(state, code=code, path=path, objects=objects,
                                         ptxas_options=ptxas_options, label=label, full=full)
            m = state.harness.snapshot.manifest if state.harness is not None else \
                Snapshot.open(state.snapshot).manifest
            if m.is_range:
                raise UsageError(f"operator {operator} is a range of {len(m.operations)} "
                                 "operations: submit a launch plan (form 'plan')")
            started = time.monotonic()
            built = build_candidate(state.harness, form, code=code, path=path,
                                    kernel=kernel, ptxas_options=ptxas_options or [],
                                    config=config)
            override = launch_override if launch_override is not None \
                else built.launch_override
            build_s = time.monotonic() - started
            session, mode = self.session(state, full=full)
            judged = session.judge(replace(
                built, launch_override=override or None, label=label or f"{form} candidate",
                strategy=f"mcp:{form}", params={**built.params, "judged": mode}))
            n, result = judged.attempt, judged.result
            state.taken = n
            keep = state.work / "candidates" / f"{n:04d}{suffix(built)}"
            keep.parent.mkdir(parents=True, exist_ok=True)
            keep.write_bytes(built.image)
            state.candidates[n] = replace(judged, image=b"", binary=keep)
            line = result_line(n, result, session.result_file(n))
            return {**line, "attempt": n, "judged": mode,
                    "summary": line["summary"] + (QUICK_NOTE if mode == "quick" else ""),
                    "exit_code": result.exit_code,
                    "sol": result.sol.summary() if result.sol else None,
                    "candidate": str(keep), "build": built.build, "build_s": round(build_s, 3),
                    "judge_s": result.wall_s}

    def _submit_plan(self, state: OperatorState, *, code: str | None, path: str | None,
                     objects: dict | None, ptxas_options: list[str] | None,
                     label: str | None, full: bool) -> dict:
        """A launch plan built (``kpair.mcp.plans.build_plan``) into
        ``candidates/NNNN.plan/``, checked against the operator's range before anything
        runs, then judged like any candidate."""
        started = time.monotonic()
        pending = state.work / "candidates" / f"pending-{os.getpid()}-{time.time_ns()}"
        target = state.harness
        if target is None:   # a range snapshot's first plan: checked on the snapshot
            snap = Snapshot.open(state.snapshot)
            target = SimpleNamespace(backend=snap.manifest.backend, snapshot=snap)
        try:
            plan_file, notes = build_plan(target, pending, text=code, path=path,
                                          objects=objects, ptxas_options=ptxas_options)
            if state.harness is None:   # ... and pairs the range: base/
                state.harness = create_harness(state.snapshot, state.work / "base",
                                               plan=plan_file)
        except BaseException:
            discard(pending)
            raise
        build_s = time.monotonic() - started
        session, mode = self.session(state, full=full)
        try:
            cand = plan_candidate(plan_file, label=label or "plan candidate")
            judged = session.judge(replace(cand, strategy="mcp:plan",
                                           params={"judged": mode, "build": notes}))
        except BaseException:
            discard(pending)
            raise
        n, result = judged.attempt, judged.result
        state.taken = n
        keep = state.work / "candidates" / f"{n:04d}.plan"
        if keep.exists():
            discard(keep)
        pending.rename(keep)
        state.candidates[n] = replace(judged, image=b"", binary=keep / plan_file.name)
        line = result_line(n, result, session.result_file(n))
        return {**line, "attempt": n, "judged": mode,
                "summary": line["summary"] + (QUICK_NOTE if mode == "quick" else ""),
                "exit_code": result.exit_code,
                "sol": result.sol.summary() if result.sol else None,
                "candidate": str(keep / plan_file.name), "build": "; ".join(notes) or None,
                "build_s": round(build_s, 3), "judge_s": result.wall_s}

    # ------------------------------------------------------------------ publish

    def publish(self, operator: str, attempt: int, release: str, *, level: int | None = None,
                name: str | None = None, replace: bool = False,
                allow_slower: bool = False) -> dict:
        """``release add`` of a passing candidate: a harness of ref and that candidate, run
        again in full, published only if it passes and is faster."""

        with self.lock:
            state = self.state(operator)
            cand = state.candidates.get(attempt)
            if cand is None:
                raise UsageError(f"operator {operator} has no attempt {attempt} in this "
                                 f"session (attempts: {sorted(state.candidates) or 'none'})")
            if cand.result.status != "pass":
                raise UsageError(f"attempt {attempt} did not pass ({cand.result.status}); "
                                 "only a passing candidate can be published")
            out = state.work / "winners" / f"{attempt:04d}"
            pair_harness(state.harness, cand, out)
            level = level or state.level
            outcome = add_operator(release, out, level=level, name=name or operator,
                                   replace=replace, options=self.publish_options,
                                   allow_slower=allow_slower)
            return {"published": outcome.added, "key": f"level{level}/{name or operator}",
                    "release": str(Path(release).resolve()), "status": outcome.result.status,
                    "summary": outcome.result.summary(), "reason": outcome.row.reason,
                    "harness": str(out), "exit_code": outcome.exit_code}

    # ------------------------------------------------------------------ programs

    @contextlib.contextmanager
    def _log(self, log_name: str):
        """A log file for a program run (stdout is the MCP channel on stdio): yields the open
        file and a list that ends up holding the log's last lines."""
        logs = self.root / "mcp" / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / f"{time.strftime('%Y%m%d-%H%M%S')}-{log_name}.log"
        tail: list[str] = []
        with open(log, "w") as f:
            yield f, tail
        tail.append("\n".join(log.read_text(errors="replace").splitlines()[-40:]))

    def capture(self, command: list[str], *, out: str, top: int | None = 5,
                kernel: str | None = None, timeout_s: float | None = 900) -> dict:
        """``kpair capture`` of ``command`` into ``out`` (run from the work directory, its
        output logged); stopped after ``timeout_s`` (what it captured by then is kept:
        capture.json is rewritten after every dispatch)."""
        if not command:
            raise UsageError("give the program to run, e.g. ['python', 'prog.py']")
        if timeout_s is not None and not 0 < timeout_s < float("inf"):
            raise UsageError(f"timeout_s must be a positive number of seconds, not "
                             f"{timeout_s!r}")
        dest = self._inside(out)
        with self._log("capture") as (f, tail):
            def log(line: str) -> None:
                print(line, file=f, flush=True)

            outcome = capture_program(command, dest, top=top or None, kernel=kernel,
                                      stdout=f, stderr=f, cwd=self.root, timeout_s=timeout_s,
                                      log=log)
            if outcome.timed_out:
                log(f"[kpair mcp: stopped after {timeout_s:g} s]")
        status = -9 if outcome.timed_out else outcome.exit_status
        summary = dest / "capture.json"
        if not summary.is_file():
            raise KpairError(f"kpair capture wrote no capture.json (exit status {status}):\n"
                             f"{tail[0]}")
        ops = {op.path: n for n, op in self.operators().items()}
        captured = [{"snapshot": d.get("snapshot"), "kernel": d.get("kernel"),
                     "operator": ops.get((dest / d["snapshot"]).resolve())}
                    for d in captured_dispatches(dest)]
        return {"exit_status": status, "captured": captured, "log_tail": tail[0],
                "directory": str(dest)}

    def profile(self, command: list[str], *, out: str, top: int = 20) -> dict:
        if not command:
            raise UsageError("give the program to run, e.g. ['python', 'prog.py']")
        dest = self._inside(out)
        with self._log("profile") as (f, tail):
            status, profile = run_profile(command, dest, stdout=f, stderr=f, cwd=self.root)
            if profile is not None:
                print(format_table(profile, top), file=f)
                print(f"kpair profile: {len(profile.kernels)} kernels written to {dest}",
                      file=f, flush=True)
        if profile is None or not dest.is_file():
            raise KpairError(f"kpair profile wrote no profile (exit status {status}):\n"
                             f"{tail[0]}")
        data = json.loads(dest.read_text())
        kernels = sorted(data.get("kernels", []), key=lambda k: -k.get("total_ns", 0))[:top]
        return {"exit_status": status, "profile": str(dest), "kernels": kernels,
                "log_tail": tail[0]}

    def _inside(self, rel: str) -> Path:
        path = (self.root / rel).resolve()
        if self.root not in path.parents:
            raise UsageError(f"{rel!r} leaves the work directory")
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise UsageError(f"{rel} exists and is not empty; choose a new name")
        return path


__all__ = ["FORMS", "OperatorState", "Workspace"]
