"""Launch plans (kpair.plan): a candidate with its own signature is checked against its code
objects' layouts and the range's regions before any launch, and its kernargs are built from
the layouts.

The target below is a GEMM + bias + ReLU range: ``a``, ``b`` and ``bias`` are live-in,
``out`` is written. The fused candidate is one launch ``kp_fused(a, b, bias, out, n)``."""

from __future__ import annotations

import json
import struct

import pytest

from kpair.errors import AbiMismatch, FormatError
from kpair.plan import Plan, PlanError, Target, TargetRegion, check_plan, kernarg
from kpair.snapshot import Param

N = 64
TARGET = Target({"a": TargetRegion(N * N * 4, "in"), "b": TargetRegion(N * N * 4, "in"),
                 "bias": TargetRegion(N * 4, "in"), "out": TargetRegion(N * N * 4, "out")})
#: kp_fused(const float *a, const float *b, const float *bias, float *out, int n)
FUSED = (Param(offset=0, size=8, kind="pointer", name="a"),
         Param(offset=8, size=8, kind="pointer", name="b"),
         Param(offset=16, size=8, kind="pointer", name="bias"),
         Param(offset=24, size=8, kind="pointer", name="out"),
         Param(offset=32, size=4, kind="i32", name="n"))


def _plan(args=None, scratch=(), launches=None) -> dict:
    args = args if args is not None else [
        {"bind": "region", "name": "a"}, {"bind": "region", "name": "b"},
        {"bind": "region", "name": "bias"},
        {"bind": "region", "name": "out", "access": "write"},
        {"bind": "scalar", "kind": "i32", "value": N}]
    return {"schema": "kpair.plan", "schema_version": 1, "scratch": list(scratch),
            "launches": launches or [{"code": "fused.so", "kernel": "kp_fused", "args": args}]}


def _read(tmp_path, doc) -> Plan:
    path = tmp_path / "opt.plan.json"
    path.write_text(json.dumps(doc))
    return Plan.read(path)


def test_a_good_plan_passes_and_builds_the_kernarg_from_the_layout(tmp_path):
    plan = _read(tmp_path, _plan())
    check_plan(plan, TARGET, [FUSED])
    addresses = {"a": 0x1000, "b": 0x9000, "bias": 0x11000, "out": 0x12000}
    blob = kernarg(plan.launches[0], FUSED, addresses)
    assert len(blob) == 36
    assert struct.unpack_from("<4Qi", blob) == (0x1000, 0x9000, 0x11000, 0x12000, N)


def test_region_offsets_and_scratch_reach_the_kernarg(tmp_path):
    layout = (Param(offset=0, size=8, kind="pointer"), Param(offset=8, size=8, kind="pointer"),
              Param(offset=16, size=8, kind="f64"))
    plan = _read(tmp_path, _plan(args=[
        {"bind": "region", "name": "out", "offset": 256, "access": "readwrite", "bytes": 512},
        {"bind": "scratch", "name": "tmp", "offset": 64},
        {"bind": "scalar", "kind": "f64", "value": 0.5}],
        scratch=[{"name": "tmp", "size": 4096}]))
    check_plan(plan, TARGET, [layout])
    blob = kernarg(plan.launches[0], layout, {"out": 0x20000, "tmp": 0x40000})
    assert struct.unpack("<QQd", blob) == (0x20000 + 256, 0x40000 + 64, 0.5)


def test_a_layout_of_unknown_kinds_is_checked_by_size(tmp_path):
    """A cubin's .nv.info gives offsets and sizes only: kind ``bytes``."""
    sized = tuple(Param(offset=p.offset, size=p.size, kind="bytes") for p in FUSED)
    check_plan(_read(tmp_path, _plan()), TARGET, [sized])
    with pytest.raises(AbiMismatch, match=r"parameter 4 is 4 bytes, the plan passes a i64"):
        bad = _plan()
        bad["launches"][0]["args"][4] = {"bind": "scalar", "kind": "i64", "value": N}
        check_plan(_read(tmp_path, bad), TARGET, [sized])


def _swap(i, new):
    doc = _plan()
    doc["launches"][0]["args"][i] = new
    return doc


# Each bad plan, the error type, and what its message must name.
BAD = {
    "too_few_params": (_plan(args=_plan()["launches"][0]["args"][:4]), AbiMismatch,
                       r"launch 0 \(kp_fused\) takes 5 parameters .* the plan binds 4"),
    "scalar_for_pointer": (_swap(0, {"bind": "scalar", "kind": "i64", "value": 0}), AbiMismatch,
                           r"parameter 0 \('a'\) is a pointer, the plan passes a i64"),
    "pointer_for_scalar": (_swap(4, {"bind": "region", "name": "a"}), AbiMismatch,
                           r"parameter 4 \('n'\) is i32, the plan passes the address of "
                           r"region 'a'"),
    "wrong_scalar_type": (_swap(4, {"bind": "scalar", "kind": "f32", "value": 1.0}),
                          AbiMismatch, r"parameter 4 \('n'\) is i32, the plan passes f32"),
    "wrong_scalar_size": (_swap(4, {"bind": "scalar", "kind": "u16", "value": 1}), AbiMismatch,
                          r"parameter 4 \('n'\) is 4 bytes, the plan passes a u16"),
    "unknown_region": (_swap(2, {"bind": "region", "name": "bais"}), PlanError,
                       r"parameter 2 \('bias'\): the range has no region 'bais' \(it has a, "
                       r"b, bias, out\)"),
    "unbound_output": (_swap(3, {"bind": "region", "name": "out"}), PlanError,
                       r"the range writes 'out', which no launch of the plan binds for "
                       r"writing"),
    "writes_live_in": (_swap(0, {"bind": "region", "name": "a", "access": "readwrite"}),
                       PlanError, r"parameter 0 \('a'\): region 'a' is live-in .* readwrite"),
    "offset_past_end": (_swap(2, {"bind": "region", "name": "bias", "offset": N * 4}),
                        PlanError, r"offset 256 is past the end of region 'bias' \(256 bytes"),
    "reach_past_end": (_swap(3, {"bind": "region", "name": "out", "access": "write",
                                 "offset": 8, "bytes": N * N * 4}), PlanError,
                       r"reaches 16384 bytes from offset 8, past the end of region 'out'"),
    "undeclared_scratch": (_swap(2, {"bind": "scratch", "name": "tmp"}), PlanError,
                           r"scratch buffer 'tmp' is not declared"),
    "scratch_too_small": (_plan(args=[
        {"bind": "region", "name": "a"}, {"bind": "region", "name": "b"},
        {"bind": "scratch", "name": "tmp", "bytes": 4096},
        {"bind": "region", "name": "out", "access": "write"},
        {"bind": "scalar", "kind": "i32", "value": N}], scratch=[{"name": "tmp", "size": 1024}]),
        PlanError, r"parameter 2 \('bias'\): reaches 4096 bytes from offset 0, past the end of "
                   r"scratch buffer 'tmp' \(1024 bytes\)"),
    "scratch_named_like_a_region": (_plan(scratch=[{"name": "out", "size": 64}]), PlanError,
                                    r"scratch buffer 'out' is named like a region"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_plan_is_refused_before_any_launch_naming_the_fault(tmp_path, case):
    doc, error, message = BAD[case]
    with pytest.raises(error, match=message):
        check_plan(_read(tmp_path, doc), TARGET, [FUSED])


# Faults of the file itself: the reader names the field.
BAD_FILES = {
    "no_launches": ({"launches": []}, r"launches: a plan has at least one launch"),
    "absolute_code": ({"launches": [{"code": "/tmp/x.so", "kernel": "k", "args": []}]},
                      r"launches\[0\].code: must be a relative path"),
    "unknown_binding": ({"launches": [{"code": "x.so", "kernel": "k",
                                       "args": [{"bind": "global", "name": "a"}]}]},
                        r"launches\[0\].args\[0\]"),
    "scalar_out_of_range": ({"launches": [{"code": "x.so", "kernel": "k", "args": [
        {"bind": "scalar", "kind": "u8", "value": 300}]}]},
        r"launches\[0\].args\[0\].value: 300 does not fit a u8"),
    "float_for_int": ({"launches": [{"code": "x.so", "kernel": "k", "args": [
        {"bind": "scalar", "kind": "i32", "value": 1.5}]}]},
        r"value: a i32 value must be an integer"),
    "scratch_twice": ({"scratch": [{"name": "t", "size": 8}, {"name": "t", "size": 8}],
                       "launches": [{"code": "x.so", "kernel": "k", "args": []}]},
                      r"scratch\[1\]: scratch buffer 't' is declared twice"),
    "odd_alignment": ({"scratch": [{"name": "t", "size": 8, "align": 24}],
                       "launches": [{"code": "x.so", "kernel": "k", "args": []}]},
                      r"scratch\[0\].align: must be a power of two"),
    "unknown_field": ({"launches": [{"code": "x.so", "kernel": "k", "args": [],
                                     "stream": 2}]}, r"launches\[0\].stream: unknown field"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_malformed_plan_file_names_the_field(tmp_path, case):
    body, message = BAD_FILES[case]
    doc = {"schema": "kpair.plan", "schema_version": 1, **body}
    with pytest.raises(FormatError, match=message):
        _read(tmp_path, doc)


def test_another_version_or_format_is_refused_by_name(tmp_path):
    with pytest.raises(FormatError, match="schema_version 2 is not supported"):
        _read(tmp_path, {**_plan(), "schema_version": 2})
    with pytest.raises(FormatError, match="expected schema 'kpair.plan'"):
        _read(tmp_path, {**_plan(), "schema": "kpair.snapshot"})


def test_a_multi_launch_plan_counts_writes_across_launches(tmp_path):
    """GEMM into scratch, then bias + ReLU from scratch into ``out``: the second launch
    writes the output, the first only scratch."""
    gemm = {"code": "gemm.so", "kernel": "kp_gemm", "args": [
        {"bind": "region", "name": "a"}, {"bind": "region", "name": "b"},
        {"bind": "scratch", "name": "c"}, {"bind": "scalar", "kind": "i32", "value": N}]}
    epilogue = {"code": "epi.so", "kernel": "kp_bias_relu", "args": [
        {"bind": "scratch", "name": "c"}, {"bind": "region", "name": "bias"},
        {"bind": "region", "name": "out", "access": "write"},
        {"bind": "scalar", "kind": "i32", "value": N}]}
    plan = _read(tmp_path, _plan(launches=[gemm, epilogue],
                                 scratch=[{"name": "c", "size": N * N * 4}]))
    ptr = lambda o: Param(offset=o, size=8, kind="pointer")  # noqa: E731
    layouts = [(ptr(0), ptr(8), ptr(16), Param(offset=24, size=4, kind="i32")),
               (ptr(0), ptr(8), ptr(16), Param(offset=24, size=4, kind="i32"))]
    check_plan(plan, TARGET, layouts)
    with pytest.raises(PlanError, match="the range writes 'out'"):
        check_plan(_read(tmp_path, _plan(launches=[gemm], scratch=[
            {"name": "c", "size": N * N * 4}])), TARGET, layouts[:1])


def test_the_one_dispatch_target_of_a_recorded_snapshot(matmul_snapshot, tmp_path):
    """kp_matmul(a, b, c, n) recorded: ``c`` is written, ``a`` and ``b`` only read. A plan
    that binds ``a`` for writing is refused; one that writes ``c`` is not."""
    from kpair.snapshot import Snapshot

    target = Target.of_dispatch(Snapshot.open(matmul_snapshot).manifest)
    assert {n: r.role for n, r in target.regions.items()} == {"a": "in", "b": "in",
                                                              "c": "inout"}
    layout = FUSED[:3] + (Param(offset=24, size=4, kind="i32", name="n"),)
    args = [{"bind": "region", "name": "a"}, {"bind": "region", "name": "b"},
            {"bind": "region", "name": "c", "access": "write"},
            {"bind": "scalar", "kind": "i32", "value": 128}]
    check_plan(_read(tmp_path, _plan(args=args)), target, [layout])
    args[0]["access"] = "write"
    with pytest.raises(PlanError, match="region 'a' is live-in"):
        check_plan(_read(tmp_path, _plan(args=args)), target, [layout])
