"""Range capture of real PyTorch programs on a GPU, each range replayed: the issue 47 check.

    python benchmarks/range_capture_gpu.py --out OUT [--runs 3]

Writes two small programs into ``OUT/programs/`` and captures them with
``kpair.capture.workflow.capture_program(..., ranges=[...])`` (what ``kpair capture --range``
does):

- ``mlp.py``: a matmul + bias + ReLU forward, eager, marked with ``kpair.mark("eager_fwd")``
  (its output declared), then the same function under ``torch.compile`` in the same process,
  marked ``torch.cuda.nvtx.range("compiled_fwd")``; each is run once before its range (cuBLAS
  handles, Inductor's compile), so the ranges hold the forward's operations only;
- ``softmax.py``: a softmax marked ``torch.cuda.nvtx.range("softmax")``;
- ``conv.py``: KernelBench Level 2's Conv2d + ReLU + bias (small), eager and compiled, each
  marked with ``kpair.mark`` and its output declared, as ``kernelbench_ranges.py`` runs it.

Each captured range is replayed by ``kpair replay --json --runs N``. Prints one JSON document
(also ``OUT/range_capture_gpu.json``): per range its status (or refusal reason), operations
(kernels, memsets, copies, streams), regions and roles, region/scratch/stored bytes, the
replay verdict and the seconds capture and replay took, and ``region_table``: every region
and scratch region (name, address, size, role, the declared output spans in it, and which
operations name it: ``op3.arg1`` for a kernel's parameter, ``op2.dst``/``op2.src``), and
``tensors``: which region holds each tensor the program printed (its addresses are under
``programs``); and per pair of ranges
(eager, compiled) whether ``kpair.bind.bind_capture`` binds them (``binds``) or why not.
Exit status 0 when every range was captured and replayed byte-exact, 1 otherwise; a machine
without CUDA, PyTorch or CUPTI gets one line on stderr and the exit code of kpair's
BackendUnavailable (4).

    python benchmarks/range_capture_gpu.py --show SNAPSHOT [SNAPSHOT ...]

prints the region table of snapshots already captured (no GPU needed).
"""

from __future__ import annotations

import argparse
import json
import struct
import subprocess
import sys
import time
from pathlib import Path

MLP = """
import json, torch, kpair
torch.manual_seed(0)
x = torch.randn(512, 1024, device="cuda")
w = torch.randn(1024, 768, device="cuda")
b = torch.randn(768, device="cuda")

def forward(x, w, b):
    return torch.relu(x @ w + b)

forward(x, w, b)
torch.cuda.synchronize()
with kpair.mark("eager_fwd") as m:
    y = forward(x, w, b)
    m.outputs(y)
torch.cuda.synchronize()

compiled = torch.compile(forward)
compiled(x, w, b)          # Inductor compiles here, outside the range
torch.cuda.synchronize()
with torch.cuda.nvtx.range("compiled_fwd"):
    z = compiled(x, w, b)
torch.cuda.synchronize()
assert torch.allclose(y, z, atol=1e-2, rtol=1e-2)
print("TENSORS " + json.dumps({k: [t.data_ptr(), t.nbytes] for k, t in
                               dict(x=x, w=w, b=b, y=y, z=z).items()}))
"""

SOFTMAX = """
import json, torch
torch.manual_seed(0)
x = torch.randn(4096, 1000, device="cuda")
torch.softmax(x, dim=-1)
torch.cuda.synchronize()
with torch.cuda.nvtx.range("softmax"):
    y = torch.softmax(x, dim=-1)
torch.cuda.synchronize()
print("TENSORS " + json.dumps({k: [t.data_ptr(), t.nbytes] for k, t in dict(x=x, y=y).items()}))
"""

#: KernelBench level2/1_Conv2D_ReLU_BiasAdd, small: the model and input made, both forwards
#: run once uncaptured (compile), then each in its range with its output declared.
CONV = """
import json, torch, kpair
torch.manual_seed(0)

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(64, 128, 3)
        self.bias = torch.nn.Parameter(torch.randn(128, 1, 1) * 0.02)

    def forward(self, x):
        return torch.relu(self.conv(x)) + self.bias

model = Model().cuda()
x = torch.randn(8, 64, 34, 34, device="cuda")
compiled = torch.compile(model)
with torch.no_grad():
    for fn in (model, compiled, compiled):
        fn(x)
    torch.cuda.synchronize()
    with kpair.mark("conv_eager") as m:
        y = model(x)
        m.outputs(y)
        torch.cuda.synchronize()
    with kpair.mark("conv_compiled") as m:
        z = compiled(x)
        m.outputs(z)
        torch.cuda.synchronize()
named = dict(x=x, weight=model.conv.weight, conv_bias=model.conv.bias, bias=model.bias,
             y=y, z=z)
print("TENSORS " + json.dumps({k: [t.data_ptr(), t.nbytes] for k, t in named.items()}))
"""

PROGRAMS = {"mlp": (MLP, ["eager_fwd", "compiled_fwd"]), "softmax": (SOFTMAX, ["softmax"]),
            "conv": (CONV, ["conv_eager", "conv_compiled"])}
#: (ref, candidate) ranges bound by ``kpair.bind.bind_capture``
PAIRS = [("eager_fwd", "compiled_fwd"), ("conv_eager", "conv_compiled")]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path,
                   help="output directory (new or empty): programs, captures, the JSON")
    p.add_argument("--runs", type=int, default=3, help="replays per range (default 3)")
    p.add_argument("--timeout", type=float, default=900.0,
                   help="seconds for each program's capture (default 900)")
    p.add_argument("--show", type=Path, nargs="+", metavar="SNAPSHOT",
                   help="print the region table of these snapshots and exit")
    args = p.parse_args(argv)
    if args.show is None and args.out is None:
        p.error("--out is required (or --show SNAPSHOT ...)")
    if not 1 <= args.runs <= 1000:
        p.error(f"--runs must be 1 to 1000, not {args.runs}")
    return args


def preflight() -> None:
    """A one-line refusal, with kpair's exit code, where capture cannot run at all."""
    from kpair.capture.cupti import find_cupti
    from kpair.errors import BackendUnavailable

    try:
        import torch
    except ImportError:
        raise BackendUnavailable("PyTorch is not installed: the programs are PyTorch "
                                 "programs") from None
    if not torch.cuda.is_available():
        raise BackendUnavailable("no CUDA device: torch.cuda.is_available() is False")
    find_cupti()


def replay(snapshot: Path, runs: int) -> dict:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "kpair", "replay", "--json", "-q", "--runs",
                           str(runs), str(snapshot)], capture_output=True, text=True,
                          timeout=1800)
    seconds = round(time.monotonic() - t0, 3)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        return {"status": "error", "error": (proc.stderr.strip().splitlines() or ["?"])[-1],
                "seconds": seconds}
    return {"status": report.get("status"), "runs": report.get("runs"),
            "ops": report.get("ops"), "differing_regions": report.get("differing_regions"),
            "unstable_regions": report.get("unstable_regions"), "seconds": seconds}


def region_table(snapshot: Path) -> list[dict]:
    """Every region and scratch region of a range snapshot: name, address, size, role
    (``scratch`` for scratch), the declared output spans in it (``outputs``: [offset,
    size]), why capture counts it written (``written``: changed, allocated inside,
    declared output, memset/copy) and which operations name it (``named_by``): a kernel
    by each 8-byte kernarg word inside the region (``op3.arg1``, ``op3.arg0.w16`` for a
    word 16 bytes into a parameter), a memset or copy by its destination and source
    (``op2.dst``)."""
    from kpair.snapshot import Snapshot

    snap = Snapshot.open(snapshot)
    m = snap.manifest
    rows = [{"name": r.name, "address": hex(r.address), "size": r.size, "role": r.role,
             "end": r.end, "named_by": []} for r in m.regions]
    rows += [{"name": s.name, "address": hex(s.address), "size": s.size, "role": "scratch",
              "end": s.end, "named_by": []} for s in m.scratch_regions]

    def name(i: int, label: str, value: int) -> None:
        for row in rows:
            if int(row["address"], 16) <= value < row["end"] and label not in row["named_by"]:
                row["named_by"].append(label)

    for i, op in enumerate(m.operations):
        if op.kind != "kernel":
            name(i, f"op{i}.dst", op.dst)
            if op.src is not None:
                name(i, f"op{i}.src", op.src)
            continue
        blob = snap.read_blob(op.kernarg.blob)
        for k, p in enumerate(op.kernarg.params or ()):
            for off in range(-(-p.offset // 8) * 8, p.offset + p.size - 7, 8):
                if off + 8 <= len(blob):
                    (value,) = struct.unpack_from("<Q", blob, off)
                    w = off - p.offset
                    name(i, f"op{i}.arg{k}" + (f".w{w}" if w else ""), value)
        if not op.kernarg.params:
            for off in range(0, len(blob) - 7, 8):
                name(i, f"op{i}.w{off}", struct.unpack_from("<Q", blob, off)[0])
    for o in m.output_spans:
        row = next(r for r in rows if r["name"] == o.region)
        row.setdefault("outputs", []).append([o.offset, o.size])
    written = m.provenance.get("written") if isinstance(m.provenance, dict) else None
    for row in rows:
        del row["end"]
        if isinstance(written, dict) and row["name"] in written:
            row["written"] = written[row["name"]]
    return rows


def tensor_regions(table, tensors: dict) -> dict:
    """Per tensor the program printed, the region of the range that holds its first byte
    ("name (role)"), or null where the range names no memory of it."""
    if not isinstance(table, list):
        return {}
    out = {}
    for k, (address, _) in tensors.items():
        row = next((r for r in table if int(r["address"], 16) <= address
                    < int(r["address"], 16) + r["size"]), None)
        out[k] = None if row is None else f"{row['name']} ({row['role']})"
    return out


def tensors_of(stdout: str) -> dict:
    """The ``TENSORS {...}`` line a program printed: {name: [address, bytes]}."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("TENSORS "):
            try:
                return json.loads(line[len("TENSORS "):])
            except ValueError:
                return {}
    return {}


def binds(ref: Path, cand: Path) -> dict:
    """Whether ``kpair.bind.bind_capture`` binds ``cand``'s range to ``ref``'s: ``ok`` and
    each binding, or the refusal's message."""
    from kpair.bind import bind_capture
    from kpair.errors import KpairError
    from kpair.snapshot import Snapshot

    try:
        bound = bind_capture(Snapshot.open(ref), Snapshot.open(cand))
    except KpairError as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    except Exception as e:  # noqa: BLE001 - evidence: the bug itself is what to report
        return {"ok": False, "error": f"internal {type(e).__name__}: {e}"}
    found = getattr(bound, "bindings", None)
    found = found.values() if isinstance(found, dict) else (found or ())
    return {"ok": True, "bindings": [
        {k: getattr(b, k) for k in ("region", "to", "name", "offset", "access", "why")
         if hasattr(b, k)} for b in found]}


def show(paths: list[Path]) -> int:
    out = {}
    for path in paths:
        try:
            out[str(path)] = region_table(path)
        except Exception as e:  # noqa: BLE001 - one unreadable snapshot, said in its entry
            out[str(path)] = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(out, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.show is not None:
        return show(args.show)
    from kpair.errors import KpairError

    try:
        preflight()
        if args.out.exists() and any(args.out.iterdir()):
            raise KpairError(f"{args.out} exists and is not empty")
    except KpairError as e:
        print(f"range_capture_gpu: {e}", file=sys.stderr)
        return e.exit_code
    from kpair.capture.workflow import capture_program

    (args.out / "programs").mkdir(parents=True)
    result: dict = {"ranges": {}, "programs": {}, "pairs": {}}
    snapshots: dict[str, Path] = {}
    ok = True
    for name, (source, ranges) in PROGRAMS.items():
        path = args.out / "programs" / f"{name}.py"
        path.write_text(source)
        t0 = time.monotonic()
        printed = args.out / "programs" / f"{name}.out"
        with printed.open("w") as sink:
            outcome = capture_program([sys.executable, str(path)], args.out / name,
                                      ranges=ranges, timeout_s=args.timeout, stdout=sink,
                                      log=lambda m: print(m, file=sys.stderr))
        tensors = tensors_of(printed.read_text(errors="replace"))
        result["programs"][name] = {"exit_status": outcome.exit_status,
                                    "timed_out": outcome.timed_out,
                                    "seconds": round(time.monotonic() - t0, 3),
                                    "tensors": {k: [hex(a), n] for k, (a, n) in
                                                tensors.items()}}
        ok &= outcome.exit_status == 0
        records = {r["name"]: r for r in (outcome.summary or {}).get("ranges", [])}
        for rname in ranges:
            r = records.get(rname, {"status": "missing", "reason": "no capture.json"})
            entry = {k: r.get(k) for k in (
                "status", "reason", "source", "ops", "kernels", "memsets", "copies", "streams",
                "regions", "scratch", "roles", "region_bytes", "scratch_bytes",
                "stored_bytes", "capture_s") if r.get(k) is not None}
            entry["program"] = name
            if r["status"] == "captured":
                snapshots[rname] = args.out / name / r["snapshot"]
                try:
                    entry["region_table"] = region_table(snapshots[rname])
                except Exception as e:  # noqa: BLE001 - evidence, not a reason to stop
                    entry["region_table"] = {"error": f"{type(e).__name__}: {e}"}
                entry["tensors"] = tensor_regions(entry["region_table"], tensors)
                entry["replay"] = replay(args.out / name / r["snapshot"], args.runs)
                ok &= entry["replay"]["status"] == "byte-exact"
            else:
                ok = False
            result["ranges"][rname] = entry
    for ref, cand in PAIRS:
        if ref in snapshots and cand in snapshots:
            result["pairs"][f"{ref}/{cand}"] = binds(snapshots[ref], snapshots[cand])
    result["all_byte_exact"] = ok
    try:
        import torch

        result["device"] = torch.cuda.get_device_name(0)
        result["torch"] = torch.__version__
    except Exception:  # the device name is a label only
        pass
    text = json.dumps(result, indent=1)
    (args.out / "range_capture_gpu.json").write_text(text + "\n")
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
