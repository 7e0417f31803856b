"""What the trust checks cost on a verify run, printed as JSON.

For a few recorded dispatches it runs the same pair harness (isolated worker, as ``kpair run``
and ``kpair verify`` do) with the checks on and with ``RunOptions(checks=False)``
(``--no-checks``), at a fixed measurement budget (exactly ``--blocks`` ABBA blocks), and
reports the medians over ``--repeat`` runs of: the worker's wall time, and its per-stage
seconds (``result.json`` ``stage_s``). The checks' cost is the difference: their own stages
(``trust:poison``, ``trust:differential``, ``trust:timing``), the repeats in ``ref`` and
``opt``, and the untimed poison/canary writes around every ABBA launch in ``measure``.

    python benchmarks/trust_overhead.py [--backend host|cuda] [--blocks 32] [--repeat 3]
                                        [--case NAME ...] [--out FILE.json]

host: kp_matmul (tests/csrc/matmul.c, naive ref vs loop-reordered opt, byte-exact, with
mutations of both inputs declared) at n = 64, 128, 256. cuda: A/A pairs of the axpy and
tiled GEMM test kernels (tests/cuda; needs a GPU, cuda-bindings and nvcc), and ``axpbyz_3x16M``:
z = a*x + y over three 16 MiB regions (48 MiB), with the default policy (derived mutations).
Both: ``relu_backward_16M``, an A/A pair of a threshold backward updated in place over 4 Mi
floats (tests/csrc/relu_backward.c, tests/cuda/elementwise.cu): which bytes of its 16 MiB
output are write-only depends on a random mask, about 2 M runs of them (the poison of a
data-dependent write pattern), default policy.
Each case reports ``checked_over_unchecked`` (checked wall / unchecked wall; the goal for
>= 48 MiB of regions is <= 1.5). With ``--backend cuda`` the output also has
``compare_speed``: one 16 MiB region compared on the device against a held copy
(``Device.compare``), checked for a fill (``check_fills``) and read back to the host
(``Device.read``), in GB/s of region bytes (median of repeated calls, wall clock).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
from _bench import cuda_test_kernels, record_axpy, record_gemm

from kpair.backends import open_device
from kpair.harness import create_harness
from kpair.isolation import run_isolated
from kpair.pipeline import RunOptions
from kpair.policy import Mutation, Policy
from kpair.record import record_call

ROOT = Path(__file__).resolve().parents[1]
CHECK_STAGES = ("trust:poison", "trust:differential", "trust:timing")


def host_cases(tmp: Path) -> list[tuple[str, Path]]:
    from kpair.toolchain import compile_shared

    src = ROOT / "tests" / "csrc" / "matmul.c"
    ref = compile_shared(src, tmp / "naive.so", defines={"KP_VARIANT": 0})
    opt = compile_shared(src, tmp / "fast.so", defines={"KP_VARIANT": 1})
    policy = Policy(mutations=(Mutation("a", "float32", "permute", 2),
                               Mutation("b", "float32", "permute", 2)))
    rng = np.random.default_rng(0)
    out = []
    for n in (64, 128, 256):
        a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
        c = np.full((n, n), np.nan, np.float32)
        snap = record_call(ref, "kp_matmul", [a, b, c, np.int32(n)], tmp / f"snap{n}",
                           names=["a", "b", "c", "n"])
        h = create_harness(snap.root, tmp / f"matmul{n}", opt=opt, policy=policy)
        out.append((f"matmul_n{n}", h.root))
    relu = compile_shared(ROOT / "tests" / "csrc" / "relu_backward.c", tmp / "relu.so")
    return out + [relu_backward_case(tmp, relu)]


def relu_backward_case(tmp: Path, binary: Path, backend: str = "host") -> tuple[str, Path]:
    from kpair.snapshot import Launch

    n = 4 << 20
    rng = np.random.default_rng(1)
    mask = (rng.random(n) < 0.5).astype(np.uint8)
    g, out = rng.standard_normal(n, np.float32), rng.standard_normal(n, np.float32)
    kernel = "relu_backward" if backend == "cuda" else "kp_relu_backward"
    snap = record_call(binary, kernel, [mask, g, out, np.int32(n)], tmp / "relu", backend=backend,
                       launch=Launch((n // 256, 1, 1), (256, 1, 1)) if backend == "cuda"
                       else None, names=["mask", "g", "out", "n"])
    return "relu_backward_16M", create_harness(snap.root, tmp / "h-relu", opt=binary).root


def cuda_cases(tmp: Path) -> list[tuple[str, Path]]:
    from kpair.snapshot import Launch
    from kpair.toolchain import compile_cubin

    arch, elementwise, gemm = cuda_test_kernels(tmp)
    rng = np.random.default_rng(0)
    out = []
    n = 8 << 20
    snap = record_axpy(elementwise, tmp / "axpy", n, rng)
    out.append(("axpy_8M", create_harness(snap.root, tmp / "h-axpy", opt=elementwise).root))
    m = 1024
    snap = record_gemm(gemm, tmp / "gemm", m, rng)
    policy = Policy(mutations=(Mutation("A", "float32", "permute", 2),))
    out.append(("gemm_tiled_1024", create_harness(snap.root, tmp / "h-gemm", opt=gemm,
                                                  policy=policy).root))
    (tmp / "axpbyz.cu").write_text(AXPBYZ)
    three = compile_cubin(tmp / "axpbyz.cu", tmp / "axpbyz.cubin", arch=arch)
    n = 4 << 20                       # 4 Mi floats: 16 MiB per region
    x, y = rng.standard_normal(n, np.float32), rng.standard_normal(n, np.float32)
    z = np.zeros(n, np.float32)
    snap = record_call(three, "axpbyz", [x, y, z, np.float32(1.5), np.int32(n)],
                       tmp / "axpbyz", backend="cuda",
                       launch=Launch((n // 256, 1, 1), (256, 1, 1)),
                       names=["x", "y", "z", "a", "n"])
    out.append(("axpbyz_3x16M", create_harness(snap.root, tmp / "h-axpbyz", opt=three).root))
    return out + [relu_backward_case(tmp, elementwise, "cuda")]


#: Three 16 MiB regions: two inputs and one write-only output.
AXPBYZ = """extern "C" __global__ void axpbyz(const float* x, const float* y, float* z, float a,
                                   int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) z[i] = a * x[i] + y[i];
}
"""


def compare_speed(size: int = 16 << 20, calls: int = 20) -> dict:
    """GB/s of region bytes: compare on the device, fill check, and reading back."""
    import time

    def rate(fn) -> float:
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return round(size / statistics.median(times) / 1e9, 3)

    with open_device("cuda") as dev:
        base = dev.map([(0, size)], relocate=True).delta
        data = np.random.default_rng(0).integers(0, 256, size, np.uint8).tobytes()
        dev.write(base, data)
        held = dev.keep(base, size)
        assert dev.compare(base, size, held) == (0, None)
        return {"region_bytes": size, "in_place": dev.compares_in_place,
                "checks_in_place": dev.environment().get("checks_in_place"),
                "device_compare_gbps": rate(lambda: dev.compare(base, size, held)),
                "device_fill_check_gbps": rate(lambda: dev.check_fills([(base, size)], 7)),
                "read_back_gbps": rate(lambda: dev.read(base, size))}


def measure_case(harness: Path, blocks: int, repeat: int, seed: int) -> dict:
    out = {}
    for label, checks in (("with_checks", True), ("without_checks", False)):
        runs = []
        for i in range(repeat):
            r = run_isolated(harness, RunOptions(min_blocks=blocks, max_blocks=blocks,
                                                rel_ci=1e-9, time_cap_s=600.0, seed=seed + i,
                                                checks=checks, timeout_s=600)).to_json()
            if r["status"] != "pass":
                raise SystemExit(f"{harness}: {r['status']}: {r.get('correctness') or r}")
            runs.append(r)
        stages = sorted({k for r in runs for k in r["stage_s"]})
        out[label] = {
            "wall_s": statistics.median(r["wall_s"] for r in runs),
            "stage_s": {k: round(statistics.median(r["stage_s"].get(k, 0.0) for r in runs), 6)
                        for k in stages},
            "opt_median_us": statistics.median(r["speed"]["debug_only"]["opt_median_us"]
                                               for r in runs),
        }
        if checks:
            out["trust_checks_passed"] = sorted(k for k, v in runs[0]["trust"].items()
                                                if v["passed"] is True)
    on, off = out["with_checks"], out["without_checks"]
    extra = {k: round(on["stage_s"].get(k, 0.0) - off["stage_s"].get(k, 0.0), 6)
             for k in on["stage_s"]}
    out["overhead"] = {
        "wall_s": round(on["wall_s"] - off["wall_s"], 3),
        "wall_pct": round(100 * (on["wall_s"] / off["wall_s"] - 1), 1),
        "check_stages_s": round(sum(on["stage_s"].get(k, 0.0) for k in CHECK_STAGES), 6),
        "per_stage_s": extra,
    }
    out["checked_over_unchecked"] = round(on["wall_s"] / off["wall_s"], 3)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("host", "cuda"), default="host")
    p.add_argument("--blocks", type=int, default=32)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--case", action="append", default=[],
                   help="run only this case (repeatable; default: all of the backend's)")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kpair-trust-bench-") as tmp:
        tmp = Path(tmp)
        cases = host_cases(tmp) if args.backend == "host" else cuda_cases(tmp)
        if args.case:
            unknown = set(args.case) - {name for name, _ in cases}
            if unknown:
                raise SystemExit(f"unknown case(s) {sorted(unknown)}; known: "
                                 f"{', '.join(name for name, _ in cases)}")
            cases = [(name, h) for name, h in cases if name in args.case]
        with open_device(args.backend) as dev:
            env = dev.environment()
        result = {"benchmark": "trust_overhead", "backend": args.backend,
                  "device": env.get("device"), "blocks": args.blocks, "repeat": args.repeat,
                  "note": "medians over repeat runs of one isolated worker each; overhead = "
                          "with checks - without (RunOptions(checks=False))",
                  "cases": {name: measure_case(h, args.blocks, args.repeat, args.seed)
                            for name, h in cases}}
        if args.backend == "cuda":
            result["compare_speed"] = compare_speed()
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
