"""``kpair demo``: a small release built end to end from kernels shipped in this package.

For each operator of ``OPERATORS`` the demo compiles a naive (ref) and an optimized (opt)
build of one source (``csrc/<op>.c`` with the C compiler for the host backend, ``csrc/<op>.cu``
with nvcc for cuda; selected by ``-DKP_OPT=0/1``), records a real call of ref on random inputs
(``record_call``: the captured dispatch), pairs ref and opt under the operator's validation
policy, measures opt itself in a short evaluation session as ``kpair optimize`` does (its
*Director* number, a ``DirectorValidation`` in ``provenance/director_validation.json``
beside the session's ``attempts.jsonl``, labelled reference only, like the seed's
optimizer-side baseline), and hands the harness to ``release add``, which verifies it in its
own process and publishes it only on a pass that is a real gain on this machine (its
speedup interval lies above 1.0; an operator that is not faster here is excluded with that
reason, said plainly). Then it writes the report. One operator's opt is wrong on purpose, to
show an exclusion. The host builds' gains (about 2-7x) are chosen to stay clear of 1.0 when
the machine is busy; each operator's note says what its opt does on the backend that runs.

Everything intermediate (builds, snapshots, harness sources) lives in a temporary directory;
``--out`` receives only the release. Sizes and the measurement budget keep the whole run
under a minute on a 2-core machine.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from ..backends import open_device
from ..errors import BackendUnavailable, UsageError
from ..harness import create_harness
from ..optimize.director import DirectorValidation
from ..pipeline import RunOptions
from ..policy import Policy, Tolerance
from ..record import record_call
from ..release import INDEX, add_operator, load_index
from ..release.store import check_empty_release_dir
from ..report import write_report
from ..snapshot import Launch, sha256
from ..toolchain import compile_cuda, compile_shared

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
    #: the policy's ``max_bias`` (None: one machine epsilon) and why it is declared.
    max_bias: float | None = None
    policy_note: str = ""
    expect: str = "pass"
    #: What opt does differently and how it is judged: on the host (C) and on a GPU (CUDA).
    note: str = ""
    gpu_note: str = ""
    defines: dict = field(default_factory=dict)
    #: GPU launch geometry of ref (and opt's override), from the arguments; host: unused.
    launch: Callable[[list], Launch] = lambda args: Launch()
    opt_launch: Callable[[list], dict] = lambda args: {}
    #: Problem sizes for GPU backends, which need more work per launch to time it well.
    gpu_args: Callable[[np.random.Generator], tuple[list, list[str]]] | None = None

    def note_for(self, backend: str) -> str:
        return self.gpu_note if backend != "host" and self.gpu_note else self.note


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
                 note="4x8 register blocks of vector arithmetic, same summation order: "
                      "byte-exact",
                 gpu_note="32x32 shared-memory tiles, same summation order: byte-exact",
                 launch=lambda a: _tiles(a[3].item(), a[3].item()),
                 gpu_args=lambda rng: _matmul(rng, 2048)),
    DemoOperator(1, "23_Softmax", "softmax", "kp_softmax", _softmax,
                 lambda a: (Tolerance("y", 0, a[1].nbytes, "float32", "cosine",
                                      min_cosine=0.9999),),
                 note="expf once per element, sums over 8 accumulators (reassociated): "
                      "cosine >= 0.9999",
                 gpu_note="a block per row, tree reductions (reassociated sums): "
                          "cosine >= 0.9999",
                 launch=lambda a: Launch((-(-a[2].item() // 128), 1, 1), (128, 1, 1)),
                 opt_launch=lambda a: {"grid": [a[2].item(), 1, 1], "block": [256, 1, 1]},
                 gpu_args=lambda rng: _softmax(rng, 8192, 1024), max_bias=1e-6,
                 policy_note="ref sums each row serially, opt over 8 accumulators: the two "
                             "denominators differ by a relative error that scales a whole row "
                             "alike, 1.26e-7 seen on the host; 1e-6 allows it, a "
                             "scaled result of 2^-10 still fails bias"),
    DemoOperator(1, "37_FrobeniusNorm_", "frobenius", "kp_frobenius", _frobenius,
                 lambda a: (Tolerance("out", 0, 4, "float32", "scalar_rtol", rtol=1e-6),),
                 note="pairwise float32 sums in 16 lanes (another summation order): scalar "
                      "within rtol 1e-6",
                 gpu_note="1024 threads, warp-shuffle tree (another summation order): scalar "
                          "within rtol 1e-6",
                 launch=lambda a: Launch((1, 1, 1), (256, 1, 1)),
                 opt_launch=lambda a: {"block": [1024, 1, 1]},
                 gpu_args=lambda rng: _frobenius(rng, 1 << 22)),
    DemoOperator(1, "21_Sigmoid", "sigmoid", "kp_sigmoid", _sigmoid, expect="fail",
                 note="DELIBERATELY WRONG opt (drops the last n % 8 outputs): shows an "
                      "exclusion",
                 launch=lambda a: Launch((-(-a[2].item() // 256), 1, 1), (256, 1, 1)),
                 gpu_args=lambda rng: _sigmoid(rng, (1 << 22) + 5)),
    DemoOperator(2, "76_Gemm_Add_ReLU", "gemm_add_relu", "kp_gemm_add_relu", _gemm_add_relu,
                 note="GEMM + bias + ReLU fused into one pass per row: byte-exact",
                 gpu_note="shared-memory tiles, bias and ReLU fused into the epilogue: "
                          "byte-exact",
                 launch=lambda a: _tiles(a[4].item(), a[6].item()),
                 gpu_args=lambda rng: _gemm_add_relu(rng, 2048, 2048, 2048)),
)

def _toolchain(backend: str) -> tuple[str, Callable]:
    """(source suffix, build(source, out_stem, defines) → code object) for ``backend``.

    GPU kernels are built for the architecture of the device that will run them, so the
    device is opened first: without a driver the demo stops before compiling anything."""

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


#: The Director's own measurement: short, one ABBA run, no identical-binary control and no
#: trust checks (those are the Harness verdict's business).
DIRECTOR_TIME_CAP_S = 0.5


def director_validation(harness: Path, opt: Path, provenance: Path, *,
                        launch_override: dict | None = None,
                        time_cap_s: float = DIRECTOR_TIME_CAP_S, timeout_s: float = 120.0):
    """The demo's optimizer-side number, as ``kpair optimize`` makes its own: opt judged
    against ref in one evaluation session (``provenance`` receives its ``attempts.jsonl``
    and result), one short ABBA measurement. Reference only: the Harness number is
    ``release add``'s full run. Returns the ``DirectorValidation`` (None if opt did not
    pass, in which case no Director number is written)."""
    from ..session import Session

    options = RunOptions(time_cap_s=time_cap_s, min_blocks=MIN_BLOCKS, replicates=1,
                         control=False, checks=False, timeout_s=timeout_s)
    with Session(harness, options, out=provenance) as session:
        result = session.evaluate(opt, launch_override=launch_override,
                                  label="opt (KP_OPT=1)", strategy="demo",
                                  params={"KP_OPT": 1})
    if result.status != "pass" or result.speed is None:
        return None
    s = result.speed
    return DirectorValidation(
        speedup=s.speedup, ci95=s.ci95, slot_bias=s.slot_bias, blocks=s.blocks,
        stopped_by=s.stopped_by, options=options.to_json(),
        method="kpair demo: opt against ref in one evaluation session (same placed regions, "
               "cold cache, one short ABBA run, no identical-binary control, no trust "
               "checks); reference only",
        candidate_sha256=sha256(opt.read_bytes()), label="opt (KP_OPT=1)", strategy="demo",
        params={"KP_OPT": 1}, attempt=1, candidates=1)


def _check_out(out: Path) -> None:
    """A new or empty folder; one holding only the lock of an interrupted demo is empty."""

    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} exists and is not a directory; the demo writes a fresh "
                         "release (choose another --out, nothing was written)")
    check_empty_release_dir(out)


def run_demo(out: str | os.PathLike = "kpair-demo", *, backend: str = "host",
             time_cap_s: float | None = None, operators: tuple[DemoOperator, ...] = OPERATORS,
             log: Callable[[str], None] = lambda s: print(s, flush=True)) -> DemoResult:
    """Build the demo release in ``out`` (absent or empty) and return where everything is."""

    out = Path(out)
    _check_out(out)
    suffix, build = _toolchain(backend)
    cap = TIME_CAP_S if time_cap_s is None else time_cap_s
    started = time.monotonic()
    # The worker's limit covers setup and every check: the CUDA softmax (32 MiB under a
    # cosine policy, every timed launch judged on the host) ran 70 s on an H100.
    options = RunOptions(time_cap_s=cap, min_blocks=MIN_BLOCKS, timeout_s=120 + 4 * cap)
    rng = np.random.default_rng(20261202)
    rows = []
    log(f"kpair demo: building a release of {len(operators)} operators in {out} "
        f"({backend} backend, {cap:g} s of ABBA timing each)")
    with tempfile.TemporaryDirectory(prefix="kpair-demo-") as tmp:
        tmp = Path(tmp)
        for i, op in enumerate(operators, 1):
            key = f"level{op.level}/{op.name}"
            log(f"[{i}/{len(operators)}] {key}: {op.note_for(backend)}")
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
            policy = Policy(op.tolerances(args), op.policy_note, max_bias=op.max_bias)
            harness = create_harness(work / "capture", work / "harness", ref=builds["ref"],
                                     opt=builds["opt"], policy=policy,
                                     opt_launch=opt_launch or None,
                                     measure={"time_cap_s": cap, "min_blocks": MIN_BLOCKS})
            prov = work / "provenance"
            director = director_validation(harness.root, builds["opt"], prov,
                                           launch_override=opt_launch or None,
                                           timeout_s=options.timeout_s)
            if director is not None:
                director.write(prov / "director_validation.json")
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
        if added.added:
            return f"published: {line}"
        return (f"excluded: {line}; {row.reason}\n      (correct, but its interval on this "
                "machine reaches 1.0: a busy or throttled machine widens it; the operator is "
                "out of this release, not wrong)")
    tag = "excluded as intended" if op.expect != "pass" else "UNEXPECTEDLY refused"
    return f"{tag}: {row.status}: {row.reason}"
