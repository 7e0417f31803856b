"""``kpair demo``: a small release built end to end from kernels shipped in this package.

For each operator of ``OPERATORS`` the demo compiles a naive (ref) and an optimized (opt)
build of one source (``csrc/<op>.c`` with the C compiler for the host backend, ``csrc/<op>.cu``
with nvcc for cuda; selected by ``-DKP_OPT=0/1``), records a real call of ref on random inputs
(``record_call``: the captured dispatch), times ref and opt itself with warm back-to-back
launches (its *Director* number, written to ``provenance/director_validation.json`` and
labelled reference only, like the seed's optimizer-side baseline), pairs them under the
operator's validation policy, and hands the harness to ``release add``, which verifies it in
its own process and publishes it only on a pass that is a real gain on this machine (its
speedup CI lies above 1.0; an operator that is not faster here is excluded with that reason).
Then it writes the report. One operator's opt is wrong on purpose, to show an exclusion.

Everything intermediate (builds, snapshots, harness sources) lives in a temporary directory;
``--out`` receives only the release. Sizes and the measurement budget keep the whole run
under a minute on a 2-core machine.
"""

from __future__ import annotations

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
from ..snapshot import Launch, Snapshot, sha256

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
    #: GPU launch geometry of ref (and opt's override), from the arguments; host: unused.
    launch: Callable[[list], Launch] = lambda args: Launch()
    opt_launch: Callable[[list], dict] = lambda args: {}
    #: Problem sizes for GPU backends, which need more work per launch to time it well.
    gpu_args: Callable[[np.random.Generator], tuple[list, list[str]]] | None = None


def _matmul(rng, n=256):
    return [_f32(rng, n, n), _f32(rng, n, n), np.zeros((n, n), np.float32), np.int32(n)], \
        ["a", "b", "c", "n"]


def _softmax(rng, rows=256, cols=1024):
    return [_f32(rng, rows, cols), np.zeros((rows, cols), np.float32), np.int32(rows),
            np.int32(cols)], ["x", "y", "rows", "cols"]


def _frobenius(rng, n=1 << 21):
    return [_f32(rng, n), np.zeros(1, np.float32), np.int64(n)], ["x", "out", "n"]


def _gemm_add_relu(rng, batch=128, k=256, n=256):
    return [_f32(rng, batch, k), _f32(rng, k, n), _f32(rng, n), np.zeros((batch, n), np.float32),
            np.int32(batch), np.int32(k), np.int32(n)], ["x", "w", "bias", "y", "batch", "k", "n"]


def _sigmoid(rng, n=(1 << 16) + 5):
    # n is not a multiple of 8: the wrong opt's missing remainder shows.
    return [_f32(rng, n), np.zeros(n, np.float32), np.int64(n)], ["x", "y", "n"]


def _tiles(rows: int, cols: int) -> Launch:
    return Launch((cols // 32, rows // 32, 1), (32, 32, 1))


OPERATORS: tuple[DemoOperator, ...] = (
    DemoOperator(1, "1_Square_matrix_multiplication_", "matmul", "kp_matmul", _matmul,
                 note="shared-memory tiles / loop reorder, same summation order: byte-exact",
                 launch=lambda a: _tiles(a[3].item(), a[3].item()),
                 gpu_args=lambda rng: _matmul(rng, 2048)),
    DemoOperator(1, "23_Softmax", "softmax", "kp_softmax", _softmax,
                 lambda a: (Tolerance("y", 0, a[1].nbytes, "float32", "cosine",
                                      min_cosine=0.9999),),
                 note="reassociated sums: cosine >= 0.9999",
                 launch=lambda a: Launch((-(-a[2].item() // 128), 1, 1), (128, 1, 1)),
                 opt_launch=lambda a: {"grid": [a[2].item(), 1, 1], "block": [256, 1, 1]},
                 gpu_args=lambda rng: _softmax(rng, 8192, 1024)),
    DemoOperator(1, "37_FrobeniusNorm_", "frobenius", "kp_frobenius", _frobenius,
                 lambda a: (Tolerance("out", 0, 4, "float32", "scalar_rtol", rtol=1e-6),),
                 note="blocked lanes, another summation order: scalar within rtol 1e-6",
                 launch=lambda a: Launch((1, 1, 1), (256, 1, 1)),
                 opt_launch=lambda a: {"block": [1024, 1, 1]},
                 gpu_args=lambda rng: _frobenius(rng, 1 << 22)),
    DemoOperator(1, "21_Sigmoid", "sigmoid", "kp_sigmoid", _sigmoid, expect="fail",
                 note="DELIBERATELY WRONG opt (drops the last n % 8 outputs): shows an "
                      "exclusion",
                 launch=lambda a: Launch((-(-a[2].item() // 256), 1, 1), (256, 1, 1)),
                 gpu_args=lambda rng: _sigmoid(rng, (1 << 22) + 5)),
    DemoOperator(2, "76_Gemm_Add_ReLU", "gemm_add_relu", "kp_gemm_add_relu", _gemm_add_relu,
                 note="GEMM + bias + ReLU fused into one pass: byte-exact",
                 launch=lambda a: _tiles(a[4].item(), a[6].item()),
                 gpu_args=lambda rng: _gemm_add_relu(rng, 2048, 2048, 2048)),
)

def _toolchain(backend: str) -> tuple[str, Callable]:
    """(source suffix, build(source, out_stem, defines) → code object) for ``backend``.

    GPU kernels are built for the architecture of the device that will run them, so the
    device is opened first: without a driver the demo stops before compiling anything."""
    from ..backends import open_device
    from ..toolchain import compile_cuda, compile_shared

    if backend == "host":
        return ".c", lambda src, out, defines: compile_shared(src, out.with_suffix(".so"),
                                                              defines=defines)
    if backend != "cuda":
        raise UsageError(f"the demo runs on host or cuda, not {backend!r}")
    with open_device(backend) as dev:
        arch = dev.arch()
    return ".cu", lambda src, out, defines: compile_cuda(src, out.with_suffix(".cubin"),
                                                         arch=arch, defines=defines)


@dataclass(frozen=True)
class DemoResult:
    root: Path
    index: Path
    report: dict
    rows: list
    wall_s: float
    as_expected: bool


def director_validation(snapshot: Path, ref: Path, opt: Path, symbol: str, backend: str,
                        launches: dict, *, calls: int = 15) -> dict:
    """The demo's own quick ref/opt timing: warm cache, no state restore, best of ``calls``
    back-to-back launches each, alternating, on the recorded dispatch. It is what an
    optimizer would report about itself; reference only. (The demo's kernels are pure
    functions of their inputs, so relaunching without a restore computes the same thing.)"""
    from ..backends import open_device
    from ..replay import Replay

    snap = Snapshot.open(snapshot)
    with open_device(backend) as dev:
        replay = Replay(dev, snap, cache="warm")
        dev.restore()
        kernels = {role: dev.load(path.read_bytes(), symbol, fmt=snap.manifest.code.format)
                   for role, path in (("ref", ref), ("opt", opt))}
        best = {"ref": float("inf"), "opt": float("inf")}
        for _ in range(calls):
            for role in ("ref", "opt"):
                t = dev.timed_launch(kernels[role], launches[role], replay.kernarg,
                                     replay.params)
                best[role] = min(best[role], t)
    return {"schema": "kpair.director_validation", "schema_version": 1,
            "speedup": best["ref"] / best["opt"], "reference_only": True,
            "method": f"kpair demo: best of {calls} back-to-back launches of ref and opt each, "
                      "warm cache, no state restore, no ABBA",
            "ref_best_us": best["ref"] * 1e6, "opt_best_us": best["opt"] * 1e6}


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out} exists and is not empty; the demo writes a fresh release "
                         "(choose another --out, nothing was written)")


def run_demo(out: str | os.PathLike = "kpair-demo", *, backend: str = "host",
             time_cap_s: float | None = None, operators: tuple[DemoOperator, ...] = OPERATORS,
             log: Callable[[str], None] = lambda s: print(s, flush=True)) -> DemoResult:
    """Build the demo release in ``out`` (absent or empty) and return where everything is."""
    from ..harness import create_harness
    from ..pipeline import RunOptions
    from ..record import record_call
    from ..release import INDEX, add_operator, load_index
    from ..report import write_report

    out = Path(out)
    _check_out(out)
    suffix, build = _toolchain(backend)
    cap = TIME_CAP_S if time_cap_s is None else time_cap_s
    started = time.monotonic()
    options = RunOptions(time_cap_s=cap, min_blocks=MIN_BLOCKS, timeout_s=60 + 4 * cap)
    rng = np.random.default_rng(20261202)
    rows = []
    log(f"kpair demo: building a release of {len(operators)} operators in {out} "
        f"({backend} backend, {cap:g} s of ABBA timing each)")
    with tempfile.TemporaryDirectory(prefix="kpair-demo-") as tmp:
        tmp = Path(tmp)
        for i, op in enumerate(operators, 1):
            key = f"level{op.level}/{op.name}"
            log(f"[{i}/{len(operators)}] {key}: {op.note}")
            work = tmp / f"level{op.level}-{op.name}"
            builds = {}
            source = resources.files(__package__) / "csrc" / (op.source + suffix)
            with resources.as_file(source) as src:
                for role, variant in (("ref", 0), ("opt", 1)):
                    builds[role] = build(src, work / role, {**op.defines, "KP_OPT": variant})
            make = op.gpu_args if backend != "host" and op.gpu_args else op.make_args
            args, names = make(rng)
            launch = op.launch(args) if backend != "host" else Launch()
            opt_launch = op.opt_launch(args) if backend != "host" else {}
            record_call(builds["ref"], op.symbol, args, work / "capture", names=names,
                        backend=backend, launch=launch, provenance={"demo_operator": key})
            prov = work / "provenance"
            prov.mkdir()
            director = director_validation(work / "capture", builds["ref"], builds["opt"],
                                           op.symbol, backend,
                                           {"ref": launch, "opt": launch.override(opt_launch)})
            (prov / "director_validation.json").write_text(json.dumps(director, indent=1))
            (prov / "attempts.jsonl").write_text("".join(
                json.dumps({"attempt": n, "role": role, "source": op.source + suffix,
                            "defines": {**op.defines, "KP_OPT": n}, "sha256":
                            sha256(builds[role].read_bytes())}) + "\n"
                for n, role in enumerate(("ref", "opt"))))
            harness = create_harness(work / "capture", work / "harness", ref=builds["ref"],
                                     opt=builds["opt"], policy=Policy(op.tolerances(args)),
                                     opt_launch=opt_launch or None,
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
    s = load_index(out).summary
    g, d = s.harness_geomean_speedup, s.director_geomean_speedup
    log(f"done in {wall:.1f} s: {s.counts.passed} operators published, "
        f"{s.counts.excluded} excluded")
    if g:
        log(f"  Harness geomean {g:.3f}x (recommended), Director geomean {d:.3f}x "
            "(reference only), slot_bias {:.4f} .. {:.4f}".format(*s.slot_bias_range))
    log(f"index:  {out / INDEX}")
    for kind, path in report.items():
        log(f"report: {path} ({kind})")
    log(f"re-check it: kpair verify {out}")
    # Correctness must come out as intended; speed is the machine's: a correct opt that is not
    # faster here is excluded with its reason, and that is not a failure of the demo.
    ok = all((added.result.status == "pass") == (op.expect == "pass") for op, added in rows)
    return DemoResult(out, out / INDEX, report, [a.row for _, a in rows], wall, ok)


def _outcome(added, op: DemoOperator) -> str:
    row = added.row
    if row.harness is not None:
        h = row.harness
        lo, hi = h.reported_ci95
        line = (f"{row.correctness.label}, {h.speedup:.3f}x [{lo:.3f}, {hi:.3f}], "
                f"slot_bias {h.slot_bias:.4f}")
        return f"published: {line}" if added.added else f"excluded: {line}; {row.reason}"
    tag = "excluded as intended" if op.expect != "pass" else "UNEXPECTEDLY refused"
    return f"{tag}: {row.status}: {row.reason}"
