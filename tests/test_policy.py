"""Validation policy: strict reading of validation_policy.json and judging bytes under it."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from kpair.errors import PolicyError
from kpair.policy import (
    Policy,
    Tolerance,
    check,
    check_region,
    decode,
    load_policy,
    save_policy,
)

EXAMPLE = {
    "schema": "kpair.validation_policy",
    "schema_version": 1,
    "default": "byte-exact",
    "tolerances": [
        {"region": "out", "range": [0, 4096], "dtype": "float32",
         "criterion": "cosine", "min_cosine": 0.9999, "nan": "match"},
        {"region": "norm", "range": [0, 4], "dtype": "float32", "criterion": "scalar_rtol",
         "rtol": 1e-6},
        {"region": "y", "range": [0, 1024], "dtype": "float16", "criterion": "allclose",
         "atol": 1e-3, "rtol": 1e-2},
        {"region": "z", "range": [64, 128], "dtype": "bfloat16", "criterion": "ulp", "max_ulp": 2},
    ],
    "note": "free text, optional",
}


def arr(values, dtype="<f4") -> bytes:
    return np.asarray(values, dtype=dtype).tobytes()


def one(expected: bytes, actual: bytes, **tol):
    """Judge a single region "r" under one tolerance covering all of it."""
    t = Tolerance(**{"region": "r", "start": 0, "end": len(expected), "dtype": "float32", **tol})
    return check_region("r", expected, actual, (t,))


def json_safe(obj) -> dict:
    return json.loads(json.dumps(obj, allow_nan=False))


# ---------------------------------------------------------------- reading and writing


def test_round_trip_through_json_and_file(tmp_path):
    p = Policy.from_json(EXAMPLE)
    assert p.mode == "tolerance" and len(p.tolerances) == 4 and p.note == EXAMPLE["note"]
    assert Policy.from_json(p.to_json()) == p
    assert p.to_json()["tolerances"][1] == {**EXAMPLE["tolerances"][1], "nan": "match"}
    save_policy(p, tmp_path / "validation_policy.json")
    assert load_policy(tmp_path / "validation_policy.json") == p
    assert p.for_region("z") == (p.tolerances[3],)
    assert p.tolerances[0].describe() == "cosine >= 0.9999 over out[0:4096) as float32"


def test_byte_exact_policy():
    p = Policy.byte_exact()
    assert p.mode == "byte-exact" and p.tolerances == ()
    assert Policy.from_json({"schema": "kpair.validation_policy", "schema_version": 1}) == p
    assert "note" not in p.to_json()


def test_unaligned_start_is_allowed():
    t = Tolerance("r", 2, 10, "float32", "ulp", max_ulp=0)
    assert check_region("r", bytes(12), bytes(12), (t,)).passed


def _mutate(fn):
    doc = copy.deepcopy(EXAMPLE)
    fn(doc)
    return doc


BAD = [
    (lambda d: d.update(extra=1), "extra"),
    (lambda d: d["tolerances"][2].update(foo=1), "tolerances[2].foo"),
    (lambda d: d.update(schema_version=2), "schema_version"),
    (lambda d: d.update(schema_version="1"), "schema_version"),
    (lambda d: d.pop("schema_version"), "schema_version"),
    (lambda d: d.update(schema="kpair.snapshot"), "schema"),
    (lambda d: d.update(default="tolerance"), "default"),
    (lambda d: d.update(note=3), "note"),
    (lambda d: d.update(tolerances={}), "tolerances"),
    (lambda d: d["tolerances"][1].update(rtol=-1e-6), "tolerances[1].rtol"),
    (lambda d: d["tolerances"][1].update(rtol="1e-6"), "tolerances[1].rtol"),
    (lambda d: d["tolerances"][1].update(rtol=True), "tolerances[1].rtol"),
    (lambda d: d["tolerances"][2].update(atol=float("nan")), "tolerances[2].atol"),
    (lambda d: d["tolerances"][0].update(min_cosine=1.5), "tolerances[0].min_cosine"),
    (lambda d: d["tolerances"][0].update(min_cosine=0), "tolerances[0].min_cosine"),
    (lambda d: d["tolerances"][0].update(rtol=1e-3), "tolerances[0].rtol"),
    (lambda d: d["tolerances"][2].pop("atol"), "tolerances[2].atol"),
    (lambda d: d["tolerances"][3].update(max_ulp=1.5), "tolerances[3].max_ulp"),
    (lambda d: d["tolerances"][3].update(max_ulp=-1), "tolerances[3].max_ulp"),
    (lambda d: d["tolerances"][0].update(nan="ignore"), "tolerances[0].nan"),
    (lambda d: d["tolerances"][0].update(dtype="float8"), "tolerances[0].dtype"),
    (lambda d: d["tolerances"][0].update(dtype="int32"), "tolerances[0].dtype"),
    (lambda d: d["tolerances"][3].update(dtype="uint16"), "tolerances[3].dtype"),
    (lambda d: d["tolerances"][0].update(criterion="rmse"), "tolerances[0].criterion"),
    (lambda d: d["tolerances"][0].update(criterion=["cosine"]), "tolerances[0].criterion"),
    (lambda d: d["tolerances"][0].update(dtype={}), "tolerances[0].dtype"),
    (lambda d: d["tolerances"][0].update(nan=[]), "tolerances[0].nan"),
    (lambda d: d["tolerances"][0].update(region=""), "tolerances[0].region"),
    (lambda d: d["tolerances"][0].pop("region"), "tolerances[0].region"),
    (lambda d: d["tolerances"][0].update(range=[0, 4094]), "tolerances[0].range"),
    (lambda d: d["tolerances"][0].update(range=[8, 4]), "tolerances[0].range"),
    (lambda d: d["tolerances"][0].update(range=[4, 4]), "tolerances[0].range"),
    (lambda d: d["tolerances"][0].update(range=[-4, 4]), "tolerances[0].range"),
    (lambda d: d["tolerances"][0].update(range=[0, 4, 8]), "tolerances[0].range"),
    (lambda d: d["tolerances"][0].update(range=[0.0, 4]), "tolerances[0].range"),
    (lambda d: d["tolerances"][1].update(range=[0, 8]), "tolerances[1].range"),
    (lambda d: d["tolerances"].append(dict(d["tolerances"][3], range=[126, 130])),
     "tolerances[4].range"),
    (lambda d: d["tolerances"].__setitem__(1, 7), "tolerances[1]"),
]


@pytest.mark.parametrize(("mutate", "field"), BAD, ids=[f for _, f in BAD])
def test_rejects_bad_policy_naming_the_field(mutate, field):
    with pytest.raises(PolicyError) as info:
        Policy.from_json(_mutate(mutate), path="p.json")
    assert info.value.field == field
    assert f"field {field}" in str(info.value) and str(info.value).startswith("p.json")


def test_rejects_non_object():
    with pytest.raises(PolicyError):
        Policy.from_json([])


def test_direct_construction_is_checked_too():
    with pytest.raises(PolicyError, match="multiple"):
        Tolerance("out", 0, 6, "float32", "cosine", min_cosine=0.9)
    a = Tolerance("out", 0, 8, "float32", "ulp", max_ulp=1)
    b = Tolerance("out", 4, 12, "float32", "ulp", max_ulp=1)
    with pytest.raises(PolicyError) as info:
        Policy((a, b))
    assert info.value.field == "tolerances[1].range"
    Policy((a, Tolerance("other", 4, 12, "float32", "ulp", max_ulp=1)))  # other region: fine


def test_validate_against_regions():
    p = Policy.from_json(EXAMPLE)
    sizes = {"out": 4096, "norm": 4, "y": 1024, "z": 128}
    p.validate_against(sizes)
    with pytest.raises(PolicyError) as info:
        p.validate_against({**sizes, "z": 127})
    assert info.value.field == "tolerances[3].range"
    del sizes["norm"]
    with pytest.raises(PolicyError, match="'norm' is not in the snapshot") as info:
        p.validate_against(sizes)
    assert info.value.field == "tolerances[1].region"


def test_check_refuses_policy_that_does_not_fit():
    p = Policy((Tolerance("out", 0, 16, "float32", "ulp", max_ulp=0),))
    with pytest.raises(PolicyError):
        check(p, {"out": bytes(8)}, {"out": bytes(8)})
    with pytest.raises(PolicyError):
        check(p, {"other": bytes(16)}, {"other": bytes(16)})


def test_load_policy_bad_json_and_missing_file(tmp_path):
    bad = tmp_path / "validation_policy.json"
    bad.write_text('{"schema": "kpair.validation_policy",\n "schema_version": 1,,}')
    with pytest.raises(PolicyError, match="invalid JSON at line 2") as info:
        load_policy(bad)
    assert str(bad) in str(info.value)
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(tmp_path / "absent.json")


# ---------------------------------------------------------------- byte-exact


def test_byte_exact_pass():
    data = {"a": arr(np.arange(16)), "b": b"\x01\x02\x03"}
    v = check(Policy.byte_exact(), data, dict(data))
    assert v.passed and v.mode == "byte-exact"
    assert v.summary() == "byte-exact: 2/2 regions identical"
    assert json_safe(v.to_json())["regions"][0]["mismatch"] is None


def test_byte_exact_fail_reports_offsets_and_decoded_values():
    exp = np.ones(32, "<f4")
    act = exp.copy()
    act[16] = 0.0  # 1.0f = 00 00 80 3f: bytes 0x42 and 0x43 change
    v = check(Policy.byte_exact(), {"out": exp.tobytes()}, {"out": act.tobytes()},
              dtype_hints={"out": "float32"})
    assert not v.passed
    m = v.regions[0].mismatch
    assert m["differing_bytes"] == 2
    # one entry per differing element, at its first differing byte
    assert [f["offset"] for f in m["first"]] == [0x42]
    first = m["first"][0]
    assert (first["expected"], first["actual"]) == ("80", "00")
    assert first["element_offset"] == 0x40
    assert (first["expected_bits"], first["actual_bits"]) == ("3f800000", "00000000")
    assert (first["expected_value"], first["actual_value"]) == (1.0, 0.0)
    s = v.summary()
    assert s.startswith("FAIL: region out: 2 bytes differ, first at 0x42")
    assert "expected 3f800000" in s and "got 00000000" in s
    json_safe(v.to_json())


def test_byte_exact_reports_at_most_eight_offsets_without_hint():
    v = check_region("r", bytes(40), b"\xff" * 20 + bytes(20))
    assert v.mismatch["differing_bytes"] == 20
    assert [f["offset"] for f in v.mismatch["first"]] == list(range(8))
    assert "element_offset" not in v.mismatch["first"][0]
    assert "expected 00, got ff" in v.reason()


def test_length_mismatch_and_missing_region_are_failures():
    v = check(Policy.byte_exact(), {"a": bytes(8), "b": bytes(4)}, {"a": bytes(7)})
    assert not v.passed
    a, b = v.regions
    assert a.mismatch == {"reason": "length", "expected_len": 8, "actual_len": 7}
    assert b.mismatch == {"reason": "missing"} and not b.passed
    assert v.summary() == ("FAIL: region a: length differs (expected 8 bytes, got 7) "
                           "(+1 more failing)")


def test_check_region_refuses_foreign_tolerance():
    t = Tolerance("x", 0, 4, "float32", "ulp", max_ulp=0)
    with pytest.raises(PolicyError, match="'x' is not in"):
        check_region("y", bytes(4), bytes(4), (t,))
    with pytest.raises(PolicyError, match="exceeds"):
        check_region("x", bytes(2), bytes(2), (t,))


# ---------------------------------------------------------------- criteria near their thresholds


def test_cosine_near_threshold():
    rng = np.random.default_rng(0)
    e = rng.standard_normal(1024)
    a = e + 0.01 * rng.standard_normal(1024)
    cos = e @ a / (np.linalg.norm(e) * np.linalg.norm(a))
    ok = one(arr(e, "<f8"), arr(a, "<f8"), dtype="float64", criterion="cosine",
             min_cosine=cos - 1e-9)
    bad = one(arr(e, "<f8"), arr(a, "<f8"), dtype="float64", criterion="cosine",
              min_cosine=cos + 1e-9)
    assert ok.passed and not bad.passed
    assert bad.checks[0].metric == "cosine" and bad.checks[0].value == pytest.approx(cos)
    assert bad.reason().startswith("cosine 0.99")


def test_cosine_zero_vectors():
    assert one(bytes(16), bytes(16), criterion="cosine", min_cosine=1.0).passed
    v = one(bytes(16), arr([0, 0, 1, 0]), criterion="cosine", min_cosine=0.5)
    assert not v.passed and v.checks[0].value == 0.0


def test_cosine_blind_spot_is_reported():
    # A one-sided 0.5% scale error: cosine sees nothing, allclose and the report do.
    e = np.random.default_rng(1).standard_normal(1024).astype("<f4")
    a = (e * np.float32(1.005)).astype("<f4")
    cos = one(e.tobytes(), a.tobytes(), criterion="cosine", min_cosine=0.9999)
    assert cos.passed
    d = cos.checks[0].detail
    assert d["mean_signed_rel_err"] == pytest.approx(0.005, abs=1e-5)
    assert d["scale"] == pytest.approx(1.005, abs=1e-5)
    close = one(e.tobytes(), a.tobytes(), criterion="allclose", atol=0.0, rtol=1e-3)
    assert not close.passed and close.checks[0].value == pytest.approx(5.0, rel=1e-3)


def test_scalar_rtol_near_threshold_and_zero():
    def judge(e, a, **kw):
        return one(arr([e], "<f8"), arr([a], "<f8"), dtype="float64", criterion="scalar_rtol",
                   **{"rtol": 1e-6, **kw})

    assert judge(3.0, 3.0 * (1 + 0.9e-6)).passed
    v = judge(3.0, 3.0 * (1 - 1.1e-6))
    assert not v.passed and v.checks[0].metric == "rel_err"
    assert v.checks[0].value == pytest.approx(1.1e-6, rel=1e-6)
    assert judge(0.0, 0.0).passed and judge(0.0, -0.0).passed
    z = judge(0.0, 1e-30)
    assert not z.passed and json_safe(z.to_json())["checks"][0]["value"] == "inf"
    assert judge(0.0, 1e-30, atol=1e-20).passed


def test_scalar_rtol_needs_exactly_one_element():
    with pytest.raises(PolicyError, match="exactly one") as info:
        Tolerance("norm", 0, 8, "float32", "scalar_rtol", rtol=1e-6)
    assert info.value.field == "range"


def test_allclose_near_threshold():
    e = np.array([1.0, 100.0, -50.0, 0.0])
    bound = 1e-3 + 1e-2 * np.abs(e)
    for factor, passed in ((0.99, True), (1.01, False)):
        a = e + factor * bound * np.array([1, -1, 1, -1])
        v = one(arr(e, "<f8"), arr(a, "<f8"), dtype="float64", criterion="allclose",
                atol=1e-3, rtol=1e-2)
        assert v.passed is passed
        assert v.checks[0].value == pytest.approx(factor, rel=1e-6)


def test_allclose_integers_compare_as_float64():
    e, a = arr([10, -10, 7], "<i2"), arr([11, -10, 7], "<i2")
    assert one(e, a, dtype="int16", criterion="allclose", atol=1, rtol=0).passed
    v = one(e, a, dtype="int16", criterion="allclose", atol=0, rtol=0.05)
    assert not v.passed and v.checks[0].detail["worst_index"] == 0


def test_ulp_near_threshold():
    e = np.array([1.0, -3.5, 1e-3], "<f4")
    for steps, passed in ((2, True), (3, False)):
        a = e.view("<u4").copy()
        a[1] += steps  # -3.5 moves further from zero by `steps` ulp
        v = one(e.tobytes(), a.tobytes(), criterion="ulp", max_ulp=2)
        assert v.passed is passed and v.checks[0].value == steps
        assert v.checks[0].detail["worst_offset"] == 4


def test_ulp_signed_zero_and_across_sign():
    assert one(arr([0.0]), arr([-0.0]), criterion="ulp", max_ulp=0).passed
    tiny, neg_tiny = arr([1], "<u4"), arr([0x80000001], "<u4")  # +/- smallest denormal
    assert one(tiny, neg_tiny, criterion="ulp", max_ulp=2).checks[0].value == 2
    assert not one(tiny, neg_tiny, criterion="ulp", max_ulp=1).passed
    big = np.finfo(np.float64).max
    v = one(arr([big], "<f8"), arr([-big], "<f8"), dtype="float64", criterion="ulp", max_ulp=0)
    assert v.checks[0].value == 2.0 * 0x7FEFFFFFFFFFFFFF


def test_bfloat16_decoding_and_ulp():
    bits = np.array([0x3F80, 0xC000, 0x7F80, 0x0000, 0x3F81], "<u2")
    assert decode(bits.tobytes(), "bfloat16").tolist() == [1.0, -2.0, np.inf, 0.0, 1.0078125]
    e = np.full(64, 0x3F80, "<u2")
    a = e.copy()
    a[40] += 2  # element 40 is at byte 80, inside z[64:128)
    t = Tolerance("z", 64, 128, "bfloat16", "ulp", max_ulp=2)
    v = check_region("z", e.tobytes(), a.tobytes(), (t,))
    assert v.passed and v.checks[0].detail["worst_offset"] == 80
    assert v.checks[0].detail["actual"] == 1.015625
    a[40] += 1
    assert not check_region("z", e.tobytes(), a.tobytes(), (t,)).passed
    a[10] += 1  # byte 20: outside the range, byte-exact
    v = check_region("z", e.tobytes(), a.tobytes(), (t,), dtype_hint="bfloat16")
    assert v.mismatch["first"][0]["expected_value"] == 1.0
    assert v.mismatch["first"][0]["actual_value"] == 1.0078125


# ---------------------------------------------------------------- range boundaries


@pytest.mark.parametrize(("byte", "passed"), [(7, False), (8, True), (15, True), (16, False)])
def test_range_boundaries(byte, passed):
    exp = np.ones(8, "<f4").tobytes()
    act = bytearray(exp)
    act[byte] ^= 0x01
    t = Tolerance("r", 8, 16, "float32", "allclose", atol=10.0, rtol=0.0)
    v = check_region("r", exp, bytes(act), (t,))
    assert v.checks[0].passed
    assert v.passed is passed
    if not passed:
        assert v.mismatch["first"][0]["offset"] == byte


# ---------------------------------------------------------------- NaN and infinities

NAN, INF = float("nan"), float("inf")
CRITERIA = [
    {"criterion": "cosine", "min_cosine": 0.99},
    {"criterion": "allclose", "atol": 1e-3, "rtol": 1e-3},
    {"criterion": "ulp", "max_ulp": 1},
]


@pytest.mark.parametrize("crit", CRITERIA, ids=[c["criterion"] for c in CRITERIA])
def test_nan_match_mode(crit):
    e = arr([1.0, NAN, 3.0, 4.0])
    assert one(e, arr([1.0, NAN, 3.0, 4.0]), **crit).passed  # excluded from the metric
    extra = one(e, arr([1.0, NAN, NAN, 4.0]), **crit)
    assert not extra.passed and extra.checks[0].detail["nan_mismatch"] == 1
    assert extra.checks[0].detail["worst_offset"] == 8
    assert "NaN" in extra.reason()
    lost = one(e, arr([1.0, 2.0, 3.0, 4.0]), **crit)
    assert not lost.passed and lost.checks[0].detail["nan_expected"] == 1
    json_safe(lost.to_json())


@pytest.mark.parametrize("crit", CRITERIA, ids=[c["criterion"] for c in CRITERIA])
def test_nan_fail_mode(crit):
    e = arr([1.0, NAN, 3.0])
    v = one(e, arr([1.0, NAN, 3.0]), nan="fail", **crit)
    assert not v.passed and v.checks[0].detail["nan_actual"] == 1
    assert not one(arr([1.0, 2.0, 3.0]), arr([1.0, NAN, 3.0]), nan="fail", **crit).passed
    assert one(arr([1.0, 2.0, 3.0]), arr([1.0, 2.0, 3.0]), nan="fail", **crit).passed


@pytest.mark.parametrize("crit", [*CRITERIA, {"criterion": "scalar_rtol", "rtol": 1.0}],
                         ids=["cosine", "allclose", "ulp", "scalar_rtol"])
def test_infinities_must_match_sign(crit):
    n = 1 if crit["criterion"] == "scalar_rtol" else 3
    e = [INF, 1.0, 2.0][:n]
    assert one(arr(e), arr(e), **crit).passed
    v = one(arr(e), arr([-INF, 1.0, 2.0][:n]), **crit)
    assert not v.passed and v.checks[0].detail["inf_mismatch"] == 1
    assert json_safe(v.to_json())["checks"][0]["detail"]["actual"] == "-inf"
    assert not one(arr(e), arr([3e38, 1.0, 2.0][:n]), **crit).passed


# ---------------------------------------------------------------- the whole check


def test_tolerance_pass_still_catches_bytes_outside_ranges():
    exp = np.linspace(1, 2, 64).astype("<f4")
    act = (exp * np.float32(1.00001)).astype("<f4")
    act[:32] = exp[:32]
    p = Policy((Tolerance("out", 128, 256, "float32", "cosine", min_cosine=0.9999),))
    expected = {"out": exp.tobytes(), "flag": b"\x01"}
    v = check(p, expected, {"out": act.tobytes(), "flag": b"\x01"})
    assert v.passed and v.mode == "tolerance"
    assert v.summary() == ("tolerance: 2/2 regions pass (1 declared range within tolerance, "
                           "all other bytes identical)")
    assert [r.criterion for r in v.regions] == ["tolerance", "byte-exact"]
    act[31] = np.nextafter(act[31], np.float32(3))
    v = check(p, expected, {"out": act.tobytes(), "flag": b"\x01"},
              dtype_hints={"out": "float32"})
    assert not v.passed and v.regions[0].checks[0].passed
    assert v.regions[0].mismatch["first"][0]["element_offset"] == 124
    out = json_safe(v.to_json())
    assert out["passed"] is False and out["summary"].startswith("FAIL: region out: 1 byte differs")
    assert out["regions"][0]["checks"][0]["rule"] == "cosine >= 0.9999 over out[128:256) as float32"


# ---------------------------------------------------------------- the quick test

_QUICK = {  # criterion: (parameters, a noise level that passes, one that fails)
    "cosine": ({"min_cosine": 0.9999}, 1e-4, 0.1),
    "allclose": ({"atol": 1e-3, "rtol": 1e-2}, 1e-4, 0.5),
    "scalar_rtol": ({"rtol": 1e-3}, 1e-5, 0.5),
    "ulp": ({"max_ulp": 64}, "4 eps", "1000 eps"),
}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("criterion", sorted(_QUICK))
def test_quick_test_never_passes_what_check_fails(criterion, dtype):
    """``passes`` (the judge of timed blocks) says True only where ``check`` passes, and it
    does say True on a clean pass: else every block would pay for ``check``."""
    from kpair.dtypes import EPS, encode
    from kpair.policy.judge import passes

    params, good, bad = (float(x.split()[0]) * EPS[dtype] if isinstance(x, str) else x
                         for x in _QUICK[criterion])
    rng = np.random.default_rng(7)
    n = 1 if criterion == "scalar_rtol" else 3000
    size = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}[dtype]
    pad = 8   # undeclared bytes on each side of the range: judged exactly
    values = rng.uniform(0.5, 2.0, n) * rng.choice([-1, 1], n)

    def region(v, head=b"\x01" * pad, tail=b"\x02" * pad):
        body = encode(v, dtype) if dtype == "bfloat16" else np.asarray(v, f"<f{size}").tobytes()
        return head + body + tail

    tol = Tolerance("r", pad, pad + n * size, dtype, criterion, **params)
    policy = Policy((tol,))
    expected = region(values)
    cases = {
        "same": expected,
        "good": region(values * (1 + good * rng.standard_normal(n))),
        "bad": region(values * (1 + bad * rng.standard_normal(n))),
        "nan": region(np.where(np.arange(n) == n // 2, np.nan, values)),
        "inf": region(np.where(np.arange(n) == 0, np.inf, values)),
        "byte outside": region(values, head=b"\x01" * (pad - 1) + b"\x09"),
        "short": expected[:-1],
    }
    quick = {k: passes(policy, {"r": expected}, {"r": v}) for k, v in cases.items()}
    full = {k: check(policy, {"r": expected}, {"r": v}).passed for k, v in cases.items()}
    assert all(full[k] for k in quick if quick[k]), (quick, full)
    assert quick["same"] and not full["bad"] and not quick["bad"]
    assert quick["good"] and full["good"]
    assert not any(quick[k] for k in ("nan", "inf", "byte outside", "short"))
    assert passes(policy, {"r": expected}, {}) is False


def test_quick_test_keeps_a_margin_at_the_cosine_threshold():
    from kpair.policy.judge import passes

    rng = np.random.default_rng(0)
    e = rng.standard_normal(4096)
    a = e + 0.01 * rng.standard_normal(4096)
    cos = e @ a / (np.linalg.norm(e) * np.linalg.norm(a))
    for threshold, quick in ((cos - 1e-6, True), (cos - 1e-12, False), (cos + 1e-12, False)):
        policy = Policy((Tolerance("r", 0, e.nbytes, "float64", "cosine",
                                   min_cosine=threshold),))
        assert passes(policy, {"r": arr(e, "<f8")}, {"r": arr(a, "<f8")}) is quick
