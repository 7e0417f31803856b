"""Range capture of real PyTorch programs on a GPU, each range replayed: the issue 47 check.

    python benchmarks/range_capture_gpu.py --out OUT [--runs 3]

Writes two small programs into ``OUT/programs/`` and captures them with
``kpair.capture.workflow.capture_program(..., ranges=[...])`` (what ``kpair capture --range``
does):

- ``mlp.py``: a matmul + bias + ReLU forward, eager, marked with ``kpair.mark("eager_fwd")``
  (its output declared), then the same function under ``torch.compile`` in the same process,
  marked ``torch.cuda.nvtx.range("compiled_fwd")``; each is run once before its range (cuBLAS
  handles, Inductor's compile), so the ranges hold the forward's operations only;
- ``softmax.py``: a softmax marked ``torch.cuda.nvtx.range("softmax")``.

Each captured range is replayed by ``kpair replay --json --runs N``. Prints one JSON document
(also ``OUT/range_capture_gpu.json``): per range its status (or refusal reason), operations
(kernels, memsets, copies, streams), regions and roles, region/scratch/stored bytes, the
replay verdict and the seconds capture and replay took. Exit status 0 when every range was
captured and replayed byte-exact, 1 otherwise; a machine without CUDA, PyTorch or CUPTI gets
one line on stderr and the exit code of kpair's BackendUnavailable (4).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

MLP = """
import torch, kpair
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
"""

SOFTMAX = """
import torch
torch.manual_seed(0)
x = torch.randn(4096, 1000, device="cuda")
torch.softmax(x, dim=-1)
torch.cuda.synchronize()
with torch.cuda.nvtx.range("softmax"):
    y = torch.softmax(x, dim=-1)
torch.cuda.synchronize()
"""

PROGRAMS = {"mlp": (MLP, ["eager_fwd", "compiled_fwd"]), "softmax": (SOFTMAX, ["softmax"])}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True,
                   help="output directory (new or empty): programs, captures, the JSON")
    p.add_argument("--runs", type=int, default=3, help="replays per range (default 3)")
    p.add_argument("--timeout", type=float, default=900.0,
                   help="seconds for each program's capture (default 900)")
    args = p.parse_args(argv)
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


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
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
    result: dict = {"ranges": {}, "programs": {}}
    ok = True
    for name, (source, ranges) in PROGRAMS.items():
        path = args.out / "programs" / f"{name}.py"
        path.write_text(source)
        t0 = time.monotonic()
        outcome = capture_program([sys.executable, str(path)], args.out / name, ranges=ranges,
                                  timeout_s=args.timeout, log=lambda m: print(m, file=sys.stderr))
        result["programs"][name] = {"exit_status": outcome.exit_status,
                                    "timed_out": outcome.timed_out,
                                    "seconds": round(time.monotonic() - t0, 3)}
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
                entry["replay"] = replay(args.out / name / r["snapshot"], args.runs)
                ok &= entry["replay"]["status"] == "byte-exact"
            else:
                ok = False
            result["ranges"][rname] = entry
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
