"""``kpair demo``: a small release built end to end from C kernels shipped in this package.

For each operator of ``OPERATORS`` the demo compiles a naive (ref) and an optimized (opt)
build of one C source (``csrc/<op>.c``, selected by ``-DKP_OPT=0/1``), records a real call of
ref on random inputs (``record_call``: the captured dispatch), times ref and opt itself with
direct in-process calls (its *Director* number, written to ``provenance/
director_validation.json`` and labelled reference only, like the seed's optimizer-side
baseline), pairs them under the operator's validation policy, and hands the harness to
``release add``, which verifies it in its own process and publishes it only on a pass.
Then it writes the report. One operator's opt is wrong on purpose, to show an exclusion.

Everything intermediate (builds, snapshots, harness sources) lives in a temporary directory;
``--out`` receives only the release. Sizes and the measurement budget keep the whole run
under a minute on a 2-core machine.
"""

from __future__ import annotations

import ctypes
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from ..errors import BackendUnavailable, UsageError
from ..policy import Policy, Tolerance
from ..snapshot import sha256

#: Seconds of ABBA measurement per operator, and the blocks it must reach first if it can.
TIME_CAP_S = 2.5
MIN_BLOCKS = 16


def _f32(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32)


@dataclass(frozen=True)
class DemoOperator:
    """One demo operator: where its C source is, how to make its arguments, how to judge it."""

    level: int
    name: str
    source: str
    symbol: str
    #: (args in call order, their names) for one call; arrays become captured regions.
    make_args: Callable[[np.random.Generator], tuple[list, list[str]]]
    #: declared tolerances for the policy, from the arguments; none: byte-exact.
    tolerances: Callable[[list], tuple[Tolerance, ...]] = lambda args: ()
    expect: str = "pass"
    note: str = ""
    defines: dict = field(default_factory=dict)


def _matmul(rng):
    n = 256
    return [_f32(rng, n, n), _f32(rng, n, n), np.zeros((n, n), np.float32), np.int32(n)], \
        ["a", "b", "c", "n"]


def _softmax(rng):
    rows, cols = 256, 1024
    return [_f32(rng, rows, cols), np.zeros((rows, cols), np.float32), np.int32(rows),
            np.int32(cols)], ["x", "y", "rows", "cols"]


def _frobenius(rng):
    n = 1 << 21
    return [_f32(rng, n), np.zeros(1, np.float32), np.int64(n)], ["x", "out", "n"]


def _gemm_add_relu(rng):
    batch, k, n = 128, 256, 256
    return [_f32(rng, batch, k), _f32(rng, k, n), _f32(rng, n), np.zeros((batch, n), np.float32),
            np.int32(batch), np.int32(k), np.int32(n)], ["x", "w", "bias", "y", "batch", "k", "n"]


def _sigmoid(rng):
    n = (1 << 16) + 5  # not a multiple of 8: the wrong opt's missing remainder loop shows
    return [_f32(rng, n), np.zeros(n, np.float32), np.int64(n)], ["x", "y", "n"]


OPERATORS: tuple[DemoOperator, ...] = (
    DemoOperator(1, "1_Square_matrix_multiplication_", "matmul.c", "kp_matmul", _matmul,
                 note="loop reorder, same summation order: byte-exact"),
    DemoOperator(1, "23_Softmax", "softmax.c", "kp_softmax", _softmax,
                 lambda a: (Tolerance("y", 0, a[1].nbytes, "float32", "cosine",
                                      min_cosine=0.9999),),
                 note="one expf per element, reassociated sum: cosine >= 0.9999"),
    DemoOperator(1, "37_FrobeniusNorm_", "frobenius.c", "kp_frobenius", _frobenius,
                 lambda a: (Tolerance("out", 0, 4, "float32", "scalar_rtol", rtol=1e-6),),
                 note="blocked float32 lanes: scalar within rtol 1e-6"),
    DemoOperator(1, "21_Sigmoid", "sigmoid.c", "kp_sigmoid", _sigmoid, expect="fail",
                 note="DELIBERATELY WRONG opt (drops the last n % 8 outputs): shows an "
                      "exclusion"),
    DemoOperator(2, "76_Gemm_Add_ReLU", "gemm_add_relu.c", "kp_gemm_add_relu", _gemm_add_relu,
                 note="GEMM + bias + ReLU fused into one pass: byte-exact"),
)


@dataclass(frozen=True)
class DemoResult:
    root: Path
    index: Path
    report: dict
    rows: list
    wall_s: float
    as_expected: bool


_CTYPES = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.int64): ctypes.c_int64,
           np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double}


def _direct_call(library: Path, symbol: str, args: list) -> Callable[[], float]:
    """A zero-argument timer of one direct call of ``symbol`` on ``args`` (seconds)."""
    fn = getattr(ctypes.CDLL(str(library), mode=os.RTLD_LOCAL), symbol)
    fn.restype = None
    cargs = [ctypes.c_void_p(a.ctypes.data) if isinstance(a, np.ndarray)
             else _CTYPES[np.asarray(a).dtype](a.item()) for a in args]

    def call() -> float:
        t0 = time.perf_counter_ns()
        fn(*cargs)
        return (time.perf_counter_ns() - t0) * 1e-9

    return call


def director_validation(ref: Path, opt: Path, symbol: str, args: list, *,
                        calls: int = 15) -> dict:
    """The demo's own quick ref/opt timing: warm cache, best of ``calls`` direct calls each,
    alternating. It is what an optimizer would report about itself; reference only."""
    work = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    t_ref, t_opt = _direct_call(ref, symbol, work), _direct_call(opt, symbol, work)
    best_ref = best_opt = float("inf")
    for _ in range(calls):
        best_ref, best_opt = min(best_ref, t_ref()), min(best_opt, t_opt())
    return {"schema": "kpair.director_validation", "schema_version": 1,
            "speedup": best_ref / best_opt, "reference_only": True,
            "method": f"kpair demo: best of {calls} direct in-process calls of ref and opt each "
                      "(ctypes), warm cache, on the demo's own arrays; not the captured "
                      "dispatch, no state restore, no ABBA",
            "ref_best_us": best_ref * 1e6, "opt_best_us": best_opt * 1e6}


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out} exists and is not empty; the demo writes a fresh release "
                         "(choose another --out, nothing was written)")


def run_demo(out: str | os.PathLike = "kpair-demo", *, backend: str = "host",
             time_cap_s: float | None = None, operators: tuple[DemoOperator, ...] = OPERATORS,
             log: Callable[[str], None] = lambda s: print(s, flush=True)) -> DemoResult:
    """Build the demo release in ``out`` (absent or empty) and return where everything is."""
    from ..harness import create_harness
    from ..record import record_call
    from ..release import INDEX, add_operator
    from ..report import write_report
    from ..run import RunOptions
    from ..toolchain import compile_shared

    if backend != "host":
        raise BackendUnavailable(f"kpair demo --backend {backend} is not available yet: the "
                                 "demo ships host C kernels only; run it with --backend host")
    out = Path(out)
    _check_out(out)
    cap = TIME_CAP_S if time_cap_s is None else time_cap_s
    started = time.monotonic()
    options = RunOptions(time_cap_s=cap, min_blocks=MIN_BLOCKS, timeout_s=60 + 4 * cap)
    rng = np.random.default_rng(20261202)
    rows = []
    log(f"kpair demo: building a release of {len(operators)} operators in {out} "
        f"(host backend, {cap:g} s of ABBA timing each)")
    with tempfile.TemporaryDirectory(prefix="kpair-demo-") as tmp:
        tmp = Path(tmp)
        for i, op in enumerate(operators, 1):
            key = f"level{op.level}/{op.name}"
            log(f"[{i}/{len(operators)}] {key}: {op.note}")
            work = tmp / f"level{op.level}-{op.name}"
            builds = {}
            with resources.as_file(resources.files(__package__) / "csrc" / op.source) as src:
                for role, variant in (("ref", 0), ("opt", 1)):
                    builds[role] = compile_shared(src, work / f"{role}.so",
                                                  defines={**op.defines, "KP_OPT": variant})
            args, names = op.make_args(rng)
            record_call(builds["ref"], op.symbol, args, work / "capture", names=names,
                        provenance={"demo_operator": key})
            prov = work / "provenance"
            prov.mkdir()
            director = director_validation(builds["ref"], builds["opt"], op.symbol, args)
            (prov / "director_validation.json").write_text(json.dumps(director, indent=1))
            (prov / "attempts.jsonl").write_text("".join(
                json.dumps({"attempt": n, "role": role, "source": op.source,
                            "defines": {**op.defines, "KP_OPT": n}, "sha256":
                            sha256(builds[role].read_bytes())}) + "\n"
                for n, role in enumerate(("ref", "opt"))))
            harness = create_harness(work / "capture", work / "harness", ref=builds["ref"],
                                     opt=builds["opt"], policy=Policy(op.tolerances(args)),
                                     measure={"time_cap_s": cap, "min_blocks": MIN_BLOCKS})
            added = add_operator(out, harness.root, level=op.level, name=op.name,
                                 provenance=prov, options=options)
            rows.append((op, added))
            log(f"      {_outcome(added, op)}")
    try:
        report = write_report(out)
    except BackendUnavailable as e:
        report = write_report(out, html_page=False)
        log(f"HTML report skipped ({e}); markdown written")
    wall = time.monotonic() - started
    s = json.loads((out / INDEX).read_text())["summary"]
    g, d = s["harness_geomean_speedup"], s["director_geomean_speedup"]
    log(f"done in {wall:.1f} s: {s['counts']['pass']} operators published, "
        f"{s['counts']['excluded']} excluded")
    if g:
        log(f"  Harness geomean {g:.3f}x (recommended), Director geomean {d:.3f}x "
            "(reference only), slot_bias {:.4f} .. {:.4f}".format(*s["slot_bias_range"]))
    log(f"index:  {out / INDEX}")
    for kind, path in report.items():
        log(f"report: {path} ({kind})")
    log(f"re-check it: kpair verify {out}")
    ok = all(added.added == (op.expect == "pass") for op, added in rows)
    return DemoResult(out, out / INDEX, report, [a.row for _, a in rows], wall, ok)


def _outcome(added, op: DemoOperator) -> str:
    row = added.row
    if added.added:
        h = row["harness"]
        lo, hi = h["ci95"]
        return (f"published: {row['correctness']['label']}, {h['speedup']:.3f}x "
                f"[{lo:.3f}, {hi:.3f}], slot_bias {h['slot_bias']:.4f}")
    tag = "excluded as intended" if op.expect != "pass" else "UNEXPECTEDLY refused"
    return f"{tag}: {row['status']}: {row['reason']}"
