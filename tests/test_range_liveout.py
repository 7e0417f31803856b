"""Issue 47's live-out rule on host ranges (kpair.record): when a range declares outputs,
only they are live-out; a region the range writes before reading it (its pre-state does not
matter: run again with it inverted, nothing changes) is scratch, one whose pre-state the
range reads stays inout. Without declared outputs every written region is live-out."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import CSRC
from kpair.backends import open_device
from kpair.record import Recorder
from kpair.replay import reproduce
from kpair.toolchain import compile_shared

N = 32


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    d = tmp_path_factory.mktemp("liveout")
    return (compile_shared(CSRC / "range_ops.c", d / "range.so", flags=("-O2",)),
            compile_shared(CSRC / "regen_ops.c", d / "regen.so", flags=("-O2",)))


def _arrays():
    rng = np.random.default_rng(3)
    return {"a": rng.standard_normal((N, N), dtype=np.float32),
            "b": rng.standard_normal((N, N), dtype=np.float32),
            "bias": rng.standard_normal(N, dtype=np.float32),
            "out": np.zeros((N, N), np.float32),
            "tmp": rng.standard_normal((N, N), dtype=np.float32),
            "ws": rng.standard_normal((N, N), dtype=np.float32)}


def _record(libs, out, x, outputs):
    ops, fill = libs
    with Recorder(out, names=dict(x), outputs=outputs) as r:
        r.call(fill, "kp_fill", [x["tmp"], np.int64(N * N), np.float32(1.0)])  # write only
        r.call(ops, "kp_matmul", [x["a"], x["b"], x["out"], np.int32(N)])
        r.call(ops, "kp_bias", [x["ws"], x["bias"], np.int32(N)])   # ws += bias: reads ws
    return r.snapshot


def test_with_declared_outputs_a_region_written_before_read_is_scratch(libs, tmp_path):
    x = _arrays()
    snap = _record(libs, tmp_path / "s", x, [x["out"]])
    m = snap.manifest
    assert {r.name: r.role for r in m.regions} == {"a": "in", "b": "in", "bias": "in",
                                                   "out": "out", "ws": "inout"}
    assert [s.name for s in m.scratch_regions] == ["tmp"]
    # the arrays hold what the range made (the recorder copies results back)
    np.testing.assert_array_equal(x["tmp"], np.ones((N, N), np.float32))
    with open_device("host") as dev:
        assert reproduce(dev, snap, 2).status == "byte-exact"


def test_without_declared_outputs_every_written_region_is_live_out(libs, tmp_path):
    x = _arrays()
    m = _record(libs, tmp_path / "s", x, []).manifest
    assert {r.name: r.role for r in m.regions}["tmp"] == "inout"
    assert m.scratch_regions == ()


def test_a_declared_output_already_holding_its_result_is_out_with_its_span(libs, tmp_path):
    # A second pass: the first recording copied its results back into the arrays, so the
    # range writes into `out` what it already holds. Declared, it is still the output.
    x = _arrays()
    _record(libs, tmp_path / "first", x, [x["out"]])
    before = x["out"].copy()
    m = _record(libs, tmp_path / "second", x, [x["out"]]).manifest
    np.testing.assert_array_equal(x["out"], before)
    assert {r.name: r.role for r in m.regions}["out"] == "out"
    assert [(o.region, o.offset, o.size) for o in m.output_spans] == [
        ("out", 0, x["out"].nbytes)]
    assert _record(libs, tmp_path / "none", _arrays(), []).manifest.output_spans == ()
