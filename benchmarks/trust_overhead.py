"""What the trust checks cost on a verify run, printed as JSON.

For a few recorded dispatches it runs the same pair harness (isolated worker, as ``kpair run``
and ``kpair verify`` do) with the checks on and with ``RunOptions(checks=False)``
(``--no-checks``), at a fixed measurement budget (exactly ``--blocks`` ABBA blocks), and
reports the medians over ``--repeat`` runs of: the worker's wall time, and its per-stage
seconds (``result.json`` ``stage_s``). The checks' cost is the difference: their own stages
(``trust:poison``, ``trust:differential``, ``trust:timing``), the repeats in ``ref`` and
``opt``, and the untimed poison/canary writes around every ABBA launch in ``measure``.

    python benchmarks/trust_overhead.py [--backend host|cuda] [--blocks 32] [--repeat 3]
                                        [--case NAME ...] [--calls | --only-calls]
                                        [--out FILE.json]

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
``--calls`` (``--only-calls``: and no timed case) adds ``calls``: what each stage of a checked
and an unchecked run asks of the device, counted in-process on the host backend through a
proxy (``CountingDevice``): calls per method and the bytes each moves as the CUDA backend
moves them (host to device, device to host, on the device), for axpy_8M and axpbyz_3x16M
built for the host (``AXPY_C``) on the GPU's path (``compares_in_place``: held copies,
compares where the memory is) and axpy_8M on the host's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
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


#: The CUDA cases' shapes on the host: y = a*x + y over two 32 MiB regions at n = 8 Mi
#: (``axpy_8M``: y updated in place) and z = a*x + y over three 16 MiB ones at n = 4 Mi
#: (``axpbyz_3x16M``: z write-only).
AXPY_C = """#include <stdint.h>
void kp_axpy(const float *x, float *y, float a, int32_t n) {
    for (int32_t i = 0; i < n; i++) y[i] = a * x[i] + y[i];
}
void kp_axpbyz(const float *x, const float *y, float *z, float a, int32_t n) {
    for (int32_t i = 0; i < n; i++) z[i] = a * x[i] + y[i];
}
"""
#: Device methods counted by ``CountingDevice``, by what they move on a GPU (cuda.py): host to
#: device, device to host, or within the device (copies, compares, fills; bytes touched).
H2D = {"write": lambda a: len(a[1]), "stage": lambda a: len(a[1]),
       "hold": lambda a: len(a[0]),
       "patch": lambda a: sum(len(d) for _, d in a[0]),
       "scatter": lambda a: sum(len(p.data) + 32 * len(p.offsets) for _, p in a[0])}
D2H = {"read": lambda a: a[1], "fetch": lambda a: a[0].size}
ON_DEVICE = {"keep": lambda a: a[1], "put": lambda a: a[1].size,
             "compare": lambda a: 2 * a[1], "check_fills": lambda a: sum(n for _, n in a[0]),
             "fill": lambda a: a[1], "fill_many": lambda a: sum(n for _, n in a[0]),
             "intact": lambda a: a[0].size, "digest": lambda a: a[1]}
OTHER = ("launch", "timed_launch", "restore", "flush_cache", "synchronize", "drop")
ON_DEVICE["check_many"] = lambda a: sum(n for _, n in a[0]) + sum(2 * n for _, n, _ in a[2])
#: How often the CUDA backend waits for its stream in each call (cuda.py, _cuda_checks.py:
#: a synchronize, or a read of the check kernels' counters); the rest only enqueue work.
GPU_WAITS = {"write": 2, "stage": 2, "hold": 2, "read": 1, "fetch": 1, "keep": 1,
             "compare": 1, "check_fills": 1, "check_many": 1, "intact": 1, "digest": 1,
             "restore": 1, "flush_cache": 1, "timed_launch": 1, "launch": 1, "synchronize": 1}


class CountingDevice:
    """A Device, every call passed through, counted per stage (``current``, set by the
    pipeline's stage callback): calls per method and the bytes each moves as the CUDA backend
    moves them (``H2D``, ``D2H``, ``ON_DEVICE``). ``in_place``: what ``compares_in_place``
    says (True: the GPU's path, held copies and compares where the memory is, run on the
    host's read-based defaults)."""

    def __init__(self, inner, in_place: bool):
        self._inner, self._in_place, self.current = inner, in_place, "place"
        self.counts: dict[str, dict] = {}

    @property
    def compares_in_place(self) -> bool:
        return self._in_place

    def __getattr__(self, name: str):
        attr = getattr(self._inner, name)
        size = H2D.get(name) or D2H.get(name) or ON_DEVICE.get(name)
        if size is None and name not in OTHER:
            return attr
        kind = "h2d" if name in H2D else "d2h" if name in D2H else "device"

        def counted(*args, **kw):
            c = self.counts.setdefault(self.current, {"calls": {}, "h2d_bytes": 0,
                                                    "d2h_bytes": 0, "device_bytes": 0})
            c["calls"][name] = c["calls"].get(name, 0) + 1
            if size is not None:
                c[f"{kind}_bytes"] += int(size(args))
            t0 = time.perf_counter()
            try:
                return attr(*args, **kw)
            finally:
                c["device_s"] = round(c.get("device_s", 0.0) + time.perf_counter() - t0, 6)

        return counted


def count_calls(tmp: Path, case: str = "axpy_8M", *, in_place: bool = True, blocks: int = 32,
                seed: int = 1, profile: bool = False) -> dict:
    """Device calls and bytes moved per stage of one checked and one unchecked in-process run
    of ``case`` (``axpy_8M`` or ``axpbyz_3x16M``, an A/A pair of ``AXPY_C``, default policy:
    derived mutations) on the host backend, counted through ``CountingDevice``; ``profile``:
    a cProfile of each run in ``tmp``."""
    import kpair.pipeline as pipeline
    from kpair.pipeline import Facts, close, evaluate, own_candidate, prepare
    from kpair.toolchain import compile_shared

    tmp = Path(tempfile.mkdtemp(prefix=f"calls-{case}-", dir=tmp))
    src = tmp / "axpy.c"
    src.write_text(AXPY_C)
    lib = compile_shared(src, tmp / "axpy.so")
    rng = np.random.default_rng(0)
    if case == "axpy_8M":
        n = 8 << 20
        x, y = rng.standard_normal(n, np.float32), rng.standard_normal(n, np.float32)
        args, names = [x, y, np.float32(1.5), np.int32(n)], ["x", "y", "a", "n"]
    elif case == "axpbyz_3x16M":
        n = 4 << 20
        x, y = rng.standard_normal(n, np.float32), rng.standard_normal(n, np.float32)
        args = [x, y, np.zeros(n, np.float32), np.float32(1.5), np.int32(n)]
        names = ["x", "y", "z", "a", "n"]
    else:
        raise SystemExit(f"--calls: unknown case {case!r} (axpy_8M or axpbyz_3x16M)")
    snap = record_call(lib, "kp_" + case.split("_")[0], args, tmp / f"snap-{case}",
                       names=names)
    root = create_harness(snap.root, tmp / f"h-{case}-calls", opt=lib).root
    out = {"case": f"{case} on the host (kp_{case.split('_')[0]}, default policy)",
           "compares_in_place": in_place, "blocks": blocks}
    real = pipeline.open_device
    for label, checks in (("with_checks", True), ("without_checks", False)):
        dev: list[CountingDevice] = []

        def opening(*a, _dev=dev, **kw):
            _dev.append(CountingDevice(real(*a, **kw), in_place))
            return _dev[0]

        def stage(name: str, _dev=dev) -> None:
            if _dev:
                _dev[0].current = name

        options = RunOptions(min_blocks=blocks, max_blocks=blocks, rel_ci=1e-9,
                             time_cap_s=600.0, seed=seed, checks=checks, timeout_s=600)
        pipeline.open_device = opening
        prof = None
        if profile:
            import cProfile
            prof = cProfile.Profile()
            prof.enable()
        try:
            run, failed = prepare(root, options, facts=Facts(harness=str(root), started="now"),
                                  stage=stage)
            try:
                if failed is not None:
                    raise SystemExit(f"setup failed: {failed.to_json()}")
                result, _ = evaluate(run, own_candidate(run.harness), stage)
            finally:
                close(run)
        finally:
            pipeline.open_device = real
            if prof is not None:
                prof.disable()
                prof.dump_stats(str(tmp / f"profile-{label}.pstats"))
        r = result.to_json()
        if r["status"] != "pass":
            raise SystemExit(f"axpy calls: {r['status']}: {r.get('correctness') or r}")
        out[label] = {"stage_s": r["stage_s"], "total": _total(dev[0].counts)}
        if checks:   # the unchecked run's stages ask only restore, flush and timed launches
            out[label]["per_stage"] = dev[0].counts
    return out


def _total(counts: dict[str, dict]) -> dict:
    calls: dict[str, int] = {}
    for c in counts.values():
        for k, v in c["calls"].items():
            calls[k] = calls.get(k, 0) + v
    return {"calls": dict(sorted(calls.items())), "device_calls": sum(calls.values()),
            "gpu_waits": sum(GPU_WAITS.get(k, 0) * v for k, v in calls.items()),
            **{k: sum(c[k] for c in counts.values())
               for k in ("h2d_bytes", "d2h_bytes", "device_bytes")}}


def compare_speed(size: int = 16 << 20, calls: int = 20) -> dict:
    """GB/s of region bytes: compare on the device, fill check, and reading back."""
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
    p.add_argument("--calls", action="store_true",
                   help="also count device calls and bytes moved per stage (host backend, "
                        "in-process: axpy_8M and axpbyz_3x16M on the GPU's path, axpy_8M on "
                        "the host's), under \"calls\"")
    p.add_argument("--only-calls", action="store_true", help="--calls, and no timed case")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kpair-trust-bench-") as tmp:
        tmp = Path(tmp)
        cases = [] if args.only_calls else \
            host_cases(tmp) if args.backend == "host" else cuda_cases(tmp)
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
        if args.calls or args.only_calls:
            result["calls"] = {
                "note": "device calls per stage and the bytes each moves as the CUDA backend "
                        "moves them (h2d, d2h, on the device), counted in-process on the host "
                        "backend through CountingDevice; compares_in_place true: the GPU's "
                        "path (held copies, compares where the memory is) on the host's "
                        "read-based defaults; device_s: wall time inside device calls",
                "gpu_path": {case: count_calls(tmp, case, blocks=args.blocks, seed=args.seed)
                             for case in ("axpy_8M", "axpbyz_3x16M")},
                "host_path": {"axpy_8M": count_calls(tmp, "axpy_8M", in_place=False,
                                                     blocks=args.blocks, seed=args.seed)}}
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
