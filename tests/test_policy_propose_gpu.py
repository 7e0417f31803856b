"""``kpair pair --opt-capture --propose-policy`` on a real GPU: the torch.compile forward bound
to the eager one (tests/test_opt_capture_gpu.py's program) is paired under the policy kpair
proposes from their differences (no looser than KernelBench's atol = rtol = 1e-2, over the
declared output span) and passes under it. The CPU half: tests/test_policy_propose.py.
Skips cleanly without PyTorch with CUDA, cuda-bindings or CUPTI."""

from __future__ import annotations

import json
import sys

import pytest

from test_opt_capture_gpu import torch_gpu  # noqa: F401 (a fixture)
from torch_capture import forwards, kpair

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("body,cols", [("torch.relu(x @ w + b)", 384),
                                       ("torch.relu(x * w + b)", 512)],
                         ids=["matmul", "elementwise"])
def test_the_compiled_forward_gets_a_proposed_policy_and_passes(torch_gpu, tmp_path,  # noqa: F811
                                                                 body, cols):
    from kpair.snapshot import Snapshot

    out = tmp_path / "cap"
    proc = kpair("capture", "-o", str(out), "--range", "eager", "--range", "compiled", "--",
                 sys.executable, "-c", forwards(body, 512, 512, cols))
    assert proc.returncode == 0, proc.stderr
    ranges = {r["name"]: r for r in json.loads((out / "capture.json").read_text())["ranges"]}
    eager, compiled = (out / ranges[n]["snapshot"] for n in ("eager", "compiled"))
    m = Snapshot.open(eager).manifest
    (span,) = m.output_spans
    h = tmp_path / "H"
    proc = kpair("pair", str(eager), "--opt-capture", str(compiled), "--propose-policy",
                 "--propose-runs", "4", "-o", str(h), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    policy = json.loads((h / "capture" / "validation_policy.json").read_text())
    print(json.dumps(doc["proposal"], indent=1))   # the measured errors, for the evidence
    for t in policy["tolerances"]:
        assert t["region"] == span.region and t["range"] == [span.offset,
                                                             span.offset + span.size]
        assert t["atol"] <= 1e-2 and t["rtol"] <= 1e-2
    assert "--propose-policy" in policy["note"]
    proc = kpair("run", str(h), "--json", "--time-cap", "5")
    result = json.loads(proc.stdout)
    assert result["status"] == "pass", result.get("correctness") or result.get("error")
    assert all(t["passed"] is not False for t in result["trust"].values())
