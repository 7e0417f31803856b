"""KernelBench through kpair: capture every problem, replay every dispatch, optimize the
compiled ones into one release, on one GPU machine in calls of a few minutes.

    python benchmarks/kernelbench.py sizes --kernelbench PATH -o SIZES.json [--budget-mib 32]
    python benchmarks/kernelbench.py plan --sizes SIZES.json [--deadline 480] [--optimize]
        [--capture-jobs 4] [--rates JSON]
    python benchmarks/kernelbench.py bandwidth [--mib 1024]
    python benchmarks/kernelbench.py run --kernelbench PATH -o OUT [--sizes SIZES.json]
        [--deadline S] [--work DIR] [--modes eager,compiled] [--level 1,2] [--start S]
        [--count C] [--scale K] [--runs 3] [--jobs 4] [--batch-bytes 40GiB]
        [--capture-jobs 4] [--gpu-mem-gib 80] [--disk-budget SIZE] [--bandwidth-mib 1024]
        [--optimize [--release DIR] [--optimize-arg=--triton-limit=12 ...]
                    [--inductor-baseline]]

``PATH`` is a copy of the public KernelBench repository (ScalingIntelligence/KernelBench; its
``KernelBench/level<N>/<n>_<Name>.py`` files each define ``Model``, ``get_inputs()`` and
``get_init_inputs()``), a checkout or a ``git archive`` extract with a ``COMMIT`` file. Never
commit it; nothing of it reaches OUT.

``sizes`` (CPU, no GPU): every problem is loaded and run twice: once on torch's ``meta``
device at KernelBench's own sizes (shapes only, nothing allocated): bytes of parameters,
inputs, outputs, and per aten op the bytes it reads and writes (the regions its dispatch
would have); then one real forward pass on the CPU at the smallest power-of-two ``--scale``
that fits ``--budget-mib``. ``plan`` turns that document into the calls the run needs
(``estimates``, ``Rates``, ``simulate``).

``run``: for each mode (``eager``: the reference ``Model``; ``compiled``: the same under
``torch.compile``), problems in order (level, then number) go in batches: one ``kpair capture
--distinct --max 0`` runs this file's runner (``run-problems``) over a whole batch in one
process, so torch and CUDA start once per batch. The runner makes the model's parameters and
inputs on the GPU (inside ``torch.device("cuda")``), runs one forward pass under ``no_grad``
and writes, per problem, the capture session's launch counter before and after
(``marks.json``): a captured dispatch belongs to the problem whose range holds its
``launch_index``. A compiled model runs once uncaptured first (compile, autotune), so the
captured launch of each Triton kernel is of the config Inductor chose. ``--distinct`` counts
per run in eager mode (the first launch of each kernel of the whole run: earlier batches'
kernels are skipped) and per problem in compiled mode (Inductor's kernel names repeat across
problems for different code). Every captured snapshot
is then replayed by ``kpair replay SNAP --runs R --json`` (its own process, ``--jobs`` at a
time) and judged; ``--optimize`` runs ``kpair optimize --snapshot SNAP --name <problem>
--level <level> --strategy triton`` on each compiled problem's byte-exact Triton dispatch with
the most region bytes (a proxy for the most expensive, not a profile), so the release is laid
out as ``level1/<problem>/harness``. Each problem's record, its dispatch rows inside, is
appended to ``OUT/results.jsonl`` as soon as it is decided; the batch's snapshots are deleted
after its last verdict (unless ``--keep``); ``OUT/fidelity.json`` (the table: per dispatch the
problem, mode, kernel, bytes, verdict, seconds; a summary overall and per mode) and
``OUT/scaling.json`` are rebuilt from the results after every batch.

Batches run side by side: up to ``--capture-jobs`` batches (each its own capture process,
its replays ``--jobs`` at a time) while the GPU memory they are expected to hold (a CUDA
context each and its largest problem's peak, by the sizes document) fits 80% of
``--gpu-mem-gib`` and their expected stored bytes ``--disk-budget``; each batch works in
``WORK/<mode>/b<n>``. A progress line goes to stderr as each batch starts and ends. Snapshots
are regenerable by default (kpair capture stores a region made on the GPU by RNG kernels,
fills and the like as the chain that made it and a digest), so ``Rates`` splits each
dispatch's state bytes into a share regenerated and checked on the GPU and a share carried
through the host. Before its batches a call measures the GPU's copy bandwidth (``bandwidth``:
host to device and back, pinned and pageable, and device to device, in its own process; a
``bandwidth`` line of results.jsonl, ``copy_bandwidth`` in fidelity.json), and the table's
summary names the ``largest`` dispatch (most region bytes) with its capture and replay
seconds beside its region and stored bytes, and the median stored bytes per snapshot.

Calls: a run resumes from ``OUT/results.jsonl``: decided problems are skipped. Batches are
planned to fit the disk (``--batch-bytes``, at most 80% of the free space, by the sizes
document's estimates) and the call (``--deadline``): no batch starts that is expected to end
after it, and capture, replay and optimize timeouts never reach past it; a problem whose
program died or ran out of time is tried ``--retries`` more times, then decided as failed.
``benchmarks/kernelbench_device_run.sh`` is one such call on the H200.

Status: the discovery, the scaling patcher, the sizes probe (run on all 200 problems with
torch 2.13 CPU), the planner, the results file and the driver's bookkeeping are tested on the
CPU (tests/test_kernelbench_cpu.py: a made-up problem file, a fake torch for the runner, a fake
``kpair`` for the driver). The runner under a real capture, replay and optimize on a GPU have
NOT been run yet: expect to fix details on the first H200 call.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

SCHEMA = "kpair.kernelbench-fidelity"
#: batch_size is in 183 of the 200 Level 1 + 2 files; M, N, K size the matrix problems that have
#: no batch (Level 1 nos. 1-18: up to 8 GiB an input), and appear in no other problem there.
#: Seen by ``sizes`` (torch 2.13, CPU): level1/11_4D_tensor_matrix_multiplication has none of
#: these (its sizes are b, i, j, l, k), and level1/100_HingeLoss breaks when scaled (its
#: predictions * targets broadcast only while batch_size equals input_shape[0]); all 200 run
#: on the meta device at their own sizes.
DEFAULT_SCALE_NAMES = ("batch_size", "M", "N", "K")
MODES = ("eager", "compiled")
VERDICTS = ("byte-exact", "nondeterministic", "mismatch", "refused incomplete", "error",
            "not captured")
RUNNER = "run-problems"
#: Batches captured at a time by default: each is a process that imports torch and compiles
#: its problems (about two CPUs), with its replays --jobs at a time beside it.
CAPTURE_JOBS = 4


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


def kernelbench_commit(root: Path) -> str | None:
    """The checkout's commit: a ``COMMIT`` file beside a copy taken out of git (``git
    archive``: no .git; written by whoever extracted it), else ``git rev-parse`` of a checkout
    (only where ``root/.git`` exists: inside another repository git would name that one)."""
    file = root / "COMMIT"
    if file.is_file() and file.read_text().strip():
        return file.read_text().split()[0]
    if not (root / ".git").exists():
        return None
    return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip() or None


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


# --------------------------------------------------------------------------- loading

def module_from_source(source: str, name: str, filename: str):
    """A problem file's module, run from ``source`` (the scaled text, say)."""
    import types

    module = types.ModuleType(name)
    module.__file__ = filename
    sys.modules[name] = module   # as an import would: torch.compile may look a class's module up
    exec(compile(source, filename, "exec"), module.__dict__)
    return module


def instantiate(module, torch, device: str):
    """The problem's model and inputs on ``device``: the problem file's own factory calls
    (``torch.rand(N, N)``) follow torch's default device, set here."""
    torch.manual_seed(0)
    with torch.device(device):
        model = module.Model(*module.get_init_inputs()).eval()
        inputs = [x.to(device) if isinstance(x, torch.Tensor) else x
                  for x in module.get_inputs()]
    return model, inputs


def _tensors(obj, torch):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o, torch)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o, torch)


def storage_bytes(obj, torch) -> int:
    """Bytes of the distinct storages the tensors in ``obj`` (nested lists, dicts) live in:
    what a dispatch's regions hold when each allocation is one region."""
    seen = {}
    for t in _tensors(obj, torch):
        st = t.untyped_storage()
        seen[st._cdata] = st.nbytes()
    return sum(seen.values())


# --------------------------------------------------------------------------- sizes (CPU)

def meta_sizes(module, torch) -> dict:
    """Bytes of one forward pass at the problem's own sizes, on torch's ``meta`` device (shapes
    only: nothing is allocated). Per aten op that is not a view, the distinct storages it reads
    or writes stand for one eager dispatch's regions; the post-state differs from the
    pre-state only in what the op wrote, so a snapshot stores about ``op + written`` bytes
    (``state_bytes``, summed over the ops: an upper bound for a capture that takes every op's
    first launch, since content-addressed blobs dedupe tensors shared between ops)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    ops: list[tuple[str, int, int]] = []

    class OpBytes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not func.is_view:
                ops.append((func.overloadpacket.__name__,
                            storage_bytes([args, kwargs or {}, out], torch),
                            storage_bytes(out, torch)))
            return out

    model, inputs = instantiate(module, torch, "meta")
    with torch.no_grad(), OpBytes():
        out = model(*inputs)
    params = storage_bytes([list(model.parameters()), list(model.buffers())], torch)
    largest = max(ops, key=lambda o: o[1], default=("", 0, 0))
    return {"params_bytes": params, "input_bytes": storage_bytes(inputs, torch),
            "output_bytes": storage_bytes(out, torch),
            "ops": len(ops), "op_bytes": sum(o[1] for o in ops),
            "max_op": largest[0], "max_op_bytes": largest[1],
            "state_bytes": sum(o[1] + o[2] for o in ops),
            "op_list": [list(o) for o in ops]}


def _io(sizes: dict) -> int:
    return sizes["params_bytes"] + sizes["input_bytes"] + sizes["output_bytes"]


def probe(problem: Problem, torch, budget: int, names=DEFAULT_SCALE_NAMES) -> dict:
    """One problem on the CPU: its sizes at KernelBench's own size (meta), then one forward
    pass at the smallest power-of-two scale whose params + inputs + outputs + largest op fit
    ``budget`` bytes."""
    source = problem.path.read_text()
    rec: dict = {"key": problem.key, "level": problem.level, "problem": problem.name}
    name = re.sub(r"\W", "_", f"kb_l{problem.level}_{problem.name}")
    try:
        rec.update(meta_sizes(module_from_source(source, name, str(problem.path)), torch))
        rec["io_bytes"] = _io(rec)
    except Exception as e:  # noqa: BLE001 - a problem torch's meta device cannot run
        rec["meta_error"] = f"{type(e).__name__}: {e}"[:500]
    k, text, scaled, previous = 1, source, {}, None
    while "meta_error" not in rec:
        text, scaled = scale_source(source, k, names)
        try:
            est = meta_sizes(module_from_source(text, name, str(problem.path)), torch)
        except Exception:  # noqa: BLE001 - a size the problem's own code refuses
            break
        peak = _io(est) + est["max_op_bytes"]
        if peak <= budget or peak == previous or k >= 1 << 16:
            rec["cpu_peak_bytes"] = peak
            break
        previous, k = peak, k * 2
    rec.update(cpu_scale=k, cpu_scaled=scaled)
    t0 = time.monotonic()
    try:
        model, inputs = instantiate(module_from_source(text, name, str(problem.path)), torch,
                                    "cpu")
        with torch.no_grad():
            out = model(*inputs)
        rec["cpu_ok"] = True
        rec["cpu_output"] = [list(t.shape) for t in _tensors(out, torch)]
    except Exception as e:  # noqa: BLE001 - one problem failing must not end the probe
        rec["cpu_ok"] = False
        rec["cpu_error"] = f"{type(e).__name__}: {e}"[:500]
    rec["cpu_s"] = round(time.monotonic() - t0, 3)
    return rec


def sizes_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="kernelbench.py sizes", description=(
        "Load every problem on the CPU: sizes at KernelBench's own size (torch's meta device) "
        "and one forward pass at a reduced size; writes one JSON document."))
    p.add_argument("--kernelbench", type=Path, required=True)
    p.add_argument("--level", default="1,2")
    p.add_argument("--budget-mib", type=int, default=32,
                   help="largest params + inputs + outputs + op of the CPU pass (default 32)")
    p.add_argument("-o", "--out", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        import torch
    except ImportError:
        raise SystemExit("kernelbench.py sizes needs torch: pip install torch numpy") from None
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    problems = discover(args.kernelbench, [int(x) for x in args.level.split(",")])
    records = []
    for i, pr in enumerate(problems, 1):
        rec = probe(pr, torch, args.budget_mib << 20)
        records.append(rec)
        print(f"[{i}/{len(problems)}] {pr.key}: io {rec.get('io_bytes', 0) / 2**20:.0f} MiB, "
              f"state {rec.get('state_bytes', 0) / 2**20:.0f} MiB, cpu "
              f"{'ok' if rec['cpu_ok'] else rec['cpu_error']} at /{rec['cpu_scale']} "
              f"({rec['cpu_s']} s)", file=sys.stderr)
    doc = {"schema": "kpair.kernelbench-sizes", "schema_version": 1,
           "kernelbench": {"commit": kernelbench_commit(args.kernelbench)},
           "torch": torch.__version__, "budget_bytes": args.budget_mib << 20,
           "problems": records}
    tmp = args.out.with_name(f".{args.out.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, args.out)
    return 0


# --------------------------------------------------------------------------- the runner

def _session():
    """The capture session this process runs under (``kpair capture``), or None."""
    capture = sys.modules.get("kpair.capture")
    return getattr(getattr(capture, "_tracer", None), "session", None)


def _launches() -> int | None:
    session = _session()
    return None if session is None else session.launches


def distinct_from_here(skip=()) -> None:
    """Make ``--distinct`` count from now on: forget which kernels the capture filter has
    seen, then mark ``skip`` (names already taken by earlier batches) as seen.

    kpair's filter keeps its seen names privately and offers no way to reset them; this reaches
    in (``Filter._seen``), and fails loudly if that ever changes rather than capturing the
    wrong set."""
    session = _session()
    if session is None:
        return
    f = session.filter
    seen, demangled = getattr(f, "_seen", None), getattr(f, "_seen_demangled", None)
    if not isinstance(seen, set) or not isinstance(demangled, set):
        raise RuntimeError("kpair.capture's Filter no longer keeps _seen/_seen_demangled "
                           "sets: kernelbench.py cannot scope --distinct; update "
                           "distinct_from_here")
    seen.clear()
    demangled.clear()
    seen.update(skip)


@contextlib.contextmanager
def capture_paused():
    """Capture nothing inside: the filter's name list (a public field of kpair's Filter) is
    empty meanwhile, so no launch matches and none counts as a kernel's first."""
    session = _session()
    if session is None:
        yield
        return
    f = session.filter
    names, f.names = f.names, ()
    try:
        yield
    finally:
        f.names = names


def each_problem(problems: list[dict], path: Path, start, one, *, torch, dynamo: bool = True,
                 cuda: bool = True, out_of_memory: bool = False) -> list[dict]:
    """A child program's loop over its plan's problems: per problem ``p`` (the ``i``\\ th) its
    record ``start(i, p)``, then ``one(p, record)`` runs it and fills the record in; what it
    holds (model, inputs, outputs) goes with its frame as it returns or raises. An exception
    is the record's ``error`` (and ``out_of_memory``: whether it was CUDA's, where asked);
    one problem failing never ends the batch. After each problem: Dynamo reset
    (``dynamo``), garbage collected, CUDA's cache emptied (``cuda``), and every record so far
    written to ``path`` (replaced whole, never half written). The records."""
    import gc

    records: list[dict] = []
    for i, p in enumerate(problems):
        rec = start(i, p)
        try:
            one(p, rec)
        except Exception as e:  # noqa: BLE001 - one problem failing must not end the batch
            rec["error"] = f"{type(e).__name__}: {e}"[:2000]
            if out_of_memory:
                rec["out_of_memory"] = isinstance(e, torch.cuda.OutOfMemoryError) \
                    or "out of memory" in str(e)
        if dynamo:
            torch._dynamo.reset()
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        records.append(rec)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(records, indent=1))
        os.replace(tmp, path)
    return records


def run_problems(plan_path: Path) -> int:
    """The child program: run each problem of the plan once, write marks.json as it goes.

    ``plan["distinct"]``: ``run`` takes the first launch of each kernel in the whole run
    (``plan["skip"]``: the names earlier batches took), ``problem`` the first launch of each
    kernel in each problem (Inductor names kernels per graph, so ``triton_poi_fused_relu_0``
    of one problem is not that of another)."""
    import torch

    plan = json.loads(plan_path.read_text())
    marks_path = Path(plan["marks"])
    per_problem = plan.get("distinct") == "problem"
    device = plan.get("device", "cuda")   # "cpu": the runner checked without a GPU
    compiled = plan["mode"] == "compiled"
    marks_path.write_text("[]")   # the runner started: what goes wrong now is a problem's
    distinct_from_here(plan.get("skip", []))

    def start(i: int, p: dict) -> dict:
        if per_problem:
            distinct_from_here()
        return {"key": p["key"], "ok": False}

    def one(p: dict, mark: dict) -> None:
        first, t0 = _launches(), time.monotonic()
        try:
            module = module_from_source(Path(p["file"]).read_text(), f"kb_{p['module']}",
                                        p["file"])
            model, inputs = instantiate(module, torch, device)
            fn = model
            if compiled:
                # compile and autotune uncaptured: a kernel's first launch would otherwise be
                # one of the configs Inductor's autotuner tries, not the one it chose
                fn = torch.compile(model)
                with capture_paused(), torch.no_grad():
                    fn(*inputs)
                    if device == "cuda":
                        torch.cuda.synchronize()
            with torch.no_grad():
                fn(*inputs)
            if device == "cuda":
                torch.cuda.synchronize()
            mark["ok"] = True
        finally:
            last = _launches()
            mark.update(first_launch=None if first is None else first + 1, last_launch=last,
                        run_s=round(time.monotonic() - t0, 3))

    each_problem(plan["problems"], marks_path, start, one, torch=torch, dynamo=compiled,
                 cuda=device == "cuda")
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
            "regenerated": d.get("regenerated", 0),
            "omitted_bytes": sum(o["size"] for o in d.get("omitted_regions") or []),
            "verdict": verdict, "detail": detail,
            # capture_s: the dispatch's capture with its store (capture.json's capture_s);
            # store_s where capture.json gives it apart
            "capture_s": d.get("capture_s"), "store_s": d.get("store_s"),
            "replay_s": (replay or {}).get("s")})
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
        "problems_failed": sorted({f"{p['mode']} {p['key']}" if p.get("mode") else p["key"]
                                   for p in problems if not p.get("ok")}),
        "region_bytes": sum(r["region_bytes"] for r in rows),
        "state_bytes": sum(r["state_bytes"] for r in rows),
        "stored_bytes": sum(r["stored_bytes"] for r in rows),
        "median_stored_bytes": _median([r["stored_bytes"] for r in rows
                                        if r["verdict"] != "not captured"]),
        "regenerable": sum(bool(r.get("regenerated")) for r in rows),
        "capture_s": round(sum(r["capture_s"] or 0 for r in rows), 3),
        "replay_s": round(sum(r["replay_s"] or 0 for r in rows), 3),
        "largest": largest(rows)}


def _median(values: list[int]) -> float | None:
    import statistics

    return statistics.median(values) if values else None


def largest(rows: list[dict]) -> dict | None:
    """The captured dispatch with the most region bytes: its capture and replay wall time
    beside its region and stored bytes (what the GPU's copy bandwidth is read against)."""
    got = [r for r in rows if r["verdict"] != "not captured"]
    if not got:
        return None
    r = max(got, key=lambda r: r["region_bytes"])
    return {k: r.get(k) for k in ("level", "problem", "mode", "kernel", "region_bytes",
                                  "state_bytes", "stored_bytes", "regenerated", "verdict",
                                  "capture_s", "store_s", "replay_s")}


class Results:
    """``OUT/results.jsonl``, the run's memory across calls: a header line (scale, scale
    names, KernelBench commit), then one line per problem and mode when it is decided
    (``"type": "problem"``, ``"final": true``, its dispatch rows inside), one per attempt cut
    short (``"final": false``: the program died or timed out in that problem) and one per
    batch (``"type": "batch"``: seconds and bytes). Lines are appended and flushed one by
    one, so a call killed at its limit loses only the batch in flight; a torn last line is
    skipped when read back."""

    def __init__(self, path: Path, header: dict):
        import threading

        self.path, self.entries = path, []
        self.lock = threading.RLock()   # batches record from several threads
        if path.exists():
            for n, line in enumerate(path.read_text().splitlines(), 1):
                try:
                    self.entries.append(json.loads(line))
                except ValueError:
                    print(f"kernelbench.py: {path}:{n}: skipped a torn line", file=sys.stderr)
        if not self.entries:
            self.append({"type": "header", "schema": SCHEMA, "schema_version": 2, **header})
            return
        first = self.entries[0]
        if first.get("schema") != SCHEMA:
            raise SystemExit(f"kernelbench.py: {path} is not a kernelbench results file")
        for key in ("scale", "scale_names", "kernelbench"):
            if first.get(key) != header.get(key):
                raise SystemExit(f"kernelbench.py: {path} was made with {key} "
                                 f"{first.get(key)!r}, not {header.get(key)!r}: use another -o")

    @property
    def header(self) -> dict:
        return self.entries[0]

    def of_type(self, kind: str) -> list[dict]:
        return [e for e in self.entries if e.get("type") == kind]

    def final(self) -> list[dict]:
        return [e for e in self.of_type("problem") if e.get("final")]

    def is_final(self, key: str, mode: str) -> bool:
        return any(e["key"] == key and e["mode"] == mode for e in self.final())

    def attempts(self, key: str, mode: str) -> int:
        return sum(e["key"] == key and e["mode"] == mode for e in self.of_type("problem"))

    def kernels_taken(self, mode: str) -> list[str]:
        """Names of the kernels whose first launch an earlier batch of ``mode`` took."""
        return sorted({r["kernel"] for e in self.final() if e["mode"] == mode
                       for r in e["rows"]})

    def append(self, entry: dict) -> None:
        from kpair._util import append_text

        with self.lock:
            torn = False
            if self.path.exists() and self.path.stat().st_size:
                with open(self.path, "rb") as f:
                    f.seek(-1, os.SEEK_END)
                    torn = f.read(1) != b"\n"
            append_text(self.path, ("\n" if torn else "") + json.dumps(entry) + "\n")
            self.entries.append(entry)


def write_table(results: Results, out: Path) -> dict:
    """``OUT/fidelity.json`` (the fidelity table) and ``OUT/scaling.json`` from the results:
    every decided problem, its dispatch rows, the optimize outcomes, the batches, and a
    summary overall and per mode. Rewritten whole (atomically) after every batch."""
    final = results.final()
    problems = [{k: v for k, v in e.items() if k not in ("rows", "type", "final")}
                for e in final]
    rows = [r for e in final for r in e["rows"]]
    header = {k: v for k, v in results.header.items() if k != "type"}
    table = {**header, "summary": summarize(rows, problems),
             "by_mode": {m: summarize([r for r in rows if r["mode"] == m],
                                      [p for p in problems if p["mode"] == m])
                         for m in MODES},
             "problems": problems, "rows": rows,
             "optimize": [{"key": e["key"], **e["optimize"]} for e in final
                          if e.get("optimize")],
             "copy_bandwidth": [{k: v for k, v in e.items() if k != "type"}
                                for e in results.of_type("bandwidth")],
             "batches": results.of_type("batch")}
    scaling = {"scale": header.get("scale"), "scale_names": header.get("scale_names"),
               "scaled": {p["key"]: p["scaled"] for p in problems if p.get("scaled")}}
    for name, doc in (("fidelity.json", table), ("scaling.json", scaling)):
        tmp = out / f".{name}.tmp"
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        os.replace(tmp, out / name)
    return table


# --------------------------------------------------------------------------- the driver

#: The kpair processes running now: each in its own process group, which outlives this
#: process unless killed, so a SIGTERM (``timeout`` around a call) kills them first.
_RUNNING: set = set()


def _terminated(signum, frame) -> None:
    from kpair._util import kill_group

    for proc in list(_RUNNING):
        kill_group(proc)
    raise SystemExit(128 + signum)


def kpair(*args: str, timeout: float, env: dict[str, str] | None = None) -> dict:
    """Run ``python -m kpair ARGS`` in its own process group (on a timeout the whole group
    is killed: ``kpair capture``'s program, which holds the GPU, with it), with ``env`` added
    to the environment; its exit code (124: timed out), output and seconds."""
    from kpair._util import kill_group

    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "kpair", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, **env} if env else None)
    _RUNNING.add(proc)
    try:
        out, err = proc.communicate(timeout=max(1.0, timeout))
        code = proc.returncode
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        code, err = 124, f"{err or ''}\ntimed out after {timeout:g} s"
    finally:
        _RUNNING.discard(proc)
    return {"exit_code": code, "stdout": out or "", "stderr": err or "",
            "s": round(time.monotonic() - t0, 3)}


#: aten ops served by libraries (cuBLAS, cuDNN, attention) that pick a kernel by shape: a
#: new dispatch in every problem, eager or compiled (Inductor calls them as extern kernels).
EXTERN_OPS = ("convolution", "mm", "addmm", "bmm", "baddbmm", "addbmm", "_scaled_dot_product")


def _extern(op: str) -> bool:
    return op.startswith(EXTERN_OPS)


def estimates(problems: list[Problem], sizes: dict[str, dict]) -> dict[str, dict[str, dict]]:
    """Per problem and mode, the expected captured dispatches and their state bytes, from the
    op list of ``kernelbench.py sizes`` (problems without one: nothing expected).

    eager (the first launch of each kernel in the whole run, problems in order): an op whose
    name an earlier problem already ran is taken to launch the same kernel, except library
    ops; compiled (each problem's own first launches): its library ops plus one fused Triton
    kernel that reads the inputs and parameters and writes the output, at most what eager
    would store. Estimates for planning, not predictions: the batch lines of results.jsonl
    hold the real bytes beside them."""
    seen: set[str] = set()
    out = {}
    for pr in problems:
        ops = sizes.get(pr.key, {}).get("op_list", [])
        eager = [o for o in ops if _extern(o[0]) or o[0] not in seen]
        seen.update(o[0] for o in ops)
        extern = [o for o in ops if _extern(o[0])]
        size = sizes.get(pr.key, {})
        io = size.get("params_bytes", 0) + size.get("input_bytes", 0) \
            + 2 * size.get("output_bytes", 0)
        fused = 1 if len(extern) < len(ops) else 0
        out[pr.key] = {
            # GPU memory at most: the capture holds the problem's tensors and its largest
            # op's (a replay of one dispatch, its regions regenerated and digested on the
            # GPU, holds less)
            "peak_bytes": size.get("io_bytes", 0) + size.get("max_op_bytes", 0),
            "eager": {"dispatches": len(eager), "state_bytes": sum(o[1] + o[2] for o in eager)},
            "compiled": {"dispatches": len(extern) + fused,
                         "state_bytes": min(size.get("state_bytes", 0),
                                            sum(o[1] + o[2] for o in extern) + fused * io),
                         "operator_bytes": fused * (io - size.get("output_bytes", 0))}}
    return out


@dataclasses.dataclass(frozen=True)
class Rates:
    """What a step is expected to cost, for fitting batches into a call. Guesses from the
    project's H200 measurements (DESIGN.md: 200 eager problems captured in 119 s at a 512 MiB
    region cap; ~3 GB/s reading device memory back; a replay process a few seconds; an
    optimize of one operator 25-60 s), not measurements of this run: every batch line of
    results.jsonl records what it really took, to set these from.

    Regenerable snapshots (the default): a region whose writers since its allocation are a
    chain rooted in RNG kernels, fills, memsets and aranges (KernelBench's inputs from
    ``torch.rand``, weights from the modules' initialisers, all made on the GPU) is stored
    as that chain and a digest computed on the GPU; replay regenerates it on the GPU and
    checks the digest there. ``regen_share`` of the state bytes go that way, at
    ``device_gbps``; the rest (host data, outputs of ops that read host data) through the
    host at ``capture_gbps`` / ``replay_gbps`` / ``check_gbps``. ``regen_share`` 0 is
    ``--store-bytes``."""

    start_s: float = 30.0          # one capture process: python, torch, eager module loading
    eager_s: float = 0.2           # one problem's forward pass (200 ran in 8 s uncaptured)
    compiled_s: float = 15.0       # one problem's Inductor compile and two forward passes
    capture_fixed_s: float = 0.6   # one captured dispatch: sync, kernarg, regions, manifest
    capture_gbps: float = 1.0      # host state bytes (pre + post) read back, hashed, compressed
    replay_fixed_s: float = 4.0    # one kpair replay process: python, CUDA, placement
    replay_gbps: float = 1.0       # host state bytes loaded once: decompress, verify, upload
    check_gbps: float = 3.0        # host state bytes per replay run: restore, read back, compare
    optimize_s: float = 120.0      # one kpair optimize of one operator
    baseline_s: float = 60.0       # --inductor-baseline: one compiled problem run twice more,
                                   # under coordinate-descent and max-autotune (no regions)
    regen_share: float = 0.9       # state bytes regenerated and digested on the GPU
    device_gbps: float = 100.0     # those bytes' regeneration + digest (HBM: ~2-3 TB/s raw;
                                   # a chain's kernels and a digest pass, with launches)
    stored_share: float = 0.01     # stored bytes per regenerable state byte (chains, digests)

    def split(self, state_bytes: float) -> tuple[float, float]:
        """(host, device) GB of ``state_bytes``."""
        gb = state_bytes / 1e9
        return gb * (1 - self.regen_share), gb * self.regen_share

    def stored_bytes(self, state_bytes: float) -> float:
        """Bytes a snapshot of ``state_bytes`` is expected to store."""
        host, dev = self.split(state_bytes)
        return (host + dev * self.stored_share) * 1e9

    def problem_s(self, mode: str, est: dict, runs: int, jobs: int, optimize: int) -> float:
        """Seconds one problem adds to a batch (``est``: ``estimates()``' entry of this
        mode): run, capture, replays (``jobs`` at a time), and an optimize where its operator
        is expected to hold ``optimize`` bytes or fewer (0: no optimize)."""
        host, dev = self.split(est.get("state_bytes", 0))
        s = self.eager_s if mode == "eager" else self.compiled_s
        s += est.get("dispatches", 0) * self.capture_fixed_s + host / self.capture_gbps
        s += dev / self.device_gbps
        s += est.get("dispatches", 0) * self.replay_fixed_s / jobs
        s += host / self.replay_gbps + host * runs / self.check_gbps
        s += dev * (1 + runs) / self.device_gbps
        if mode == "compiled" and 0 < est.get("operator_bytes", 0) <= optimize:
            s += self.optimize_s
        return s


def parse_rates(text: str) -> Rates:
    """``--rates '{"capture_gbps": 0.6, ...}'``: ``Rates`` with the named fields replaced
    (from what the first calls' batch lines measured)."""
    try:
        given = json.loads(text)
        if not isinstance(given, dict):
            raise ValueError("not a JSON object")
        return dataclasses.replace(Rates(), **{k: float(v) for k, v in given.items()})
    except (ValueError, TypeError) as e:
        names = ", ".join(f.name for f in dataclasses.fields(Rates))
        raise argparse.ArgumentTypeError(f"--rates takes a JSON object of {names}: {e}") \
            from None


def plan_batch(todo: list[Problem], est: dict[str, dict[str, dict]], mode: str, *,
               bytes_left: float, seconds_left: float, max_count: int, rates: Rates,
               runs: int, jobs: int, optimize: int) -> list[Problem]:
    """The next batch: problems from the head of ``todo``, in order, while their expected
    stored bytes (``Rates.stored_bytes`` of their state bytes) fit ``bytes_left`` (the disk)
    and their seconds ``seconds_left`` (the call). A first problem larger than the disk
    budget goes alone (its estimate is an upper bound); one that needs more time than is
    left does not start."""
    batch, used_bytes, used_s = [], 0.0, rates.start_s
    for pr in todo[:max_count]:
        e = est.get(pr.key, {}).get(mode, {})
        b = rates.stored_bytes(e.get("state_bytes", 0))
        s = rates.problem_s(mode, e, runs, jobs, optimize)
        if used_s + s > seconds_left or (batch and used_bytes + b > bytes_left):
            break
        batch.append(pr)
        used_bytes += b
        used_s += s
    return batch


def split_by_peak(todo: list[Problem], est: dict[str, dict], limit: float
                  ) -> list[list[Problem]]:
    """``todo`` as [big, small] (in order within each): problems whose ``peak_bytes`` is
    over ``limit`` (a lane's share of the GPU: their batches hold most of it, so they go
    first and in batches of their own), then the others; one list where there is no big
    one."""
    big = [pr for pr in todo if est.get(pr.key, {}).get("peak_bytes", 0) > limit]
    small = [pr for pr in todo if est.get(pr.key, {}).get("peak_bytes", 0) <= limit]
    return [part for part in (big, small) if part]


def context_bytes() -> int:
    """GPU memory of one capture or replay process besides its problem
    (``kb_pipeline.JOB_CONTEXT_BYTES``)."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    from kb_pipeline import JOB_CONTEXT_BYTES

    return JOB_CONTEXT_BYTES


def choose_operator(rows: list[dict], problem: Problem) -> dict | None:
    """The compiled dispatch of ``problem`` to optimize: byte-exact, Triton, most bytes."""
    mine = [r for r in rows if r["mode"] == "compiled" and r["problem"] == problem.name
            and r["level"] == problem.level and r["verdict"] == "byte-exact"
            and r["kernel"].startswith("triton_")]
    return max(mine, key=lambda r: r["region_bytes"], default=None)


class Call:
    """One call's work: batches of one mode captured, replayed, optimized and recorded until
    the problems or the call's time run out. ``deadline``: a ``time.monotonic()`` value."""

    def __init__(self, args, results: Results, problems: list[Problem],
                 est: dict[str, dict[str, dict]], deadline: float, rates: Rates = Rates()):
        if getattr(args, "inductor_baseline", False):   # every compiled problem runs 3 times
            rates = dataclasses.replace(rates, compiled_s=rates.compiled_s + rates.baseline_s)
        self.args, self.results, self.est, self.rates = args, results, est, rates
        self.problems, self.deadline = problems, deadline
        self.by_key = {pr.key: pr for pr in problems}
        self.batches = 0
        #: batches captured at a time (one with --optimize: its work folder is shared), and
        #: the GPU memory they share (a CUDA context each plus twice its largest problem)
        self.lanes = 1 if getattr(args, "optimize", False) else \
            max(1, getattr(args, "capture_jobs", 1))
        self.gpu_budget = getattr(args, "gpu_mem_gib", 80.0) * 2**30 * 0.8
        #: expected stored bytes of the batches in flight, at most: --disk-budget, else 80%
        #: of the disk free when the call starts
        self.disk_budget = getattr(args, "disk_budget", None) or \
            0.8 * shutil.disk_usage(args.work).free

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def expect(self, pr: Problem, mode: str) -> dict:
        return self.est.get(pr.key, {}).get(mode, {})

    def todo(self, mode: str) -> list[Problem]:
        """Problems of ``mode`` not decided yet; one whose attempts were all cut short more
        than ``--retries`` times is decided as failed here."""
        out = []
        for pr in self.problems:
            if self.results.is_final(pr.key, mode):
                continue
            tries = self.results.attempts(pr.key, mode)
            if tries > self.args.retries:
                self.results.append({"type": "problem", "final": True, "key": pr.key,
                                     "level": pr.level, "problem": pr.name, "mode": mode,
                                     "ok": False, "scaled": {}, "rows": [],
                                     "error": f"cut short in all {tries} attempts"})
                continue
            out.append(pr)
        return out

    def run(self, modes: list[str]) -> bool:
        """Every mode's batches until done (True) or out of time (False)."""
        return all(self.run_mode(mode) for mode in modes)

    def gpu_bytes(self, batch: list[Problem]) -> float:
        """GPU memory a batch is expected to hold at most: a CUDA context (PyTorch's modules
        loaded eagerly) and its largest problem's peak (``estimates``' ``peak_bytes``: its
        capture, or a replay of its largest dispatch)."""
        peak = max((self.est.get(pr.key, {}).get("peak_bytes", 0) for pr in batch), default=0)
        return context_bytes() + peak / max(1, self.args.scale)

    def stored(self, batch: list[Problem], mode: str) -> float:
        """The bytes a batch is expected to store (``Rates.stored_bytes``)."""
        return sum(self.rates.stored_bytes(self.expect(pr, mode).get("state_bytes", 0))
                   for pr in batch)

    def run_mode(self, mode: str) -> bool:
        """``mode``'s batches, up to ``self.lanes`` at a time while their GPU memory fits
        ``--gpu-mem-gib`` and their expected stored bytes ``--disk-budget``, until every
        problem of the mode is decided (True) or no batch fits the time left (False). A
        problem a batch left undecided comes back in a later batch."""
        from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

        inflight: dict = {}   # future -> (keys, gpu bytes, expected stored bytes)
        stalled = False
        with ThreadPoolExecutor(self.lanes) as pool:
            while True:
                busy = {k for keys, _, _ in inflight.values() for k in keys}
                todo = [pr for pr in self.todo(mode) if pr.key not in busy]
                while todo and len(inflight) < self.lanes and not stalled:
                    gpu_used = sum(g for _, g, _ in inflight.values())
                    disk_used = sum(d for _, _, d in inflight.values())
                    free = shutil.disk_usage(self.args.work).free
                    room = min(self.args.batch_bytes, 0.8 * free, self.disk_budget - disk_used)
                    batch, fits = None, False
                    for part in split_by_peak(todo, self.est, self.gpu_budget / self.lanes):
                        batch = plan_batch(part, self.est, mode, bytes_left=max(room, 0.0),
                                           seconds_left=self.left(),
                                           max_count=self.args.batch_max, rates=self.rates,
                                           runs=self.args.runs, jobs=self.args.jobs,
                                           optimize=self.args.optimize_bytes)
                        fits = bool(batch) and (not inflight or (
                            gpu_used + self.gpu_bytes(batch) <= self.gpu_budget
                            and self.stored(batch, mode) <= room))
                        if fits:
                            break
                    if batch and not fits:
                        break   # waits for GPU memory or disk: a batch in flight ends first
                    if not batch and not self.batches and not inflight and \
                            self.rates.start_s + self.rates.problem_s(
                                mode, self.expect(todo[0], mode), self.args.runs,
                                self.args.jobs, self.args.optimize_bytes) > self.args.deadline:
                        batch = todo[:1]   # longer than any call: it gets one alone
                    if not batch:
                        if not inflight:
                            print(f"kernelbench.py: {mode}: {len(todo)} problems left, no "
                                  f"time for the next one in this call ({self.left():.0f} s "
                                  "left)", file=sys.stderr)
                            stalled = True
                        break
                    gpu = self.gpu_bytes(batch)
                    self.batches += 1
                    fut = pool.submit(self.batch, batch, mode, self.batches)
                    inflight[fut] = ({pr.key for pr in batch}, gpu, self.stored(batch, mode))
                    todo = [pr for pr in todo if pr not in batch]
                if not inflight:
                    break
                done, _ = wait(list(inflight), return_when=FIRST_COMPLETED)
                for fut in done:
                    del inflight[fut]
                    fut.result()   # a batch's SystemExit (capture never started) ends the call
                    with self.results.lock:
                        write_table(self.results, self.args.out)
        if not self.args.keep:
            with contextlib.suppress(OSError):
                (self.args.work / mode).rmdir()   # every batch's folder is gone
        return not stalled and not self.todo(mode)

    def batch(self, batch: list[Problem], mode: str, index: int = 1) -> None:
        """Capture one batch, then per problem in order: replay its dispatches, optimize,
        record. Stops recording at the first problem the call has no time left for (it and
        the rest are done again next call); deletes the snapshots at the end."""
        args, t0 = self.args, time.monotonic()
        work = args.work / mode / f"b{index}"
        if work.exists():
            shutil.rmtree(work)  # a call cut short left it: capture again
        print(f"kernelbench.py: {mode}: batch {index} of {len(batch)} from {batch[0].key} "
              f"({self.left():.0f} s left)", file=sys.stderr)
        records, summary = self.capture(batch, mode, work)
        capture_s = round(time.monotonic() - t0, 3)
        baselines = self.baseline_captures(work) if mode == "compiled" and args.optimize and \
            args.inductor_baseline else {}
        by_owner: dict[str, list[dict]] = {}
        for d in summary["dispatches"]:
            by_owner.setdefault(owner(d["launch_index"], summary["marks"]) or "", []).append(d)
        done = 0
        for pr in batch:
            rec = records[pr.key]
            if rec is None:        # never ran: the program died in an earlier problem
                break
            if not rec["final"]:   # the program died or timed out in this one
                self.results.append(rec)
                break
            mine = by_owner.get(pr.key, [])
            replays = self.replay(work / "capture", mine)
            row = None
            if replays is not None:
                rec["rows"] = fidelity_rows(mode, self.by_key, summary["marks"],
                                            {"dispatches": mine}, replays)
                row = choose_operator(rec["rows"], pr) if args.optimize else None
            if replays is None or (mode == "compiled" and row is not None
                                   and row["region_bytes"] <= args.optimize_bytes
                                   and self.left() < self.rates.optimize_s):
                # out of time: done again next call; an attempt only for the batch's first
                # (the others did not have the call to themselves)
                if pr is batch[0]:
                    self.results.append({**rec, "final": False, "ok": False, "rows": [],
                                         "error": "the call's time ran out in its replays "
                                         "or optimize"})
                break
            if args.optimize and mode == "compiled":
                rec["optimize"] = self.optimize(pr, row, work / "capture", baselines)
            self.results.append(rec)
            done += 1
        self.results.append({
            "type": "batch", "mode": mode, "keys": [pr.key for pr in batch], "recorded": done,
            "capture_s": capture_s, "wall_s": round(time.monotonic() - t0, 3),
            **({"baseline_captures": baselines} if baselines else {}),
            "exit_status": summary.get("exit_status"),
            "dispatches": len(summary["dispatches"]),
            "unowned": [d["kernel"] for d in by_owner.get("", [])],  # outside every problem
            "stored_bytes": sum(d.get("stored_bytes", 0) for d in summary["dispatches"]),
            "state_bytes": sum(d.get("state_bytes", 0) for d in summary["dispatches"]),
            "estimated_state_bytes": sum(self.expect(pr, mode).get("state_bytes", 0)
                                         for pr in batch),
            "disk_free_after_capture": summary.get("disk_free")})
        stored = sum(d.get("stored_bytes", 0) for d in summary["dispatches"])
        print(f"kernelbench.py: {mode}: batch {index} done: {done} of {len(batch)} problems "
              f"recorded, {len(summary['dispatches'])} dispatches, {stored / 2**20:.0f} MiB "
              f"stored, {time.monotonic() - t0:.0f} s ({self.left():.0f} s left)",
              file=sys.stderr)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    def capture(self, batch: list[Problem], mode: str, work: Path
                ) -> tuple[dict[str, dict | None], dict]:
        """Patch the batch's problem files and run them all under one ``kpair capture``:
        per problem its record (None: never started), and the capture summary with the
        marks."""
        args = self.args
        sources = work / "problems"
        sources.mkdir(parents=True)
        plan = {"mode": mode, "marks": str(work / "marks.json"), "problems": [],
                "distinct": "run" if mode == "eager" else "problem",
                "skip": self.results.kernels_taken(mode) if mode == "eager" else []}
        scaled_of = {}
        for p in batch:
            text, scaled_of[p.key] = scale_source(p.path.read_text(), args.scale,
                                                  args.scale_names)
            module = re.sub(r"\W", "_", f"l{p.level}_{p.name}")
            file = sources / f"{module}.py"
            file.write_text(text)
            plan["problems"].append({"key": p.key, "file": str(file), "module": module})
        (work / "plan.json").write_text(json.dumps(plan, indent=1))
        cap = work / "capture"
        # the replays' and optimizes' share of the call, kept from the capture (at most 60%)
        reserve = sum(self.rates.problem_s(mode, self.expect(p, mode), args.runs,
                                           args.jobs, args.optimize_bytes)
                      - (self.rates.eager_s if mode == "eager" else self.rates.compiled_s)
                      for p in batch)
        limit = min(args.capture_timeout,
                    max(30.0, self.left() - min(reserve, 0.6 * self.left())))
        run = kpair("capture", "-o", str(cap), "--distinct", "--max", "0",
                    "--max-region-bytes", args.max_region_bytes, "--",
                    sys.executable, str(Path(__file__).resolve()), RUNNER,
                    str(work / "plan.json"), timeout=limit)
        # cut by the call's deadline rather than --capture-timeout: the problem in flight is
        # blamed (an attempt) only when it had the batch to itself
        deadline_cut = run["exit_code"] == 124 and limit < args.capture_timeout
        marks_file = work / "marks.json"
        if not marks_file.exists():   # no problem's fault: capture or torch never started
            raise SystemExit(f"kernelbench.py: the runner never started under kpair capture "
                             f"(exit {run['exit_code']}): "
                             f"{run['stderr'].strip()[-2000:] or 'no message'}")
        marks = json.loads(marks_file.read_text())
        if not (cap / "capture.json").exists():   # the session never opened: no dispatch
            raise SystemExit(f"kernelbench.py: kpair capture wrote no capture.json (exit "
                             f"{run['exit_code']}): {run['stderr'].strip()[-2000:]}")
        summary = json.loads((cap / "capture.json").read_text())
        summary.update(marks=marks, exit_status=run["exit_code"],
                       disk_free=shutil.disk_usage(work).free)
        said = (run["stderr"].strip().splitlines() or [""])[-1]
        records: dict[str, dict | None] = {}
        marked = {m["key"]: m for m in marks}
        cut = False
        for p in batch:
            base = {"type": "problem", "key": p.key, "level": p.level, "problem": p.name,
                    "mode": mode, "scaled": scaled_of[p.key], "rows": [],
                    "capture_exit": run["exit_code"]}
            if p.key in marked:
                m = marked[p.key]
                records[p.key] = {**base, "final": True, "ok": m["ok"],
                                  "run_s": m.get("run_s"), **({"error": m["error"]}
                                                             if "error" in m else {})}
            elif not cut:   # the problem in flight when the program ended
                cut = True
                blamed = not deadline_cut or p is batch[0]
                records[p.key] = {**base, "final": False, "ok": False, "error": (
                    f"the program ended in this problem (kpair capture exit "
                    f"{run['exit_code']}: {said})")[:2000]} if blamed else None
            else:
                records[p.key] = None
        return records, summary

    def replay(self, cap: Path, dispatches: list[dict]) -> dict[str, dict] | None:
        """``kpair replay`` of each captured dispatch (small ones ``--jobs`` at a time, those
        over 1 GiB of state alone); None when the call's time ran out first."""
        from concurrent.futures import ThreadPoolExecutor

        args = self.args
        snaps = [d for d in dispatches if d["status"] == "captured"]

        def one(d: dict) -> tuple[str, dict]:
            return d["snapshot"], kpair("replay", str(cap / d["snapshot"]), "--runs",
                                        str(args.runs), "--json",
                                        timeout=min(args.replay_timeout, self.left()))

        small = [d for d in snaps if d.get("state_bytes", 0) < 1 << 30]
        large = [d for d in snaps if d.get("state_bytes", 0) >= 1 << 30]
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            done = dict(pool.map(one, small))
        done.update(one(d) for d in large)
        if self.left() <= 0 and any(r["exit_code"] == 124 for r in done.values()):
            return None
        return done

    def baseline_captures(self, work: Path) -> dict[str, dict]:
        """The batch run again under each of Inductor's tuning modes, in a fresh Inductor
        cache, every Triton kernel's first launch captured without its regions (what
        ``kpair optimize --baseline-capture`` reads: the config Inductor picked)."""
        from kpair.optimize.baseline import MODES

        out = {}
        for mode, environ in MODES.items():
            plan = json.loads((work / "plan.json").read_text())
            plan["marks"] = str(work / f"marks-{mode}.json")
            (work / f"plan-{mode}.json").write_text(json.dumps(plan, indent=1))
            cache = work / f"inductor-cache-{mode}"
            cache.mkdir()
            cap = work / f"capture-{mode}"
            run = kpair("capture", "-o", str(cap), "--distinct", "--max", "0",
                        "--max-region-bytes", "1", "--kernel", "^triton_", "--",
                        sys.executable, str(Path(__file__).resolve()), RUNNER,
                        str(work / f"plan-{mode}.json"),
                        timeout=min(self.args.capture_timeout, max(30.0, self.left())),
                        env={**environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)})
            out[mode] = {"capture": str(cap), "exit_code": run["exit_code"], "s": run["s"],
                         "ok": (cap / "capture.json").is_file()}
        return out

    def optimize(self, pr: Problem, row: dict | None, cap: Path,
                 baselines: dict[str, dict] | None = None) -> dict:
        """``kpair optimize`` of the problem's chosen compiled dispatch into the release,
        with the batch's tuned captures as its Inductor baselines."""
        args = self.args
        if row is None:
            return {"status": "no operator", "reason": "no byte-exact Triton dispatch"}
        if row["region_bytes"] > args.optimize_bytes:
            return {"status": "skipped", "kernel": row["kernel"], "reason": (
                f"its regions hold {row['region_bytes']} bytes, over --optimize-max-bytes "
                f"{args.optimize_bytes}")}
        run = kpair("optimize", "-o", str(args.release), "--work", str(args.work / "optimize"),
                    "--snapshot", str(cap / row["snapshot"]), "--name", pr.name,
                    "--level", str(pr.level), "--strategy", "triton", "--json",
                    *(a for mode, b in (baselines or {}).items() if b["ok"]
                      for a in ("--baseline-capture", f"{mode}={b['capture']}")),
                    *args.optimize_arg,
                    timeout=min(args.optimize_timeout, self.left()))
        try:
            doc = json.loads(run["stdout"])
            ops = [{k: o.get(k) for k in ("key", "status", "line")} for o in doc["operators"]]
        except (ValueError, KeyError, TypeError):
            ops = None
        if not args.keep:
            shutil.rmtree(args.work / "optimize", ignore_errors=True)
        said = (run["stderr"].strip().splitlines() or [""])[-1][:2000]
        return {"status": "ran", "kernel": row["kernel"], "exit_code": run["exit_code"],
                "s": run["s"], "operators": ops, **({} if ops else {"said": said})}


def load_sizes(path: Path | None) -> dict[str, dict]:
    """{problem key: its sizes record} from ``kernelbench.py sizes``' document (or none)."""
    if path is None:
        return {}
    doc = json.loads(path.read_text())
    if doc.get("schema") != "kpair.kernelbench-sizes":
        raise SystemExit(f"kernelbench.py: {path} is not a sizes document (kernelbench.py "
                         "sizes writes one)")
    return {r["key"]: r for r in doc["problems"]}


def simulate(problems: list[Problem], est: dict[str, dict[str, dict]], modes: list[str], *,
             deadline: float, batch_bytes: float, batch_max: int, runs: int, jobs: int,
             optimize: int, rates: Rates = Rates(), capture_jobs: int = 1,
             gpu_bytes: float = float("inf")) -> dict:
    """The calls the whole run is expected to take: batches planned as ``Call`` plans them,
    ``capture_jobs`` at a time (each batch to the lane that frees first, started once the
    batches still running leave room for its GPU memory in ``gpu_bytes``: a context and its
    largest problem's ``peak_bytes``), each call starting with ``deadline`` seconds and going
    on to the next mode when one is done (the next mode starts when every batch of this one
    has ended); a problem longer than a call gets one of its own (where it then runs until its
    own timeouts end it). ``problems_per_call``: per call, [mode, problems] for each mode it
    worked on."""
    lanes_n = max(1, capture_jobs)
    calls, total = [], 0.0
    todo = {m: list(problems) for m in modes}

    def cost(mode: str, batch: list[Problem]) -> float:
        return rates.start_s + sum(rates.problem_s(mode, est[pr.key][mode], runs, jobs,
                                                   optimize) for pr in batch)

    def memory(batch: list[Problem]) -> float:
        return context_bytes() + max(est[pr.key].get("peak_bytes", 0) for pr in batch)

    def start_at(running: list[tuple[float, float]], now: float, need: float) -> float:
        """The first time from ``now`` when a lane is free and the batches still running
        (end, memory) leave ``need`` bytes."""
        for t in [now] + sorted(e for e, _ in running if e > now):
            active = [m for e, m in running if e > t]
            if len(active) < lanes_n and sum(active) + need <= gpu_bytes:
                return t
        return max([now] + [e for e, _ in running])

    while any(todo.values()):
        running: list[tuple[float, float]] = []   # (end, memory) of the call's batches
        begin, per_mode = 0.0, []
        for mode in modes:
            n = 0
            while todo[mode]:
                t = start_at(running, begin, 0.0)
                options = []   # (start, batch, memory): big problems first if they fit now
                for part in split_by_peak(todo[mode], est, gpu_bytes / lanes_n):
                    batch = plan_batch(part, est, mode, bytes_left=batch_bytes,
                                       seconds_left=deadline - t, max_count=batch_max,
                                       rates=rates, runs=runs, jobs=jobs, optimize=optimize)
                    if batch:
                        mem = min(memory(batch), gpu_bytes)
                        options.append((start_at(running, t, mem), batch, mem))
                if not options:
                    break
                t, batch, mem = min(options, key=lambda o: o[0])
                c = cost(mode, batch)
                if t + c > deadline:
                    break
                running.append((t + c, mem))
                n, todo[mode] = n + len(batch), [pr for pr in todo[mode] if pr not in batch]
            if n:
                per_mode.append([mode, n])
            begin = max([begin] + [e for e, _ in running])
            if todo[mode]:
                break   # out of time in this mode: the call ends here
        if not per_mode:   # the first problem left is longer than any call: alone
            mode = next(m for m in modes if todo[m])
            begin = cost(mode, todo[mode][:1])
            per_mode, todo[mode] = [[mode, 1]], todo[mode][1:]
        calls.append(per_mode)
        total += begin
    return {"calls": len(calls), "estimated_s": round(total), "problems_per_call": calls,
            "capture_jobs": lanes_n, "rates": dataclasses.asdict(rates)}


def plan_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="kernelbench.py plan", description=(
        "How many calls the whole run needs, from kernelbench.py sizes' document and the "
        "assumed rates (no GPU): one JSON document."))
    p.add_argument("--sizes", type=Path, required=True)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--deadline", type=float, default=520.0, metavar="S")
    p.add_argument("--batch-bytes", type=float, default=40 * 2**30)
    p.add_argument("--batch-max", type=int, default=40)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--jobs", type=int, default=4)
    p.add_argument("--capture-jobs", type=int, default=CAPTURE_JOBS,
                   help=f"batches captured at a time (default {CAPTURE_JOBS})")
    p.add_argument("--gpu-mem-gib", type=float, default=80.0,
                   help="GPU memory the batches in flight share, 80%% of it used (default 80)")
    p.add_argument("--optimize", action="store_true")
    p.add_argument("--optimize-max-bytes", type=float, default=2**30)
    p.add_argument("--rates", type=parse_rates, default=Rates(), metavar="JSON",
                   help="replace some of the assumed rates, e.g. '{\"capture_gbps\": 0.6}'")
    args = p.parse_args(argv)
    sizes = load_sizes(args.sizes)
    problems = [Problem(r["level"], 0, r["problem"], Path()) for r in sizes.values()]
    est = estimates(problems, sizes)
    modes = [m for m in args.modes.split(",") if m]
    doc = simulate(problems, est, modes, deadline=args.deadline, batch_bytes=args.batch_bytes,
                   batch_max=args.batch_max, runs=args.runs, jobs=args.jobs,
                   optimize=int(args.optimize_max_bytes) if args.optimize else 0,
                   rates=args.rates, capture_jobs=1 if args.optimize else args.capture_jobs,
                   gpu_bytes=args.gpu_mem_gib * 2**30 * 0.8)
    doc["expected"] = {m: {"dispatches": sum(e[m]["dispatches"] for e in est.values()),
                           "state_bytes": sum(e[m]["state_bytes"] for e in est.values()),
                           "stored_bytes": round(sum(args.rates.stored_bytes(
                               e[m]["state_bytes"]) for e in est.values()))}
                       for m in modes}
    print(json.dumps(doc))
    return 0


def bandwidth_main(argv: list[str]) -> int:
    """``kernelbench.py bandwidth [--mib 1024] [--reps 3]``: the GPU's copy bandwidth, host to
    device and back (pinned and pageable host memory) and device to device, timed with CUDA
    events, best of ``--reps``; one JSON document."""
    p = argparse.ArgumentParser(prog="kernelbench.py bandwidth", description=(
        "The GPU's host<->device copy bandwidth (torch, CUDA events): one JSON document."))
    p.add_argument("--mib", type=int, default=1024)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    try:
        import torch
    except ImportError:
        raise SystemExit("kernelbench.py bandwidth needs torch") from None
    if not torch.cuda.is_available():
        raise SystemExit("kernelbench.py bandwidth: no CUDA device")
    n = args.mib << 20
    dev, dev2 = (torch.empty(n, dtype=torch.uint8, device="cuda") for _ in range(2))
    pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    pageable = torch.empty(n, dtype=torch.uint8)

    def best_gbps(dst, src) -> float:
        times = []
        for _ in range(max(1, args.reps)):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=False)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return round(n / min(times) / 1e9, 3)

    dev.fill_(1)
    doc = {"device": torch.cuda.get_device_name(), "bytes": n, "reps": args.reps,
           "h2d_pinned_gbps": best_gbps(dev, pinned), "d2h_pinned_gbps": best_gbps(pinned, dev),
           "h2d_pageable_gbps": best_gbps(dev, pageable),
           "d2h_pageable_gbps": best_gbps(pageable, dev), "d2d_gbps": best_gbps(dev2, dev)}
    print(json.dumps(doc))
    return 0


def copy_bandwidth(mib: int = 1024, timeout: float = 120.0) -> dict:
    """``kernelbench.py bandwidth`` in its own process: its document, or ``error``."""
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "bandwidth",
                               "--mib", str(mib)], capture_output=True, text=True,
                              timeout=timeout)
        doc = json.loads(proc.stdout) if proc.returncode == 0 else {
            "error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
    except (subprocess.TimeoutExpired, ValueError) as e:
        doc = {"error": f"{type(e).__name__}: {e}"[:500]}
    return {**doc, "s": round(time.monotonic() - t0, 3),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def run_main(argv: list[str]) -> int:
    from kpair.cli.capture import parse_size

    p = argparse.ArgumentParser(prog="kernelbench.py run", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernelbench", type=Path, required=True, help="KernelBench checkout")
    p.add_argument("--level", default="1,2", help="levels, comma-separated (default 1,2)")
    p.add_argument("--problems", type=int, metavar="N", help="the first N problems per level")
    p.add_argument("--start", type=int, default=0, help="first problem (0-based)")
    p.add_argument("--count", type=int, help="problems from --start (default: all)")
    p.add_argument("--scale", type=int, default=1, metavar="K",
                   help="divide the size constants by K (default 1: KernelBench's sizes)")
    p.add_argument("--scale-names", default=",".join(DEFAULT_SCALE_NAMES),
                   help="module-level constants --scale divides (default "
                   f"{','.join(DEFAULT_SCALE_NAMES)})")
    p.add_argument("--modes", default=",".join(MODES), help="eager,compiled (default both)")
    p.add_argument("--sizes", type=Path, help="kernelbench.py sizes' document: batches are "
                   "planned by each problem's estimated state bytes")
    p.add_argument("--deadline", type=float, default=float("inf"), metavar="S",
                   help="start no work that is expected to end more than S seconds after "
                   "this call began (default: no limit)")
    p.add_argument("--batch-bytes", type=parse_size, default=40 << 30, metavar="SIZE",
                   help="estimated state bytes per batch, at most (default 40GiB; never more "
                   "than 80%% of the free disk)")
    p.add_argument("--batch-max", type=int, default=40, metavar="N",
                   help="problems per batch, at most (default 40)")
    p.add_argument("--rates", type=parse_rates, default=Rates(), metavar="JSON",
                   help="replace some of the rates batches are planned by, e.g. "
                   "'{\"capture_gbps\": 0.6}' (fields of Rates)")
    p.add_argument("--retries", type=int, default=1,
                   help="attempts cut short (crash, timeout) before a problem is decided as "
                   "failed, minus one (default 1)")
    p.add_argument("--runs", type=int, default=3, help="replays per dispatch (default 3)")
    p.add_argument("--jobs", type=int, default=4, help="replays at a time in each batch "
                   "(default 4)")
    p.add_argument("--capture-jobs", type=int, default=CAPTURE_JOBS, metavar="N",
                   help="batches captured (and replayed) at a time while their GPU memory "
                   f"fits --gpu-mem-gib (default {CAPTURE_JOBS}; 1 with --optimize)")
    p.add_argument("--gpu-mem-gib", type=float, default=80.0,
                   help="GPU memory the batches in flight share, 80%% of it used (default "
                   "80: an H100)")
    p.add_argument("--disk-budget", type=parse_size, metavar="SIZE",
                   help="expected stored bytes of the batches in flight, at most (default: "
                   "80%% of the free disk)")
    p.add_argument("--bandwidth-mib", type=int, default=1024, metavar="MIB",
                   help="measure the GPU's copy bandwidth with buffers this large before the "
                   "batches (0: not measured; default 1024)")
    p.add_argument("--max-region-bytes", default="64GiB",
                   help="kpair capture's per-region cap (default 64GiB: keep everything)")
    p.add_argument("--capture-timeout", type=float, default=540.0, metavar="S")
    p.add_argument("--replay-timeout", type=float, default=180.0, metavar="S")
    p.add_argument("--work", type=Path, help="where the batch's snapshots go (default "
                   "OUT/work); emptied after each batch unless --keep")
    p.add_argument("--keep", action="store_true", help="keep the captures (default: deleted)")
    p.add_argument("--optimize", action="store_true",
                   help="kpair optimize one compiled dispatch per problem into --release")
    p.add_argument("--release", type=Path, help="the release (default OUT/release)")
    p.add_argument("--optimize-arg", action="append", default=[], metavar="ARG",
                   help="passed to kpair optimize (repeatable), e.g. --optimize-arg=--triton-"
                   "limit=12")
    p.add_argument("--optimize-max-bytes", type=parse_size, default=1 << 30, metavar="SIZE",
                   help="optimize only operators whose regions hold at most SIZE (default "
                   "1GiB: a harness that size is measured in seconds and fits the disk)")
    p.add_argument("--optimize-timeout", type=float, default=300.0, metavar="S")
    p.add_argument("--inductor-baseline", action="store_true",
                   help="with --optimize: run each compiled batch twice more, under "
                   "Inductor's coordinate-descent tuning and under max-autotune (no regions "
                   "kept), and measure the configs they pick beside each search, against "
                   "which the release sets kpair's winners")
    p.add_argument("-o", "--out", type=Path, required=True,
                   help="results.jsonl, fidelity.json, scaling.json go here")
    args = p.parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        return run(args, p)
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(args, p: argparse.ArgumentParser) -> int:
    """``kernelbench.py run``: one call's batches (0: everything decided; 3: time ran out
    with problems left)."""
    t0 = time.monotonic()
    args.scale_names = tuple(n for n in args.scale_names.split(",") if n)
    modes = [m for m in args.modes.split(",") if m]
    if any(m not in MODES for m in modes) or args.scale < 1:
        p.error("--modes takes eager and/or compiled; --scale is 1 or more")
    args.work = args.work or args.out / "work"
    args.release = args.release or args.out / "release"
    args.optimize_bytes = args.optimize_max_bytes if args.optimize else 0
    problems = discover(args.kernelbench, [int(x) for x in args.level.split(",")],
                        args.problems)
    problems = problems[args.start:None if args.count is None else args.start + args.count]
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    results = Results(args.out / "results.jsonl", {
        "kernelbench": {"commit": kernelbench_commit(args.kernelbench)},
        "scale": args.scale, "scale_names": list(args.scale_names)})
    every = discover(args.kernelbench, [int(x) for x in args.level.split(",")])
    call = Call(args, results, problems, estimates(every, load_sizes(args.sizes)),
                t0 + args.deadline, args.rates)
    if args.bandwidth_mib and any(call.todo(m) for m in modes):   # a call with work to do
        bw = copy_bandwidth(args.bandwidth_mib)
        results.append({"type": "bandwidth", **bw})
        print(f"kernelbench.py: copy bandwidth {json.dumps(bw)}", file=sys.stderr)
    finished = call.run(modes)
    table = write_table(results, args.out)
    s = table["summary"]
    left = {m: len(call.todo(m)) for m in modes}
    print(json.dumps({"finished": finished, "left": left, "wall_s":
                      round(time.monotonic() - t0, 1),
                      **{k: s[k] for k in ("dispatches", "verdicts",
                                           "byte_exact_of_deterministic", "problems")}}))
    return 0 if finished else 3


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = {RUNNER: lambda rest: run_problems(Path(rest[0])), "sizes": sizes_main,
                "plan": plan_main, "run": run_main, "bandwidth": bandwidth_main,
                # the tournament's release: benchmarks/kernelbench_release.py
                "release": lambda rest: __import__("kernelbench_release").main(rest)}
    if not argv or argv[0] not in commands:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
