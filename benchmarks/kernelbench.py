"""KernelBench through kpair: capture every problem, replay every dispatch, optimize the
compiled ones into one release.

    python benchmarks/kernelbench.py --kernelbench PATH --level 1,2 -o OUT
        [--problems N] [--start S --count C] [--scale K] [--scale-names batch_size,...]
        [--modes eager,compiled] [--runs 3] [--max-region-bytes SIZE] [--keep]
        [--optimize [--optimize-arg=--triton-limit=12 ...]]

``PATH`` is a checkout of the public KernelBench repository (ScalingIntelligence/KernelBench;
its ``KernelBench/level<N>/<n>_<Name>.py`` files each define ``Model``, ``get_inputs()`` and
``get_init_inputs()``). Nothing of it is copied into OUT but the patched problem files in the
work directory, which ``--keep`` aside is emptied as it goes; never commit them.

For the problems ``[start, start + count)`` of the chosen levels (in level, then problem number
order; ``--problems N``: the first N of each level), and for each mode (``eager``: the reference
``Model``; ``compiled``: the same under ``torch.compile``), one ``kpair capture --distinct --max
0`` runs this file's runner (``run-problems``) over the whole batch in one process, so torch and
CUDA start once. The runner makes the model's parameters and inputs on the GPU (inside
``torch.device("cuda")``), runs one forward pass under ``no_grad`` and writes, per problem, the
capture session's launch counter before and after (``marks.json``): a captured dispatch belongs
to the problem whose range holds its ``launch_index``, i.e. the first problem of the batch that
launched that kernel. ``--scale K`` patches the problem file's module-level size constants named
by ``--scale-names`` (default ``batch_size,M,N,K``) to ``max(1, value // K)`` before it
runs, so large problems fit on the GPU machine's disk; the table records each change.

Then every captured snapshot is replayed by ``kpair replay SNAP --runs R --json`` (its own
process) into the fidelity table ``OUT/fidelity.json``: per dispatch the problem, mode, kernel,
bytes (regions, pre + post state, stored), verdict (``byte-exact``, ``nondeterministic``,
``mismatch``, ``refused incomplete``, ``error``; ``not captured`` with capture's reason), capture
and replay seconds; and a summary (byte-exact share of the deterministic dispatches, every
nondeterministic one, wall time and bytes). The eager capture is deleted after its replays; the
compiled one after ``--optimize`` has used it, unless ``--keep``.

``--optimize`` then runs ``kpair optimize --snapshot SNAP --name <problem> --level <level>
--strategy triton -o OUT/release`` on one compiled dispatch per problem (the byte-exact Triton
dispatch with the most region bytes: a proxy for the most expensive, not a profile), so the
release is laid out as ``level1/<problem>/harness``, ``level2/...``; ``OUT/scaling.json`` says by
how much each problem was scaled. The table is rewritten after every step, and a run resumes:
problems already in it (per mode) are skipped, so a level can be done in batches that each fit
one 10-minute call of the GPU machine.

Status: the discovery, the scaling patcher and the table builder are tested on CPU
(tests/test_kernelbench_cpu.py, on a made-up problem file). The runner, the capture/replay loop
and ``--optimize`` have NOT been run on a GPU yet: expect to fix details on the first H200 run.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

SCHEMA = "kpair.kernelbench-fidelity"
#: batch_size is in 183 of the 200 Level 1 + 2 files; M, N, K size the matrix problems that have
#: no batch (Level 1 nos. 1-18: up to 8 GiB an input), and appear in no other problem there.
DEFAULT_SCALE_NAMES = ("batch_size", "M", "N", "K")
MODES = ("eager", "compiled")
VERDICTS = ("byte-exact", "nondeterministic", "mismatch", "refused incomplete", "error",
            "not captured")
RUNNER = "run-problems"


# --------------------------------------------------------------------------- problems

@dataclasses.dataclass(frozen=True)
class Problem:
    level: int
    number: int
    name: str      # the file's stem: "37_FrobeniusNorm_"
    path: Path

    @property
    def key(self) -> str:
        return f"level{self.level}/{self.name}"


def levels_dir(root: Path) -> Path:
    """The folder holding ``level1/``...: ``root`` itself or ``root/KernelBench``."""
    for d in (root / "KernelBench", root):
        if (d / "level1").is_dir() or any(d.glob("level[0-9]*")):
            return d
    raise SystemExit(f"kernelbench.py: {root} holds no KernelBench/level<N>/ folders: give a "
                     "checkout of github.com/ScalingIntelligence/KernelBench")


def discover(root: Path, levels: list[int], per_level: int | None = None) -> list[Problem]:
    """The problems of ``levels`` (files ``<n>_<Name>.py``), by level then number."""
    base = levels_dir(root)
    found = []
    for level in levels:
        folder = base / f"level{level}"
        if not folder.is_dir():
            raise SystemExit(f"kernelbench.py: no {folder}")
        problems = []
        for path in folder.glob("*.py"):
            m = re.match(r"^(\d+)_", path.name)
            if m:
                problems.append(Problem(level, int(m.group(1)), path.stem, path))
        problems.sort(key=lambda p: p.number)
        found += problems[:per_level] if per_level else problems
    return found


# --------------------------------------------------------------------------- scaling

_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
        ast.Mult: lambda a, b: a * b, ast.FloorDiv: lambda a, b: a // b,
        ast.Pow: lambda a, b: a ** b}


def _int_value(node: ast.AST, env: dict[str, int]) -> int | None:
    """The int an expression of int literals, known constants and + - * // ** stands for."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name):
        return env.get(node.id)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        a, b = _int_value(node.left, env), _int_value(node.right, env)
        if a is None or b is None or (isinstance(node.op, ast.Pow) and not 0 <= b <= 64):
            return None
        try:
            return _OPS[type(node.op)](a, b)
        except ZeroDivisionError:
            return None
    return None


def _names_in(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def scale_source(source: str, k: int, names=DEFAULT_SCALE_NAMES
                 ) -> tuple[str, dict[str, list[int]]]:
    """``source`` with each module-level int constant named in ``names`` set to
    ``max(1, value // k)``; and {name: [old, new]} for each one changed.

    Only plain assignments at module level whose value is an int expression are touched
    (``batch_size = 16``, ``N = 2048 * 2``, ``height = width = 128``); a value computed from an
    already scaled name is left alone (it follows that name when the module runs), so nothing
    is scaled twice. The value's text is replaced in place and the old one kept in a comment.
    """
    if k < 1:
        raise ValueError(f"scale must be 1 or more, got {k}")
    tree = ast.parse(source)
    env: dict[str, int] = {}
    scaled: dict[str, list[int]] = {}
    edits: list[tuple[int, int, int, str]] = []   # (line, start col, end col, text)
    for stmt in tree.body:
        if not (isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name)
                                                     for t in stmt.targets)):
            continue
        targets = [t.id for t in stmt.targets]
        value = _int_value(stmt.value, env)
        if value is None:
            for t in targets:
                env.pop(t, None)
            continue
        wanted = k > 1 and any(t in names for t in targets)
        derived = _names_in(stmt.value) & set(scaled)
        if wanted and not derived and stmt.value.lineno == stmt.value.end_lineno:
            new = max(1, value // k)
            if new != value:
                edits.append((stmt.value.lineno, stmt.value.col_offset,
                              stmt.value.end_col_offset, str(new)))
                for t in targets:
                    scaled[t] = [value, new]
                value = new
        for t in targets:
            env[t] = value
    lines = source.splitlines(keepends=True)
    for line, start, end, text in sorted(edits, reverse=True):
        raw = lines[line - 1].encode()  # ast columns count UTF-8 bytes
        old = raw[start:end].decode()
        rest = raw[end:].decode()
        newline = "\n" if rest.endswith("\n") else ""
        lines[line - 1] = (raw[:start].decode() + text + rest.rstrip("\n")
                           + f"  # kernelbench.py --scale {k}: was {old}" + newline)
    return "".join(lines), scaled


# --------------------------------------------------------------------------- the runner

def _launches() -> int | None:
    """The capture session's launch counter (this process runs under ``kpair capture``)."""
    capture = sys.modules.get("kpair.capture")
    tracer = getattr(capture, "_tracer", None)
    session = getattr(tracer, "session", None)
    return None if session is None else session.launches


def run_problems(plan_path: Path) -> int:
    """The child program: run each problem of the plan once, write marks.json as it goes."""
    import gc

    import torch

    plan = json.loads(plan_path.read_text())
    marks_path = Path(plan["marks"])
    marks = []
    for p in plan["problems"]:
        first, t0 = _launches(), time.monotonic()
        mark = {"key": p["key"], "ok": False}
        model = inputs = out = None
        try:
            import importlib.util

            spec = importlib.util.spec_from_file_location(f"kb_{p['module']}", p["file"])
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            torch.manual_seed(0)
            with torch.device("cuda"):
                model = module.Model(*module.get_init_inputs()).eval()
                inputs = [x.cuda() if isinstance(x, torch.Tensor) else x
                          for x in module.get_inputs()]
            fn = torch.compile(model) if plan["mode"] == "compiled" else model
            with torch.no_grad():
                out = fn(*inputs)
            torch.cuda.synchronize()
            mark["ok"] = True
        except Exception as e:  # noqa: BLE001 - one problem failing must not end the batch
            mark["error"] = f"{type(e).__name__}: {e}"[:2000]
        finally:
            del model, inputs, out
            if plan["mode"] == "compiled":
                torch._dynamo.reset()
            gc.collect()
            torch.cuda.empty_cache()
        last = _launches()
        mark.update(first_launch=None if first is None else first + 1, last_launch=last,
                    run_s=round(time.monotonic() - t0, 3))
        marks.append(mark)
        tmp = marks_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(marks, indent=1))
        os.replace(tmp, marks_path)
    return 0


# --------------------------------------------------------------------------- the table

def owner(launch_index: int, marks: list[dict]) -> str | None:
    """The key of the problem whose launch range holds ``launch_index``."""
    for m in marks:
        if m.get("first_launch") is not None and m.get("last_launch") is not None \
                and m["first_launch"] <= launch_index <= m["last_launch"]:
            return m["key"]
    return None


def verdict_of(replay: dict | None) -> tuple[str, str | None]:
    """(verdict, detail) of one ``kpair replay`` run: ``replay`` has ``exit_code``,
    ``stdout``, ``stderr``; None when the dispatch was never replayed."""
    if replay is None:
        return "not captured", None
    code, out, err = replay["exit_code"], replay.get("stdout", ""), replay.get("stderr", "")
    if code == 3 and "incomplete snapshot" in err:
        return "refused incomplete", err.strip().splitlines()[-1][:2000] if err.strip() else None
    try:
        rep = json.loads(out)
    except (TypeError, ValueError):
        rep = None
    if isinstance(rep, dict) and rep.get("status") in ("byte-exact", "nondeterministic",
                                                       "mismatch"):
        detail = None
        if rep.get("differing_regions") or rep.get("unstable_regions"):
            detail = json.dumps({"differing": rep.get("differing_regions", []),
                                 "unstable": rep.get("unstable_regions", [])})
        return rep["status"], detail
    message = (rep or {}).get("error") if isinstance(rep, dict) else None
    tail = (err.strip().splitlines() or [""])[-1]
    return "error", (message or tail or f"exit status {code}")[:2000]


def fidelity_rows(mode: str, problems: dict[str, Problem], marks: list[dict],
                  summary: dict, replays: dict[str, dict]) -> list[dict]:
    """One row per selected dispatch of one capture (its ``capture.json`` as ``summary``):
    the problem it belongs to, bytes, verdict and seconds. ``replays``: snapshot name ->
    the ``kpair replay`` run (``exit_code``, ``stdout``, ``stderr``, ``s``)."""
    rows = []
    for d in summary.get("dispatches", []):
        key = owner(d["launch_index"], marks)
        problem = problems.get(key) if key else None
        replay = replays.get(d.get("snapshot", "")) if d["status"] == "captured" else None
        verdict, detail = verdict_of(replay)
        if d["status"] != "captured":
            detail = d.get("reason")
        rows.append({
            "level": problem.level if problem else None,
            "problem": problem.name if problem else None, "mode": mode,
            "kernel": d["kernel"], "demangled": d.get("demangled"),
            "snapshot": d.get("snapshot"), "complete": d.get("complete"),
            "region_bytes": d.get("region_bytes", 0), "state_bytes": d.get("state_bytes", 0),
            "stored_bytes": d.get("stored_bytes", 0),
            "omitted_bytes": sum(o["size"] for o in d.get("omitted_regions") or []),
            "verdict": verdict, "detail": detail,
            "capture_s": d.get("capture_s"), "replay_s": (replay or {}).get("s")})
    return rows


def summarize(rows: list[dict], problems: list[dict]) -> dict:
    """Counts by verdict, the byte-exact share of the deterministic dispatches, the
    nondeterministic ones, wall time and bytes."""
    by = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
    deterministic = by["byte-exact"] + by["mismatch"]
    return {
        "dispatches": len(rows), "verdicts": by,
        "byte_exact_of_deterministic": round(by["byte-exact"] / deterministic, 4)
        if deterministic else None,
        "nondeterministic": [f"{r['mode']} {r['problem']}: {r['kernel']}" for r in rows
                             if r["verdict"] == "nondeterministic"],
        "incomplete": sum(r["complete"] is False for r in rows),
        "problems": len(problems),
        "problems_failed": sorted({p["key"] for p in problems if not p.get("ok")}),
        "region_bytes": sum(r["region_bytes"] for r in rows),
        "state_bytes": sum(r["state_bytes"] for r in rows),
        "stored_bytes": sum(r["stored_bytes"] for r in rows),
        "capture_s": round(sum(r["capture_s"] or 0 for r in rows), 3),
        "replay_s": round(sum(r["replay_s"] or 0 for r in rows), 3)}


class Table:
    """``OUT/fidelity.json``: read at start (to resume), rewritten after every step."""

    def __init__(self, path: Path, header: dict):
        self.path = path
        self.data = {"schema": SCHEMA, "schema_version": 1, **header, "problems": [],
                     "rows": [], "optimize": [], "batches": []}
        if path.exists():
            old = json.loads(path.read_text())
            if old.get("schema") != SCHEMA:
                raise SystemExit(f"kernelbench.py: {path} is not a fidelity table")
            for key in ("scale", "scale_names"):
                if old.get(key) != header.get(key):
                    raise SystemExit(f"kernelbench.py: {path} was made with {key} "
                                     f"{old.get(key)!r}, not {header.get(key)!r}: use another -o")
            self.data.update({k: old[k] for k in ("problems", "rows", "optimize", "batches")
                              if k in old})

    def done(self, key: str, mode: str) -> bool:
        return any(p["key"] == key and p["mode"] == mode for p in self.data["problems"])

    def add(self, problems: list[dict], rows: list[dict]) -> None:
        self.data["problems"] += problems
        self.data["rows"] += rows
        self.save()

    def save(self) -> None:
        self.data["summary"] = summarize(self.data["rows"], self.data["problems"])
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(self.data, indent=1) + "\n")
        os.replace(tmp, self.path)


# --------------------------------------------------------------------------- the driver

def kpair(*args: str, timeout: float) -> dict:
    """Run ``python -m kpair ARGS``; its exit code, output and seconds."""
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-m", "kpair", *args], capture_output=True,
                           text=True, timeout=timeout)
        code, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        code, out, err = 124, e.stdout or "", f"timed out after {timeout:g} s"
        out = out.decode() if isinstance(out, bytes) else out
    return {"exit_code": code, "stdout": out, "stderr": err,
            "s": round(time.monotonic() - t0, 3)}


def capture_batch(batch: list[Problem], mode: str, work: Path, args) -> tuple[list, dict, dict]:
    """Patch, capture and replay one mode of a batch: (problem records, summary, replays)."""
    if work.exists():
        shutil.rmtree(work)   # a run cut short left it: capture again
    sources = work / "problems"
    sources.mkdir(parents=True)
    plan = {"mode": mode, "marks": str(work / "marks.json"), "problems": []}
    records = {}
    for p in batch:
        text, scaled = scale_source(p.path.read_text(), args.scale, args.scale_names)
        module = re.sub(r"\W", "_", f"l{p.level}_{p.name}")
        file = sources / f"{module}.py"
        file.write_text(text)
        plan["problems"].append({"key": p.key, "file": str(file), "module": module})
        records[p.key] = {"key": p.key, "level": p.level, "problem": p.name, "mode": mode,
                          "scaled": scaled}
    (work / "plan.json").write_text(json.dumps(plan, indent=1))
    cap = work / "capture"
    t0 = time.monotonic()
    run = kpair("capture", "-o", str(cap), "--distinct", "--max", "0",
                "--max-region-bytes", str(args.max_region_bytes), "--",
                sys.executable, str(Path(__file__).resolve()), RUNNER, str(work / "plan.json"),
                timeout=args.capture_timeout)
    capture_wall = round(time.monotonic() - t0, 3)
    marks = json.loads((work / "marks.json").read_text()) if (work / "marks.json").exists() \
        else []
    for m in marks:
        records[m["key"]].update({k: m[k] for k in ("ok", "run_s") if k in m})
        if "error" in m:
            records[m["key"]]["error"] = m["error"]
    for r in records.values():
        r.setdefault("ok", False)
        if not r["ok"] and "error" not in r:
            said = (run["stderr"].strip().splitlines() or [""])[-1]
            r["error"] = ("the batch's program ended before this problem finished (kpair "
                          f"capture exit {run['exit_code']}: {said})")
    summary = json.loads((cap / "capture.json").read_text()) \
        if (cap / "capture.json").exists() else {"dispatches": []}
    replays = {}
    for d in summary["dispatches"]:
        if d["status"] == "captured":
            replays[d["snapshot"]] = kpair("replay", str(cap / d["snapshot"]), "--runs",
                                           str(args.runs), "--json",
                                           timeout=args.replay_timeout)
    summary["marks"] = marks
    summary["capture_wall_s"] = capture_wall
    return list(records.values()), summary, replays


def choose_operator(rows: list[dict], problem: Problem) -> dict | None:
    """The compiled dispatch of ``problem`` to optimize: byte-exact, Triton, most bytes."""
    mine = [r for r in rows if r["mode"] == "compiled" and r["problem"] == problem.name
            and r["level"] == problem.level and r["verdict"] == "byte-exact"
            and r["kernel"].startswith("triton_")]
    return max(mine, key=lambda r: r["region_bytes"], default=None)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [RUNNER]:
        return run_problems(Path(argv[1]))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernelbench", type=Path, required=True, help="KernelBench checkout")
    p.add_argument("--level", default="1,2", help="levels, comma-separated (default 1,2)")
    p.add_argument("--problems", type=int, metavar="N", help="the first N problems per level")
    p.add_argument("--start", type=int, default=0, help="first problem of this batch (0-based)")
    p.add_argument("--count", type=int, help="problems in this batch (default: all)")
    p.add_argument("--scale", type=int, default=1, metavar="K",
                   help="divide the size constants by K (default 1: KernelBench's sizes)")
    p.add_argument("--scale-names", default=",".join(DEFAULT_SCALE_NAMES),
                   help="module-level constants --scale divides (default "
                   f"{','.join(DEFAULT_SCALE_NAMES)})")
    p.add_argument("--modes", default=",".join(MODES), help="eager,compiled (default both)")
    p.add_argument("--runs", type=int, default=3, help="replays per dispatch (default 3)")
    p.add_argument("--max-region-bytes", default="64GiB",
                   help="kpair capture's per-region cap (default 64GiB: keep everything)")
    p.add_argument("--capture-timeout", type=float, default=540.0, metavar="S")
    p.add_argument("--replay-timeout", type=float, default=120.0, metavar="S")
    p.add_argument("--keep", action="store_true", help="keep the captures (default: deleted)")
    p.add_argument("--optimize", action="store_true",
                   help="kpair optimize one compiled dispatch per problem into OUT/release")
    p.add_argument("--optimize-arg", action="append", default=[], metavar="ARG",
                   help="passed to kpair optimize (repeatable), e.g. --optimize-arg=--triton-"
                   "limit=12")
    p.add_argument("--optimize-timeout", type=float, default=300.0, metavar="S")
    p.add_argument("-o", "--out", type=Path, required=True, help="output directory")
    args = p.parse_args(argv)
    args.scale_names = tuple(n for n in args.scale_names.split(",") if n)
    modes = [m for m in args.modes.split(",") if m]
    if any(m not in MODES for m in modes) or args.scale < 1:
        p.error("--modes takes eager and/or compiled; --scale is 1 or more")

    problems = discover(args.kernelbench, [int(x) for x in args.level.split(",")],
                        args.problems)
    batch = problems[args.start:None if args.count is None else args.start + args.count]
    by_key = {pr.key: pr for pr in problems}
    args.out.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "-C", str(args.kernelbench), "rev-parse", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or None
    table = Table(args.out / "fidelity.json", {
        "kernelbench": {"path": str(args.kernelbench), "commit": commit},
        "scale": args.scale, "scale_names": list(args.scale_names)})
    t0 = time.monotonic()
    for mode in modes:
        todo = [pr for pr in batch if not table.done(pr.key, mode)]
        if not todo:
            continue
        print(f"kernelbench.py: {mode}: capturing {len(todo)} problems", file=sys.stderr)
        work = args.out / "work" / mode
        records, summary, replays = capture_batch(todo, mode, work, args)
        rows = fidelity_rows(mode, by_key, summary["marks"], summary, replays)
        for r in records:
            r["capture_wall_s_batch"] = summary["capture_wall_s"]
        if args.optimize and mode == "compiled":
            for pr in todo:
                row = choose_operator(rows, pr)
                if row is None:
                    table.data["optimize"].append({"key": pr.key, "status": "no operator",
                                                   "reason": "no byte-exact Triton dispatch"})
                    continue
                run = kpair("optimize", "-o", str(args.out / "release"),
                            "--work", str(args.out / "release.work"),
                            "--snapshot", str(work / "capture" / row["snapshot"]),
                            "--name", pr.name, "--level", str(pr.level),
                            "--strategy", "triton", *args.optimize_arg,
                            timeout=args.optimize_timeout)
                table.data["optimize"].append({
                    "key": pr.key, "kernel": row["kernel"], "exit_code": run["exit_code"],
                    "s": run["s"], "said": (run["stdout"].strip().splitlines() or [""])[-1]})
        table.add(records, rows)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    table.data["batches"].append({"start": args.start, "count": len(batch),
                                  "modes": modes, "wall_s": round(time.monotonic() - t0, 3)})
    table.save()
    scaling = {pr["key"]: pr["scaled"] for pr in table.data["problems"] if pr["scaled"]}
    tmp = args.out / ".scaling.json.tmp"
    tmp.write_text(json.dumps({"scale": args.scale, "scale_names": list(args.scale_names),
                               "scaled": scaling}, indent=1) + "\n")
    os.replace(tmp, args.out / "scaling.json")
    s = table.data["summary"]
    print(json.dumps({k: s[k] for k in ("dispatches", "verdicts",
                                        "byte_exact_of_deterministic", "problems")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
