"""``kpair optimize --range`` on a real GPU, with kpair's retunes of the compiled kernels (the
CPU half is tests/test_optimize_range.py). One PyTorch program marks an eager forward and its
``torch.compile`` forward over the same tensors (as tests/test_opt_capture_gpu.py); both are
captured in one run. The compiled range's Triton launch carries its Triton metadata
(``provenance.ops[i].triton``), so ``optimize_range`` judges the compiled capture
(``inductor-default``) and kpair's retunes of its Triton kernel (``kpair-retune``: the kernel
recompiled under other configs and put in place of that plan launch), all on the eager range
under KernelBench's tolerance, and publishes the best correct one or refuses with the reason.

Not run where it was written (no GPU): ``python -m pytest -q tests/test_optimize_range_gpu.py``
on an H100 or H200 with PyTorch, Triton, cuda-bindings and CUPTI."""

from __future__ import annotations

import json

import pytest

from torch_capture import capture, forwards

pytestmark = pytest.mark.gpu

PROGRAM = forwards("torch.relu(x * w + b) * 0.5", 2048, 2048, 2048)


@pytest.fixture(scope="module")
def torch_gpu(cuda, gpu):
    """An sm_90 device (``cuda``) that capture can run on (conftest's ``gpu``)."""
    pytest.importorskip("triton")


def test_optimize_range_judges_the_compiled_range_and_its_retunes(torch_gpu, tmp_path):
    from kpair.optimize import OptimizeOptions, RangeCandidate, optimize_range
    from kpair.optimize.ranges import FILE, RangeCandidates
    from kpair.optimize.strategies.captured import RETUNE
    from kpair.optimize.workbench import quick_options
    from kpair.options import RunOptions
    from kpair.release import load_index

    snaps = capture(tmp_path / "cap", ["eager", "compiled"], PROGRAM).snaps
    eager, compiled = (s.root for s in snaps)
    ops = snaps[1].manifest.provenance["ops"]
    assert any(isinstance(o.get("triton"), dict) for o in ops), \
        "range capture recorded no Triton metadata for the compiled kernel"
    y = next(r for r in snaps[0].manifest.regions if r.role == "out")
    policy = tmp_path / "policy.json"   # KernelBench's own: atol = rtol = 1e-2
    policy.write_text(json.dumps({
        "schema": "kpair.validation_policy", "schema_version": 1, "default": "byte-exact",
        "note": "fused and retuned code rounds differently: KernelBench's own tolerance",
        "tolerances": [{"region": y.name, "range": [0, y.size], "dtype": "float32",
                        "criterion": "allclose", "atol": 1e-2, "rtol": 1e-2}]}))
    run = RunOptions(time_cap_s=3.0, timeout_s=300, seed=1)
    options = OptimizeOptions(strategies=(), policy=policy, triton_limit=4, keep=2,
                              prune=quick_options(run, max_blocks=16, time_cap_s=0.5),
                              rungs=(), confirm=run, publish=run)
    rel, work = tmp_path / "rel", tmp_path / "work"
    summary = optimize_range(eager, [RangeCandidate("inductor-default", compiled)], rel,
                             options, name="relu_mul_add", work=work)
    (o,) = summary.outcomes
    assert o.status in ("published", "refused"), o.line
    record = RangeCandidates.read(work / "ops" / "level2-relu_mul_add" / "provenance" / FILE)
    by = {c.label: c for c in record.candidates}
    assert by["inductor-default"].status == "pass", by["inductor-default"]
    retunes = [c for c in record.candidates if c.producer == RETUNE]
    assert retunes and all(c.of == "inductor-default" for c in retunes)
    judged = [c for c in retunes if c.status in ("pass", "fail", "error")]
    assert judged, [c.reason for c in retunes]   # at least one retune built and judged
    assert any(c.status == "pass" for c in judged), [c.reason for c in judged]
    if o.status == "published":
        assert o.producer in ("inductor-default", RETUNE)
        row = next(r for r in load_index(rel).operators if r.name == "relu_mul_add")
        assert row.range.ops >= 2 and row.plan_launches >= 1
        assert record.winner == o.producer
        assert row.producer == ("inductor-default" if o.producer == "inductor-default"
                                else "kpair-search")   # the index's v4 field
    print(json.dumps([{"label": c.label, "status": c.status, "speedup": c.speedup}
                      for c in record.candidates], indent=1))
