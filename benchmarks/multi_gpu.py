"""Many GPUs of one host: ``kpair verify`` and an evaluation batch on one GPU and on all.

    python benchmarks/multi_gpu.py [--backend cuda|host] [--harnesses 8] [--candidates 16]
                                   [--workers N (host)] [--json out.json]

Builds a release of ``--harnesses`` CUDA harnesses (>= 8; from tests/cuda with record_call,
as benchmarks/session_throughput.py does: gemm_naive against gemm_tiled at several sizes, and
axpy against itself), then times

- ``kpair verify REL --gpus 0`` and ``kpair verify REL --gpus all`` (``--fresh`` each time):
  the throughput ratio (goal on two GPUs: >= 1.8x), and whether every verdict is the same;
- ``kpair verify REL --gpus all --each``: every harness on every GPU, the per-GPU speedups of
  each operator with their intervals, and whether they agree (all intervals overlap);
- an evaluation batch (``--candidates`` copies of the tiled GEMM on the 512^3 harness) with
  one session on GPU 0 and one session per GPU.

Prints JSON. ``--backend host --workers N`` runs the same on the CPU (worker slots instead of
GPUs) to check the script; its ratios say nothing about GPUs.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _bench import cuda_test_kernels, emit, record_axpy, record_gemm

ROOT = Path(__file__).resolve().parents[1]


def build(backend: str, count: int, tmp: Path) -> tuple[Path, Path, Path]:
    """A release of ``count`` harnesses; the evaluation harness and its candidate."""
    from kpair.harness import create_harness
    from kpair.record import record_call

    rng = np.random.default_rng(0)
    rel = tmp / "rel"
    made: list[Path] = []
    if backend == "host":
        from kpair.toolchain import compile_shared

        src = ROOT / "tests" / "csrc" / "matmul.c"
        ref = compile_shared(src, tmp / "naive.so", defines={"KP_VARIANT": 0})
        opt = compile_shared(src, tmp / "fast.so", defines={"KP_VARIANT": 1})
        for i in range(count):
            n = 32 + 16 * i
            a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
            snap = record_call(ref, "kp_matmul", [a, b, np.zeros((n, n), np.float32),
                                                  np.int32(n)], tmp / f"s{i}",
                               names=["a", "b", "c", "n"])
            h = create_harness(snap.root, rel / "level1" / f"{i + 1}_matmul_{n}" / "harness",
                               opt=opt).root
            made.append(h)
        return rel, made[min(2, count - 1)], opt
    _, axpy, gemm = cuda_test_kernels(tmp)
    sizes = [256, 384, 512, 640, 768, 896, 1024, 1280, 1536, 2048][:max(1, count - 2)]
    eval_harness = None
    for i, m in enumerate(sizes):
        snap = record_gemm(gemm, tmp / f"gemm{m}", m, rng, kernel="gemm_naive")
        h = create_harness(snap.root, rel / "level1" / f"{i + 1}_gemm_{m}" / "harness",
                           ref=gemm, ref_kernel="gemm_naive", opt=gemm,
                           opt_kernel="gemm_tiled").root
        if m == 512:
            eval_harness = h
    for j, n in enumerate((1 << 20, 1 << 22)[:max(0, count - len(sizes))]):
        snap = record_axpy(axpy, tmp / f"axpy{n}", n, rng)
        create_harness(snap.root, rel / "level2" / f"{j + 1}_axpy_{n}" / "harness", opt=axpy)
    return rel, eval_harness or h, gemm


def pool_args(backend: str, which: str, workers: int) -> list[str]:
    if backend == "host":
        return ["--workers", "1" if which == "one" else str(workers)]
    return ["--gpus", "0" if which == "one" else "all"]


def timed_verify(rel: Path, extra: list[str]) -> tuple[float, dict]:
    from kpair.cli import main as kpair
    from kpair.release import load_index

    t0 = time.perf_counter()
    code = kpair(["verify", str(rel), "--fresh", *extra])
    took = time.perf_counter() - t0
    index = load_index(rel)
    return took, {"exit": code, "verdicts": {r.rel: r.status for r in index.operators},
                  "index": index}


def overlap(intervals: list[tuple[float, float]]) -> bool:
    return max(lo for lo, _ in intervals) <= min(hi for _, hi in intervals)


def evaluation(backend: str, harness: Path, candidate: Path, count: int, devices: tuple,
               out: Path) -> dict:
    from kpair.pipeline import RunOptions
    from kpair.scale.evaluate import evaluate_on

    kernel = "gemm_tiled" if backend == "cuda" else None
    requests = [{"binary": str(candidate), "kernel": kernel} for _ in range(count)]
    t0 = time.perf_counter()
    done = list(evaluate_on(harness, requests, RunOptions(), devices, out))
    took = time.perf_counter() - t0
    return {"devices": list(devices), "seconds": took, "per_min": 60 * count / took,
            "statuses": sorted({e.result.status if e.result else "error" for e in done}),
            "by_device": {str(d): sum(e.device == d for e in done) for d in devices}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("cuda", "host"), default="cuda")
    p.add_argument("--harnesses", type=int, default=8)
    p.add_argument("--candidates", type=int, default=16)
    p.add_argument("--workers", type=int, default=2, help="host: worker slots for 'all'")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    from kpair.scale import resolve_devices

    every = resolve_devices(args.backend, "all") if args.backend != "host" else \
        resolve_devices("host", workers=args.workers)
    report: dict = {"backend": args.backend, "devices": list(every),
                    "harnesses": args.harnesses}
    with tempfile.TemporaryDirectory(prefix="kpair-multi-") as tmp:
        tmp = Path(tmp)
        rel, eval_h, candidate = build(args.backend, args.harnesses, tmp)
        t_one, one = timed_verify(rel, pool_args(args.backend, "one", args.workers))
        t_all, every_run = timed_verify(rel, pool_args(args.backend, "all", args.workers))
        report["verify"] = {
            "one_s": t_one, "all_s": t_all, "throughput_ratio": t_one / t_all,
            "same_verdicts": one["verdicts"] == every_run["verdicts"],
            "verdicts": every_run["verdicts"]}
        if len(every) > 1:
            _, each = timed_verify(rel, [*pool_args(args.backend, "all", args.workers),
                                         "--each"])
            per_op = {}
            for r in each["index"].operators:
                runs = {str(d.device_index): {"status": d.status, "speedup": d.speedup,
                                              "ci95": d.combined_ci95 or d.ci95}
                        for d in r.per_device or []}
                cis = [tuple(v["ci95"]) for v in runs.values() if v["ci95"]]
                per_op[r.rel] = {"status": r.status, "per_device": runs,
                                 "intervals_agree": overlap(cis) if len(cis) > 1 else None}
            report["per_device"] = per_op
            report["all_agree"] = all(v["intervals_agree"] is not False
                                      for v in per_op.values())
        shutil.rmtree(tmp / "ev1", ignore_errors=True)
        one_ev = evaluation(args.backend, eval_h, candidate, args.candidates, every[:1],
                            tmp / "ev1")
        all_ev = evaluation(args.backend, eval_h, candidate, args.candidates, every,
                            tmp / "evN")
        report["evaluate"] = {"one": one_ev, "all": all_ev,
                              "throughput_ratio": one_ev["seconds"] / all_ev["seconds"]}
    emit(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
