"""Evaluation cost: candidates per minute in one session vs one ``kpair run`` per candidate.

    python benchmarks/session_throughput.py [--backend cuda|host] [--candidates 8]
                                            [--json out.json]

For a ~10 us and a ~100 us dispatch (cuda: axpy over 1M floats and a tiled 640^3 GEMM from
tests/cuda; host: a 24^3 and a 96^3 matmul), the same candidate list (the harness's own opt,
loaded anew each time) is judged two ways at the default stopping rule, trust checks and the
identical-binary control on: ``run_isolated`` per candidate (a new process, context and
placement each time), and one ``Session`` (setup once). Prints JSON: seconds per candidate
and candidates per minute for both, and their ratio. Goal (issue 12): a session >= 4x the
separate runs, and <= 0.5 s per candidate for the ~10 us kernel.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _bench import cuda_test_kernels, emit, record_axpy, record_gemm

ROOT = Path(__file__).resolve().parents[1]


def cases(backend: str, tmp: Path) -> list[tuple[str, Path]]:
    from kpair.harness import create_harness
    from kpair.record import record_call

    rng = np.random.default_rng(0)
    if backend == "host":
        from kpair.toolchain import compile_shared

        src = ROOT / "tests" / "csrc" / "matmul.c"
        ref = compile_shared(src, tmp / "naive.so", defines={"KP_VARIANT": 0})
        opt = compile_shared(src, tmp / "fast.so", defines={"KP_VARIANT": 1})
        out = []
        for n in (24, 96):
            a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
            snap = record_call(ref, "kp_matmul", [a, b, np.zeros((n, n), np.float32),
                                                  np.int32(n)], tmp / f"s{n}",
                               names=["a", "b", "c", "n"])
            out.append((f"matmul_n{n}", create_harness(snap.root, tmp / f"h{n}", opt=opt).root))
        return out
    _, axpy, gemm = cuda_test_kernels(tmp)
    n = 1 << 20
    snap = record_axpy(axpy, tmp / "axpy", n, rng)
    out = [("axpy_1M", create_harness(snap.root, tmp / "h-axpy", opt=axpy).root)]
    m = 640   # ~90 us on an H200
    snap = record_gemm(gemm, tmp / "gemm", m, rng)
    out.append((f"gemm_tiled_{m}", create_harness(snap.root, tmp / "h-gemm", opt=gemm).root))
    return out


def one_case(name: str, harness: Path, count: int, out: Path) -> dict:
    from kpair.harness import Harness
    from kpair.isolation import run_isolated
    from kpair.pipeline import RunOptions
    from kpair.session import Session

    h = Harness.open(harness)
    candidate = out / f"{name}-cand{Path(h.opt.binary).suffix}"
    candidate.write_bytes(h.binary(h.opt))
    row: dict = {"case": name}
    t0 = time.perf_counter()
    separate = [run_isolated(harness, RunOptions(), out=out / f"{name}-sep{i}.json")
                for i in range(count)]
    t_sep = time.perf_counter() - t0
    t0 = time.perf_counter()
    with Session(harness, RunOptions(), out=out / f"{name}-session") as s:
        results = [s.evaluate(candidate) for _ in range(count)]
        started = s.workers_started
    t_ses = time.perf_counter() - t0
    medians = [r.speed.debug_only.get("ref_median_us") for r in separate if r.speed]
    row.update({
        "kernel_median_us": float(np.median(medians)) if medians else None,
        "candidates": count, "statuses_separate": [r.status for r in separate],
        "statuses_session": [r.status for r in results], "session_workers": started,
        "not_passed": [{"how": how, "n": i, "status": r.status, "reason": r.reason}
                       for how, rs in (("separate", separate), ("session", results))
                       for i, r in enumerate(rs, 1) if r.status != "pass"],
        "separate_s_per_candidate": t_sep / count, "session_s_per_candidate": t_ses / count,
        "separate_per_min": 60 * count / t_sep, "session_per_min": 60 * count / t_ses,
        "session_speedup": t_sep / t_ses,
        "session_s_per_candidate_after_setup": (
            sum(r.wall_s for r in results[1:]) / max(1, count - 1)),
    })
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("cuda", "host"), default="cuda")
    p.add_argument("--candidates", type=int, default=8)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="kpair-tput-") as tmp:
        tmp = Path(tmp)
        rows = [one_case(name, h, args.candidates, tmp) for name, h in cases(args.backend, tmp)]
    emit({"backend": args.backend, "cases": rows}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
