"""Memset and copy launches of a plan on CUDA: replayed on the replay stream and timed in
one event pair with the kernels (``CudaDevice.timed_sequence``). Needs an sm_90 GPU
(tests/data's kp_add is built for it)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import run_json
from torch_capture import DATA, record_kp_add

pytestmark = pytest.mark.gpu


def test_a_plan_with_a_memset_and_a_copy_passes_on_cuda(cuda, tmp_path):
    """kp_add writes a scratch buffer, a copy moves it to c, after a memset of c."""
    from kpair.harness import create_harness
    from kpair.pipeline import RunOptions

    n = 1 << 20
    record_kp_add(tmp_path / "s", n)
    d = tmp_path / "plan"
    d.mkdir()
    (d / "k.cubin").write_bytes((DATA / "kp_add_sm90.cubin").read_bytes())
    (d / "opt.plan.json").write_text(json.dumps({
        "schema": "kpair.plan", "schema_version": 1,
        "scratch": [{"name": "t", "size": n * 4}],
        "launches": [
            {"kind": "memset", "dst": {"bind": "region", "name": "c"}, "value": 0,
             "element_size": 4, "count": n},
            {"code": "k.cubin", "kernel": "kp_add", "grid": [n // 256, 1, 1],
             "block": [256, 1, 1], "args": [
                 {"bind": "region", "name": "a"}, {"bind": "region", "name": "b"},
                 {"bind": "scratch", "name": "t"},
                 {"bind": "scalar", "kind": "i32", "value": n}]},
            {"kind": "copy", "dst": {"bind": "region", "name": "c"},
             "src": {"bind": "scratch", "name": "t"}, "size": n * 4}]}))
    h = create_harness(tmp_path / "s", tmp_path / "H", plan=d / "opt.plan.json")
    r = run_json(h.root, RunOptions(time_cap_s=2.0, timeout_s=300))
    assert r["status"] == "pass", r.get("correctness") or r.get("error")
    assert r["replay"]["plan_launches"] == 3


def test_a_timed_sequence_counts_its_copy(cuda):
    """A Program of a memset and a 512 MiB copy: one event pair around both, which cannot
    take less than moving 1 GiB at 5 TB/s (above any H100's or H200's bandwidth)."""
    from kpair.backends import open_device
    from kpair.program import CopyStep, MemsetStep, Program, ProgramDevice
    from kpair.snapshot import Launch

    size = 512 << 20
    with open_device("cuda") as dev:
        mapping = dev.map([(1 << 40, (1 << 40) + 2 * size)], relocate=True)
        base = (1 << 40) + mapping.delta
        pd = ProgramDevice(dev)
        program = Program("copy", [MemsetStep(base + size, size, 7, 4),
                                   CopyStep(base, base + size, size)], [])
        t = pd.timed_launch(program, Launch((1, 1, 1), (1, 1, 1)), b"", ())
        assert t >= 2 * size / 5e12
        assert dev.read(base, 16) == np.full(4, 7, np.uint32).tobytes()
