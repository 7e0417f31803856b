"""KernelBench Level 1 library kernels replaced through launch plans: each problem's eager
forward (cuBLAS gemm, ATen elementwise, softmax and reduction kernels) captured as a range
(ref), against a hand-written Triton kernel with its own signature (opt), launched by a plan
(``opt.plan.json``) whose parameters are bound to the range's regions and to typed scalars.

    python benchmarks/kernelbench_plans.py run --kernelbench PATH -o OUT [--budget-mib 64]
        [--only KEY,KEY] [--count N] [--deadline S] [--time-cap S] [--atol 1e-2] [--rtol 1e-2]
        [--runs 2] [--jobs N] [--timed-batch N] [--work DIR] [--keep]

``PATH`` is a copy of the public KernelBench repository (never committed; nothing of it
reaches OUT). ``PROBLEMS`` is the table: per Level 1 problem a pure function of the
problem's tensors (shapes, strides, scalar inputs, model attributes) giving its Triton
launches (``benchmarks/kernelbench_kernels/kernels.py``): one for a gemm, a gemv or an
elementwise op; two for softmax and the dimension reductions (per-chunk partials into a
scratch buffer the plan declares, then combined); each parameter bound to an input tensor, the
output, the scratch buffer or a typed scalar (sizes, strides, a slope), with its constexprs,
grid and warps. Each problem is scaled (``kernelbench.scale_source``) until its
bytes by the CPU sizes probe fit ``--budget-mib`` (``kernelbench_ranges.choose_scale``).

Per problem one ``kpair capture --range p<n>`` runs this file's ``child`` in a fresh process
(the problems' captures ``--jobs`` at a time, scheduled by ``kb_pipeline`` as
``kernelbench_ranges.py`` does: the program takes the GPU gate after its imports). The child
makes the model and inputs on the GPU (seeded), runs the eager
forward twice uncaptured, then once inside ``kpair.mark("p<n>")`` declaring its output, and
writes to ``io.json`` each input's and the output's address, bytes, shape, stride and dtype
(and the scalar inputs and model attributes the launches need). It then compiles each
launch's Triton kernel for the device (``triton.compile`` of an ``ASTSource`` with an explicit
signature: the kernel's parameters are exactly the launch's, plus what Triton appends), keeps
the cubin, its kernel name, shared memory, warps, scratch sizes and its parameter layout as
kpair reads it (``kpair.harness.plan_layout``), and, outside the range, makes the launches
on a fresh output and compares it with the eager one (``self_check``: a diagnosis only).

The driver then, per problem: maps each tensor to the range's region holding it (by address:
region name and byte offset), writes ``opt.plan.json`` with the cubins beside it
(``k<i>.cubin``; Triton's trailing hidden parameters,
the global and profile scratch pointers, bound to a declared scratch buffer of the size the
kernel asks for, or to a u64 0 when it asks none), runs ``kpair pair SNAP --plan PLAN
--policy P`` (``allclose`` atol = rtol = 1e-2 on the range's live-out regions, read as
float32, ``kernelbench_ranges.output_policy``) and ``kpair run`` twice (the verdict, the
speedup, its re-run interval, and whether the second run lands inside the first's; a
second run only after a first that passed; ``--runs 1``: one), the timed runs one at a time
with the GPU to themselves (``--time-cap`` seconds a measurement, every trust check on).
Every problem's record is appended to ``OUT/results.jsonl`` as it is decided, with its
``breakdown`` (capture_s, import_s, gate_wait_s, setup_s, compile_s, pair_s, run_s,
rerun_s); a half-done problem's stages are kept in ``WORK/p<n>/state.json`` and a second call
goes on from its first missing stage. ``OUT/summary.json`` is rewritten after each,
``OUT/schedule.json`` written at the end. Exit status 0: every problem decided; 3: some left
for the next call.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import kb_pipeline  # noqa: E402  (the scheduler: jobs pool, timed stages alone, resume)
import kernelbench as kb  # noqa: E402  (the problem loader and scaler)
from kernelbench_ranges import (  # noqa: E402  (the Level 2 driver's helpers, shared)
    add_plan_parser,
    add_schedule_arguments,
    append,
    capture_child,
    choose_scale,
    done_keys,
    json_of,
    kpair_cmd,
    make_stages,
    open_call,
    output_policy,
    plan,
    program_stop,
    scaled_job,
    schedule,
    timed_run,
)

ROOT = HERE.parent
SIZES = ROOT / "benchmarks" / "results" / "kernelbench_sizes_cpu.json"
KERNELS = HERE / "kernelbench_kernels" / "kernels.py"
SCHEMA = "kpair.kernelbench-plans"
#: Triton (3.x) appends these pointer parameters to every kernel, in this order.
HIDDEN = ("global_scratch", "profile_scratch")
_I32 = (-(1 << 31), (1 << 31) - 1)


class PlanBuildError(Exception):
    """A problem whose plan cannot be written (a tensor outside the range, a layout that is
    not the launch's): its message goes into the problem's record."""


# --------------------------------------------------------------------------- launches

@dataclass(frozen=True)
class Spec:
    """One Triton launch: ``args`` in the kernel's parameter order, each ``("tensor", ref)``
    (``in0``, ``in1``..., ``out``), ``("scratch", name)`` (a float32 buffer the plan
    declares) or ``("scalar", kind, value)``; ``constexprs`` by name."""

    kernel: str
    args: tuple[tuple[str, tuple], ...]
    constexprs: dict[str, int | float]
    grid: tuple[int, int, int]
    num_warps: int = 4
    num_stages: int = 3


@dataclass(frozen=True)
class Launches:
    """Several launches in order, and the scratch buffers they pass between them (bytes by
    name)."""

    launches: tuple[Spec, ...]
    scratch: dict[str, int]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _chunk(total: int, chunks: int, block: int) -> int:
    """A chunk length (a multiple of ``block``) that cuts ``total`` into at most ``chunks``."""
    return max(block, _cdiv(_cdiv(total, chunks), block) * block)


def _int(value: int) -> tuple:
    """A size or stride as a typed scalar: i32 where it fits, else i64."""
    value = int(value)
    return ("scalar", "i32" if _I32[0] <= value <= _I32[1] else "i64", value)


def _contiguous(t: dict) -> bool:
    expect, stride = 1, []
    for d in reversed(t["shape"]):
        stride.append(expect)
        expect *= d
    return all(s == e or d == 1 for s, e, d in zip(t["stride"], reversed(stride), t["shape"],
                                                   strict=True))


def _numel(t: dict) -> int:
    return math.prod(t["shape"])


def _tensors(io: dict) -> list[dict]:
    return [t for t in io["inputs"] if t.get("kind") == "tensor"]


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise PlanBuildError(message)


def matmul_spec(io: dict, ta: bool = False, tb: bool = False) -> Spec:
    """``torch.matmul`` of two 2-D operands (``A.T`` / ``B.T`` taken as stride swaps)."""
    a, b = _tensors(io)[:2]
    c = io["output"]
    _need(len(a["shape"]) == len(b["shape"]) == len(c["shape"]) == 2,
          "the matmul kernel takes 2-D operands")
    (a0, a1), (sa0, sa1) = a["shape"], a["stride"]
    (b0, b1), (sb0, sb1) = b["shape"], b["stride"]
    m, k, sam, sak = (a1, a0, sa1, sa0) if ta else (a0, a1, sa0, sa1)
    kb_, n, sbk, sbn = (b1, b0, sb1, sb0) if tb else (b0, b1, sb0, sb1)
    _need(k == kb_ and c["shape"] == [m, n],
          f"shapes {a['shape']} x {b['shape']} -> {c['shape']} are not a ({m}x{k}) @ "
          f"({kb_}x{n}) product")
    bm, bn, bk = 64, 64, 32
    return Spec("kb_matmul",
                (("a_ptr", ("tensor", "in0")), ("b_ptr", ("tensor", "in1")),
                 ("c_ptr", ("tensor", "out")), ("M", _int(m)), ("N", _int(n)), ("K", _int(k)),
                 ("stride_am", _int(sam)), ("stride_ak", _int(sak)),
                 ("stride_bk", _int(sbk)), ("stride_bn", _int(sbn)),
                 ("stride_cm", _int(c["stride"][0])), ("stride_cn", _int(c["stride"][1]))),
                {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
                (_cdiv(m, bm) * _cdiv(n, bn), 1, 1), num_warps=4, num_stages=3)


def gemv_spec(io: dict) -> Spec:
    """``A @ x`` with x of shape (K, 1): one output per row."""
    a, x = _tensors(io)[:2]
    y = io["output"]
    _need(len(a["shape"]) == 2 and x["shape"][0] == a["shape"][1] and _numel(x) == a["shape"][1]
          and _numel(y) == a["shape"][0], f"{a['shape']} @ {x['shape']} is not a matrix-vector "
          "product")
    m, k = a["shape"]
    bm, bk = 4, 1024
    return Spec("kb_gemv",
                (("a_ptr", ("tensor", "in0")), ("x_ptr", ("tensor", "in1")),
                 ("y_ptr", ("tensor", "out")), ("M", _int(m)), ("K", _int(k)),
                 ("stride_am", _int(a["stride"][0])), ("stride_ak", _int(a["stride"][1])),
                 ("stride_x", _int(x["stride"][0])), ("stride_y", _int(y["stride"][0]))),
                {"BLOCK_M": bm, "BLOCK_K": bk}, (_cdiv(m, bm), 1, 1), num_warps=4,
                num_stages=2)


def elementwise_spec(kernel: str, scalar: Callable[[dict], float] | None = None):
    """y = f(x) over a contiguous tensor; ``scalar(io)``: an f32 parameter after ``n``."""
    def spec(io: dict) -> Spec:
        x, y = _tensors(io)[0], io["output"]
        _need(_contiguous(x) and _contiguous(y) and x["shape"] == y["shape"],
              f"{kernel} needs contiguous input and output of one shape")
        n, block = _numel(x), 1024
        args = [("x_ptr", ("tensor", "in0")), ("y_ptr", ("tensor", "out")), ("n", _int(n))]
        if scalar is not None:
            args.append((kernel_scalar[kernel], ("scalar", "f32", float(scalar(io)))))
        return Spec(kernel, tuple(args), {"BLOCK": block}, (_cdiv(n, block), 1, 1),
                    num_warps=4, num_stages=1)
    return spec


#: The name of an elementwise kernel's scalar parameter.
kernel_scalar = {"kb_leaky_relu": "slope", "kb_scale": "s"}


def softmax_spec(log: bool):
    """Softmax / log-softmax over the last dimension of a contiguous 2-D tensor, in two
    launches: per (row, chunk) the chunk's maximum and sum of exponentials into a scratch
    buffer, then per (row, chunk) the row's partials combined and the chunk written."""
    def spec(io: dict) -> Launches:
        x, y = _tensors(io)[0], io["output"]
        dim = io.get("attrs", {}).get("dim", 1)
        _need(len(x["shape"]) == 2 and dim in (1, -1) and _contiguous(x) and _contiguous(y),
              "the softmax kernel takes a contiguous 2-D tensor reduced over dim 1")
        rows, d = x["shape"]
        block = 1024
        chunk = _chunk(d, 64, block)
        chunks = _cdiv(d, chunk)
        cblock = max(16, 1 << (chunks - 1).bit_length())
        part = ("scratch", "softmax_partials")
        return Launches((
            Spec("kb_softmax_partial",
                 (("x_ptr", ("tensor", "in0")), ("part_ptr", part), ("D", _int(d)),
                  ("stride_x", _int(x["stride"][0])), ("CHUNK", _int(chunk))),
                 {"BLOCK": block}, (rows, chunks, 1), num_warps=4, num_stages=2),
            Spec("kb_softmax_finish",
                 (("x_ptr", ("tensor", "in0")), ("part_ptr", part), ("y_ptr", ("tensor", "out")),
                  ("D", _int(d)), ("stride_x", _int(x["stride"][0])),
                  ("stride_y", _int(y["stride"][0])), ("CHUNK", _int(chunk)),
                  ("NCHUNKS", _int(chunks))),
                 {"BLOCK": block, "CBLOCK": cblock, "LOG": int(log)}, (rows, chunks, 1),
                 num_warps=4, num_stages=2)),
            {part[1]: rows * chunks * 2 * 4})
    return spec


_REDUCE_OPS = {"sum": 0, "mean": 1, "max": 2, "min": 3}


def reduce_spec(op: str):
    """A sum/mean/max/min over dimension 1 of a 3-D tensor (keepdim or not), in two launches:
    per (batch, column block, row chunk) a partial into a scratch buffer, then per (batch,
    column block) the partials combined."""
    def spec(io: dict) -> Launches:
        x, y = _tensors(io)[0], io["output"]
        dim = io.get("attrs", {}).get("dim")
        _need(len(x["shape"]) == 3 and dim in (1, -2),
              f"the reduction kernel reduces dimension 1 of a 3-D tensor (dim={dim})")
        b, r, n = x["shape"]
        shape = [b, 1, n] if len(y["shape"]) == 3 else [b, n]
        _need(y["shape"] == shape, f"output {y['shape']} is not {shape}")
        bn, br = 64, 32
        rchunk = _chunk(r, 16, br)
        chunks = _cdiv(r, rchunk)
        part = ("scratch", "reduce_partials")
        return Launches((
            Spec("kb_reduce_mid_partial",
                 (("x_ptr", ("tensor", "in0")), ("part_ptr", part), ("R", _int(r)),
                  ("N", _int(n)), ("stride_xb", _int(x["stride"][0])),
                  ("stride_xr", _int(x["stride"][1])), ("stride_xn", _int(x["stride"][2])),
                  ("RCHUNK", _int(rchunk))),
                 {"BLOCK_R": br, "BLOCK_N": bn, "OP": _REDUCE_OPS[op]},
                 (b, _cdiv(n, bn), chunks), num_warps=4, num_stages=2),
            Spec("kb_reduce_mid_finish",
                 (("part_ptr", part), ("y_ptr", ("tensor", "out")), ("R", _int(r)),
                  ("N", _int(n)), ("NCHUNKS", _int(chunks)),
                  ("stride_yb", _int(y["stride"][0])), ("stride_yn", _int(y["stride"][-1]))),
                 {"BLOCK_N": bn, "OP": _REDUCE_OPS[op]}, (b, _cdiv(n, bn), 1),
                 num_warps=4, num_stages=1)),
            {part[1]: b * chunks * n * 4})
    return spec


def _first_scalar(io: dict) -> float:
    return next(t["value"] for t in io["inputs"] if t.get("kind") == "scalar")


@dataclass(frozen=True)
class Entry:
    """A Level 1 problem of the table: its file stem, the library kernel it replaces, the
    launch of its Triton kernel, and the model attributes that launch reads."""

    name: str
    replaces: str
    spec: Callable[[dict], Spec | Launches]
    attrs: tuple[str, ...] = ()
    extra: dict = field(default_factory=dict)

    @property
    def number(self) -> int:
        return int(self.name.split("_", 1)[0])

    @property
    def key(self) -> str:
        return f"level1/{self.name}"

    def launches(self, io: dict) -> Launches:
        """The problem's launches on ``io`` (one, or several with their scratch)."""
        got = self.spec(io)
        return got if isinstance(got, Launches) else Launches((got,), {})


#: Ordered so that any first N (``--count N``) mixes gemms, elementwise kernels, softmax and
#: reductions.
PROBLEMS: tuple[Entry, ...] = (
    Entry("1_Square_matrix_multiplication_", "cuBLAS gemm", matmul_spec),
    Entry("19_ReLU", "ATen relu", elementwise_spec("kb_relu")),
    Entry("23_Softmax", "ATen softmax", softmax_spec(log=False)),
    Entry("47_Sum_reduction_over_a_dimension", "ATen sum", reduce_spec("sum"), attrs=("dim",)),
    Entry("88_MinGPTNewGelu", "eight ATen elementwise kernels", elementwise_spec("kb_new_gelu")),
    Entry("17_Matmul_with_transposed_B", "cuBLAS gemm (B^T)",
          lambda io: matmul_spec(io, tb=True)),
    Entry("5_Matrix_scalar_multiplication", "ATen mul", elementwise_spec("kb_scale",
                                                                          _first_scalar)),
    Entry("20_LeakyReLU", "ATen leaky_relu",
          elementwise_spec("kb_leaky_relu", lambda io: io["attrs"]["negative_slope"]),
          attrs=("negative_slope",)),
    Entry("21_Sigmoid", "ATen sigmoid", elementwise_spec("kb_sigmoid")),
    Entry("49_Max_reduction_over_a_dimension", "ATen max", reduce_spec("max"), attrs=("dim",)),
    Entry("26_GELU_", "ATen gelu", elementwise_spec("kb_gelu")),
    Entry("2_Standard_matrix_multiplication_", "cuBLAS gemm", matmul_spec),
    Entry("22_Tanh", "ATen tanh", elementwise_spec("kb_tanh")),
    Entry("24_LogSoftmax", "ATen log_softmax", softmax_spec(log=True), attrs=("dim",)),
    Entry("48_Mean_reduction_over_a_dimension", "ATen mean", reduce_spec("mean"),
          attrs=("dim",)),
    Entry("16_Matmul_with_transposed_A", "cuBLAS gemm (A^T)",
          lambda io: matmul_spec(io, ta=True)),
    Entry("25_Swish", "ATen sigmoid + mul", elementwise_spec("kb_swish")),
    Entry("53_Min_reduction_over_a_dimension", "ATen min", reduce_spec("min"), attrs=("dim",)),
    Entry("4_Matrix_vector_multiplication_", "cuBLAS gemv", gemv_spec),
    Entry("18_Matmul_with_transposed_both", "cuBLAS gemm (A^T, B^T)",
          lambda io: matmul_spec(io, ta=True, tb=True)),
    Entry("8_Matmul_with_irregular_shapes_", "cuBLAS gemm", matmul_spec),
    Entry("7_Matmul_with_small_K_dimension_", "cuBLAS gemm", matmul_spec),
    Entry("9_Tall_skinny_matrix_multiplication_", "cuBLAS gemm", matmul_spec),
)
BY_NAME = {e.name: e for e in PROBLEMS}


def range_name(number: int) -> str:
    return f"p{number}"


# --------------------------------------------------------------------------- the plan

def _address(value) -> int:
    return int(value, 16) if isinstance(value, str) else int(value)


def region_of(regions: list[dict], ptr: int, nbytes: int, what: str) -> tuple[str, int]:
    """The region of the range that holds ``[ptr, ptr + nbytes)`` whole: its name and the
    byte offset of ``ptr`` in it."""
    for r in regions:
        lo = _address(r["address"])
        if lo <= ptr and ptr + nbytes <= lo + r["size"]:
            return r["name"], ptr - lo
    raise PlanBuildError(f"{what} ({nbytes} bytes at {ptr:#x}) lies inside no region of the "
                         "range")


def _tensor_of(io: dict, ref: str) -> dict:
    if ref == "out":
        return io["output"]
    return _tensors(io)[int(ref.removeprefix("in"))]


def _launch_args(i: int, spec: Spec, io: dict, regions: list[dict], kernel: dict,
                 scratch: dict[str, int], decl: list[dict], notes: list[str]) -> list[dict]:
    """Launch ``i``'s bindings: the launch's own, then Triton's hidden trailing pointers."""
    layout = kernel["layout"]
    args = []
    for param, bind in spec.args:
        if bind[0] == "tensor":
            t = _tensor_of(io, bind[1])
            name, offset = region_of(regions, int(t["data_ptr"]), int(t["nbytes"]),
                                     f"launch {i} {param} ({bind[1]})")
            args.append({"bind": "region", "name": name, "offset": offset,
                         "access": "write" if bind[1] == "out" else "read",
                         "bytes": int(t["nbytes"])})
            notes.append(f"{param} -> {name}+{offset} ({bind[1]}, {t['shape']})")
        elif bind[0] == "scratch":
            if bind[1] not in scratch:
                raise PlanBuildError(f"launch {i} {param}: scratch {bind[1]!r} is not declared")
            args.append({"bind": "scratch", "name": bind[1]})
            notes.append(f"{param} -> scratch {bind[1]} ({scratch[bind[1]]} bytes)")
        else:
            args.append({"bind": "scalar", "kind": bind[1], "value": bind[2]})
            notes.append(f"{param} = {bind[2]} ({bind[1]})")
    if layout is None:
        raise PlanBuildError(f"{kernel['name']}'s cubin records no parameter layout")
    extra = len(layout) - len(args)
    if not 0 <= extra <= len(HIDDEN):
        raise PlanBuildError(f"{kernel['name']} takes {len(layout)} parameters (its cubin), "
                             f"launch {i} has {len(args)} and Triton appends at most "
                             f"{len(HIDDEN)}")
    blocks = math.prod(spec.grid)
    for hidden, (_, size) in zip(HIDDEN, layout[len(args):], strict=False):
        if size != 8:
            raise PlanBuildError(f"{kernel['name']}'s {hidden} parameter is {size} bytes, "
                                 "not a pointer")
        per_block = int(kernel.get(f"{hidden}_size") or 0)
        if per_block:
            buf = f"triton_{hidden}_{i}"
            decl.append({"name": buf, "size": per_block * blocks,
                         "align": max(256, int(kernel.get(f"{hidden}_align") or 0))})
            args.append({"bind": "scratch", "name": buf})
            notes.append(f"{hidden} -> scratch {buf} ({per_block * blocks} bytes)")
        else:
            args.append({"bind": "scalar", "kind": "u64", "value": 0})
            notes.append(f"{hidden} = 0 (Triton's hidden pointer; the kernel asks none)")
    return args


def plan_for(work: Launches | Spec, io: dict, regions: list[dict],
             kernels: list[dict] | dict) -> dict:
    """``opt.plan.json`` for one problem: its Triton launches in order (``kernels[i]``: launch
    i's compiled kernel: ``name``, ``shared``, ``num_warps``, ``layout`` [[offset, size]...]
    as kpair reads the cubin, Triton's ``global_scratch_size``/``profile_scratch_size``; its
    code object is ``k<i>.cubin``), each tensor parameter bound to the region holding that
    tensor (read for inputs, write for the output), each scratch parameter to a buffer the
    plan declares, each scalar typed, Triton's trailing hidden pointers bound last."""
    if isinstance(work, Spec):
        work = Launches((work,), {})
    if isinstance(kernels, dict):
        kernels = [kernels]
    if len(kernels) != len(work.launches):
        raise PlanBuildError(f"{len(work.launches)} launches, {len(kernels)} kernels compiled")
    decl = [{"name": n, "size": size, "align": 256} for n, size in work.scratch.items()]
    launches, notes = [], []
    for i, (spec, kernel) in enumerate(zip(work.launches, kernels, strict=True)):
        mine: list[str] = []
        args = _launch_args(i, spec, io, regions, kernel, work.scratch, decl, mine)
        launches.append({"code": f"k{i}.cubin", "format": "cubin", "kernel": kernel["name"],
                         "grid": list(spec.grid), "block": [32 * int(kernel["num_warps"]), 1, 1],
                         "dynamic_shared_bytes": int(kernel["shared"]), "args": args})
        notes.append(f"{spec.kernel} (Triton): " + "; ".join(mine))
    plan = {"schema": "kpair.plan", "schema_version": 1, "launches": launches,
            "note": " | ".join(notes)}
    if decl:
        plan["scratch"] = decl
    return plan


def write_plan(dest: Path, work: Launches, io: dict, manifest: dict,
               kernels: list[dict]) -> Path:
    """The plan and its cubins in ``dest``; the plan's path."""
    dest.mkdir(parents=True, exist_ok=True)
    plan = plan_for(work, io, list(manifest["regions"]), kernels)
    for i, kernel in enumerate(kernels):
        shutil.copyfile(kernel["cubin"], dest / f"k{i}.cubin")
    path = dest / "opt.plan.json"
    path.write_text(json.dumps(plan, indent=1))
    return path


# --------------------------------------------------------------------------- the child

def _describe(t, torch) -> dict:
    if isinstance(t, torch.Tensor):
        return {"kind": "tensor", "data_ptr": int(t.data_ptr()), "nbytes": int(t.nbytes),
                "shape": list(t.shape), "stride": list(t.stride()),
                "dtype": str(t.dtype).removeprefix("torch.")}
    if isinstance(t, bool | int | float):
        return {"kind": "scalar", "value": t}
    return {"kind": type(t).__name__}


_SIG = {"float32": "*fp32", "i32": "i32", "i64": "i64", "f32": "fp32"}


def load_kernels():
    import importlib.util

    spec = importlib.util.spec_from_file_location("kb_plan_kernels", KERNELS)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def compile_kernel(fn, spec: Spec, io: dict, capability: int, dest: Path) -> dict:
    """``spec``'s kernel compiled for ``capability``: every launch parameter in the signature
    (no value-1 specialisation: the cubin takes exactly the launch's parameters, plus Triton's
    hidden ones), 16-byte divisibility where the address or value has it."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kpair.harness import plan_layout

    bound = dict(spec.args)
    names = list(fn.arg_names)
    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(names):
        if name in spec.constexprs:
            signature[name] = "constexpr"
            constexprs[(i,)] = spec.constexprs[name]
            continue
        bind = bound[name]
        if bind[0] == "scratch":   # a float32 buffer the plan declares, 256-aligned
            signature[name] = "*fp32"
            attrs[(i,)] = [("tt.divisibility", 16)]
        elif bind[0] == "tensor":
            t = _tensor_of(io, bind[1])
            signature[name] = _SIG[t["dtype"]]
            if int(t["data_ptr"]) % 16 == 0:
                attrs[(i,)] = [("tt.divisibility", 16)]
        else:
            signature[name] = _SIG[bind[1]]
            if bind[1] in ("i32", "i64") and bind[2] % 16 == 0 and bind[2]:
                attrs[(i,)] = [("tt.divisibility", 16)]
    compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs),
                              target=GPUTarget("cuda", capability, 32),
                              options={"num_warps": spec.num_warps,
                                       "num_stages": spec.num_stages})
    meta = compiled.metadata
    cubin = dest / f"{meta.name}.{len(list(dest.glob('*.cubin')))}.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    layout = plan_layout(compiled.asm["cubin"], "cubin", meta.name)
    return {"cubin": str(cubin), "name": meta.name, "shared": int(meta.shared),
            "num_warps": int(meta.num_warps), "signature": signature,
            "layout": [[q.offset, q.size] for q in layout] if layout is not None else None,
            **{f"{h}_{k}": int(getattr(meta, f"{h}_{k}", 0) or 0)
               for h in HIDDEN for k in ("size", "align")}}


def self_check(fns: list, work: Launches, tensors: dict, out, torch) -> dict:
    """The launches made by Triton itself on a fresh output (and fresh scratch), against the
    eager output (outside the range: a diagnosis, not the judgement)."""
    fresh = torch.full_like(out, float("nan"))
    buffers = {n: torch.full((size // 4,), float("nan"), device=out.device)
               for n, size in work.scratch.items()}
    for fn, spec in zip(fns, work.launches, strict=True):
        args = [fresh if b == ("tensor", "out") else tensors[b[1]] if b[0] == "tensor"
                else buffers[b[1]] if b[0] == "scratch" else b[2] for _, b in spec.args]
        fn[spec.grid](*args, **spec.constexprs, num_warps=spec.num_warps,
                      num_stages=spec.num_stages)
    torch.cuda.synchronize()
    diff = (fresh.float() - out.float()).abs()
    return {"allclose": bool(torch.allclose(fresh, out, atol=1e-2, rtol=1e-2)),
            "max_abs_diff": float(diff.max()) if diff.numel() else 0.0,
            "nan": int(torch.isnan(fresh).sum())}


def child(plan_path: Path) -> int:
    """Run every problem of the batch: the eager forward inside its range, then its Triton
    kernel compiled (and self-checked). Writes ``io.json`` after each problem."""
    t0 = time.monotonic()
    import torch

    import kpair

    plan = json.loads(plan_path.read_text())
    work = Path(plan["work"])
    kernels = load_kernels()   # imports triton
    import_s = round(time.monotonic() - t0, 3)
    gate_wait_s = kb_pipeline.hold_gate_from_env()   # no CUDA call before this
    major, minor = torch.cuda.get_device_capability()

    def start(i: int, p: dict) -> dict:   # the imports and the gate: paid once per process
        return {"number": p["number"], "ok": False, "import_s": 0.0 if i else import_s,
                "gate_wait_s": 0.0 if i else gate_wait_s}

    def one(p: dict, rec: dict) -> None:
        entry = BY_NAME[p["name"]]
        t1 = time.monotonic()
        module = kb.module_from_source(p["source"], f"kbp_{p['module']}", p["file"])
        model, inputs = kb.instantiate(module, torch, "cuda")
        with torch.no_grad():
            for _ in range(2):
                model(*inputs)
            torch.cuda.synchronize()
            with kpair.mark(range_name(p["number"])) as m:
                out = model(*inputs)
                m.outputs(out)
                torch.cuda.synchronize()
        io = {"inputs": [_describe(t, torch) for t in inputs],
              "output": _describe(out, torch),
              "attrs": {a: getattr(model, a) for a in entry.attrs}}
        rec["io"] = io
        rec["setup_s"] = round(time.monotonic() - t1, 3)
        t2 = time.monotonic()
        launches = entry.launches(io)
        fns = [getattr(kernels, spec.kernel) for spec in launches.launches]
        dest = work / f"p{p['number']}.kernels"
        dest.mkdir(parents=True, exist_ok=True)
        rec["kernels"] = [compile_kernel(fn, spec, io, major * 10 + minor, dest)
                          for fn, spec in zip(fns, launches.launches, strict=True)]
        rec["compile_s"] = round(time.monotonic() - t2, 3)
        rec["ok"] = True
        tensors = {f"in{i}": t for i, t in
                   enumerate(x for x in inputs if isinstance(x, torch.Tensor))}
        try:
            if plan.get("self_check", True):
                rec["self_check"] = self_check(fns, launches, tensors, out, torch)
        except Exception as e:  # noqa: BLE001 - a diagnosis only
            rec["self_check"] = {"error": f"{type(e).__name__}: {e}"[:600]}

    kb.each_problem(plan["problems"], Path(plan["io"]), start, one, torch=torch, dynamo=False)
    return 0


# --------------------------------------------------------------------------- the driver

def ref_kernels(manifest: dict) -> list[str]:
    """The kernels of the captured range, in order (memsets and copies by kind)."""
    ops = manifest.get("ops") or [{"code_object": manifest.get("code_object")}]
    return [(o.get("code_object") or {}).get("kernel_name") or o.get("kind", "?") for o in ops]


def stage_capture(job, timeout: float, args) -> dict:
    """One ``kpair capture --range p<n>`` of the problem in a fresh process (the eager
    forward in its range, its Triton kernels compiled, self-checked)."""
    e, cap = job.data, job.folder / "cap"
    cap_run, rec, cut = capture_child(
        job, timeout, args, script=Path(__file__).resolve(), ranges=[range_name(e["number"])],
        plan={"io": str(job.folder / "io.json"), "work": str(job.folder),
              "self_check": args.self_check, "problems": [e]},
        records="io.json", cmd=kpair_cmd)
    out = {"capture_s": cap_run["s"], "exit_code": cap_run["exit_code"], "scale": e["scale"],
           "program": {k: rec.get(k) for k in ("ok", "error", "self_check", "import_s",
                                                "gate_wait_s", "setup_s", "compile_s")
                       if k in rec},
           "kernels": [{k: v for k, v in kernel.items() if k != "cubin"}
                       for kernel in rec.get("kernels") or []]}
    if cut:
        return {**out, "cut": True}   # the call's time ran out: captured again next call
    program_stop(out, rec, cap_run)
    snap = cap / range_name(e["number"])
    if rec.get("ok") and not (snap / "snapshot.json").exists():
        st = _ranges_status(cap).get(range_name(e["number"]), {})
        out.update(stop="not captured",
                   capture={k: st.get(k) for k in ("status", "reason") if k in st})
    return out


def stage_pair(job, timeout: float, args) -> dict:
    """The plan written from the captured range and the child's kernels; ``kpair pair SNAP
    --plan PLAN --policy P``."""
    entry, folder = BY_NAME[job.data["name"]], job.folder
    rec = json.loads((folder / "io.json").read_text())[0]
    snap = folder / "cap" / range_name(entry.number)
    manifest = json.loads((snap / "snapshot.json").read_text())
    row: dict = {"ref": {"ops": len(manifest.get("ops") or []) or 1,
                         "kernels": ref_kernels(manifest)[:12],
                         "regions": [{"name": r["name"], "size": r["size"],
                                      "role": r.get("role")} for r in manifest["regions"]],
                         "scratch": len(manifest.get("scratch") or [])}}
    try:
        launches = entry.launches(rec["io"])
        plan_path = write_plan(folder / "plan", launches, rec["io"], manifest, rec["kernels"])
    except PlanBuildError as e:
        return {**row, "stop": "plan not built", "plan_error": str(e)}
    plan = json.loads(plan_path.read_text())
    row["plan"] = {"kernels": [s.kernel for s in launches.launches],
                   "launches": [{k: q[k] for k in ("grid", "block", "dynamic_shared_bytes")}
                                for q in plan["launches"]],
                   "scratch": plan.get("scratch", []), "note": plan["note"]}
    policy = folder / "policy.json"
    policy.write_text(json.dumps(output_policy(
        snap, args.atol, args.rtol, f"KernelBench's tolerance: atol={args.atol}, "
        f"rtol={args.rtol} on the forward's output")))
    harness = folder / "harness"
    shutil.rmtree(harness, ignore_errors=True)
    pair = kpair_cmd("pair", str(snap), "--plan", str(plan_path), "--policy", str(policy),
                     "-o", str(harness), "--json", "-q", timeout=timeout)
    if pair["exit_code"] == 124:
        return {"cut": True}
    row["pair"] = {"exit_code": pair["exit_code"], "s": pair["s"]}
    if pair["exit_code"] != 0:
        doc = json_of(pair) or {}
        row["pair"]["error"] = doc.get("error") or pair["stderr"].strip()[-600:]
        row["stop"] = "pair refused"
    return row


def stage_run(job, timeout: float, args) -> dict:
    rec = timed_run(job.folder / "harness", job.folder / "r1.json", timeout, args,
                    cmd=kpair_cmd)
    if not rec.get("cut") and (rec.get("status") != "pass" or args.runs == 1):
        rec["stop"] = rec.get("status") or f"run exit {rec['exit_code']}"
    return rec


def stage_rerun(job, timeout: float, args) -> dict:
    return timed_run(job.folder / "harness", job.folder / "r2.json", timeout, args,
                     cmd=kpair_cmd)


#: (name, function, expected seconds before any is measured, timed).
STAGES = (("capture", stage_capture, 45.0, False), ("pair", stage_pair, 10.0, False),
          ("run", stage_run, 10.0, True), ("rerun", stage_rerun, 10.0, True))


def row_of(job) -> dict:
    e, st = job.data, job.state
    cap = st.get("capture", {})
    row = {"key": e["key"], "replaces": e["replaces"], "scale": e["scale"],
           "scaled": e["scaled"], "program": cap.get("program", {}),
           "kernels": cap.get("kernels", [])}
    for k in ("capture_stderr", "capture"):
        if k in cap:
            row[k] = cap[k]
    pair = st.get("pair", {})
    row.update({k: pair[k] for k in ("ref", "plan", "plan_error", "pair") if k in pair})
    runs = [st[n] for n in ("run", "rerun") if n in st]
    if runs:
        row["runs"] = runs
        ci = runs[0].get("ci95")
        if len(runs) == 2 and ci and runs[1].get("speedup"):
            row["rerun_inside"] = ci[0] <= runs[1]["speedup"] <= ci[1]
    prog = cap.get("program", {})
    row["breakdown"] = {"capture_s": cap.get("capture_s"), "import_s": prog.get("import_s"),
                        "gate_wait_s": prog.get("gate_wait_s"),
                        "setup_s": prog.get("setup_s"), "compile_s": prog.get("compile_s"),
                        "pair_s": pair.get("pair", {}).get("s"),
                        "run_s": st.get("run", {}).get("s"),
                        "rerun_s": st.get("rerun", {}).get("s")}
    outcome = job.stopped
    if runs and outcome in (None, runs[0].get("status")):
        outcome = runs[0].get("status") or f"run exit {runs[0].get('exit_code')}"
    row["outcome"] = outcome or "?"
    errors = {n: r["error"] for n, r in st.items()
              if isinstance(r, dict) and r.get("stop") == "driver error" and r.get("error")}
    if errors:
        row.update(outcome="driver error", error=errors)
    return row


def _ranges_status(cap: Path) -> dict[str, dict]:
    with contextlib.suppress(OSError, ValueError):
        doc = json.loads((cap / "capture.json").read_text())
        return {r["name"]: r for r in doc.get("ranges") or []}
    return {}


def selected(args) -> list[Entry]:
    entries = list(PROBLEMS)
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        unknown = [w for w in wanted if w not in BY_NAME and not any(
            e.name.startswith(f"{w}_") for e in PROBLEMS)]
        if unknown:
            raise SystemExit(f"kernelbench_plans.py: not in the table: {', '.join(unknown)} "
                             f"(it has {', '.join(e.name for e in PROBLEMS)})")
        entries = [e for e in PROBLEMS if e.name in wanted
                   or any(e.name.startswith(f"{w}_") for w in wanted)]
    return entries[:args.count] if args.count else entries


def run(args) -> int:
    out, work, sizes = open_call(args)
    found = {p.name: p for p in kb.discover(Path(args.kernelbench), [1])}
    results_path = out / "results.jsonl"
    done = done_keys(results_path)
    todo = [e for e in selected(args) if e.key not in done]
    for e in [e for e in todo if e.name not in found]:
        append(results_path, {"key": e.key, "replaces": e.replaces,
                              "outcome": "not in this KernelBench copy"})
    budget = args.budget_mib << 20
    jobs, nbytes = [], []
    for e in todo:
        if e.name not in found:
            continue
        p = found[e.name]
        k = choose_scale(sizes.get(e.key), budget)
        source, scaled = kb.scale_source(p.path.read_text(), k)
        job, n = scaled_job(e.key, work / range_name(e.number), {
            "number": e.number, "name": e.name, "key": e.key, "replaces": e.replaces,
            "file": str(p.path), "module": p.name, "source": source, "scale": k,
            "scaled": scaled}, k, sizes)
        jobs.append(job)
        nbytes.append(n)
    return schedule(args, "kernelbench_plans", jobs, nbytes,
                    make_stages(args, STAGES if args.runs == 2 else STAGES[:3]), out=out,
                    work=work, row_of=row_of, write_summary=write_summary,
                    seconds=("capture", "pair", "run", "rerun"))


def write_summary(results_path: Path, path: Path) -> dict:
    rows = [json.loads(line) for line in results_path.read_text().splitlines() if line]
    passed = [r for r in rows if r.get("outcome") == "pass"]
    speedups = [r["runs"][0]["speedup"] for r in passed if r["runs"][0].get("speedup")]
    outcomes: dict[str, int] = {}
    for r in rows:
        outcomes[r.get("outcome", "?")] = outcomes.get(r.get("outcome", "?"), 0) + 1
    summary = {
        "schema": SCHEMA, "problems": len(rows), "outcomes": outcomes, "passed": len(passed),
        "geomean_speedup_passed": round(math.exp(sum(map(math.log, speedups))
                                                 / len(speedups)), 4) if speedups else None,
        "rerun_inside": sum(bool(r.get("rerun_inside")) for r in passed),
        "rows": [{"key": r["key"], "replaces": r.get("replaces"), "scale": r.get("scale"),
                  "outcome": r.get("outcome"),
                  "ref_kernels": (r.get("ref") or {}).get("kernels"),
                  "opt_kernels": (r.get("plan") or {}).get("kernels"),
                  "speedup": (r.get("runs") or [{}])[0].get("speedup"),
                  "ci95": (r.get("runs") or [{}])[0].get("ci95"),
                  "rerun": r["runs"][1].get("speedup") if len(r.get("runs") or []) >= 2
                  else None,
                  "self_check": (r.get("program") or {}).get("self_check")} for r in rows]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=1))
    os.replace(tmp, path)
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kernelbench_plans.py", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    c = sub.add_parser("child", help="(internal) the captured program")
    c.add_argument("plan")
    add_plan_parser(sub, count=10)
    r = sub.add_parser("run", help="capture Level 1 problems, pair each with its Triton plan, "
                                   "run it")
    r.add_argument("--kernelbench", required=True, help="a copy of the KernelBench repository")
    r.add_argument("-o", "--out", required=True, help="results folder (results.jsonl, "
                                                      "summary.json; resumed)")
    r.add_argument("--work", default="/tmp/kb_plans_work",
                   help="per problem folders (kept across calls until decided: resume)")
    r.add_argument("--sizes", default=str(SIZES))
    r.add_argument("--only", default="", help="comma-separated problem names or numbers")
    r.add_argument("--count", type=int, default=0, help="at most this many (0: all)")
    r.add_argument("--budget-mib", type=int, default=64)
    r.add_argument("--deadline", type=float, default=540)
    r.add_argument("--capture-timeout", type=float, default=300)
    r.add_argument("--runs", type=int, choices=(1, 2), default=2,
                   help="kpair run calls a problem (2: the second checks the first's interval)")
    r.add_argument("--no-self-check", dest="self_check", action="store_false",
                   help="skip the child's own launch of each plan's kernels (a diagnosis; "
                        "it compiles each kernel a second time)")
    r.add_argument("--atol", type=float, default=1e-2)
    r.add_argument("--rtol", type=float, default=1e-2)
    add_schedule_arguments(r, time_cap=2.0)
    args = ap.parse_args(argv)
    if args.verb == "child":
        return child(Path(args.plan))
    if args.verb == "plan":
        return plan(args, STAGES)
    previous = signal.signal(signal.SIGTERM, kb._terminated)
    try:
        return run(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
