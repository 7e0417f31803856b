"""Device digests stand for bytes (issue 48) on a real GPU: a range over a 1 GiB seeded
``torch.randn`` input writing a 1 GiB output is captured with the input stored as the kernels
that made it (checked on replay by ``digest64`` on the GPU) and the output's post-state kept
as digests only (``--post-digest-over``, default 64 MiB); the snapshot stores under 1% of its
region bytes; ``kpair replay`` reproduces it byte-exact by digest; a corrupted digest is a
mismatch naming the region; a ``Replay`` that needs the bytes makes them from the captured
kernels and checks their sha256. Skips cleanly without PyTorch with CUDA, cuda-bindings or
CUPTI (the CPU half is tests/test_post_digest.py). Run:
python -m pytest -q tests/gpu/test_post_digest_gpu.py -s
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time

import pytest

from torch_capture import capture, kpair, region_at

pytestmark = pytest.mark.gpu

ROWS = 32768   # x 32768 x 8192 float32: 1 GiB; y the same

#: x: 1 GiB of seeded randn, y: zeros (the declared output, 1 GiB, written by the range).
PROGRAM = """
import json, torch, kpair
torch.manual_seed(0)
x = torch.randn(ROWS, 8192, device="cuda")
y = torch.zeros(ROWS, 8192, device="cuda")
torch.cuda.synchronize()
with kpair.mark("scale", outputs=[y]):
    torch.mul(x, 2.0, out=y)
torch.cuda.synchronize()
print(json.dumps({k: [t.data_ptr(), t.nbytes] for k, t in dict(x=x, y=y).items()}))
"""


def test_a_1gib_output_kept_as_a_digest_replays_byte_exact(gpu, tmp_path):
    from kpair.backends import open_device
    from kpair.replay import Replay
    from kpair.snapshot import Snapshot

    t0 = time.monotonic()
    (r,), tensors, (snap,), stderr = capture(tmp_path / "cap", ["scale"],
                                             PROGRAM.replace("ROWS", str(ROWS)),
                                             "--max-region-bytes", "4GiB")
    capture_s = time.monotonic() - t0
    m = snap.manifest
    x, y = region_at(m, tensors["x"][0]), region_at(m, tensors["y"][0])
    assert x.size >= 1 << 30 and y.size >= 1 << 30
    assert x.regen is not None and x.regen.digest64 is not None, (r, stderr)
    assert y.post_is_digest and y.post_blob is None, y
    region_bytes = snap.region_bytes()
    assert snap.stored_bytes() < region_bytes // 100, (snap.stored_bytes(), region_bytes)

    t0 = time.monotonic()
    proc = kpair("replay", "--json", "--runs", "2", str(snap.root))
    replay_s = time.monotonic() - t0
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["status"] == "byte-exact", report
    assert y.name in report["digest_regions"]
    # x was made, checked and kept on the GPU (compared by its chain's digest64 after each
    # run): none of its bytes crossed to the host.
    assert x.name in report["digest_regions"], report

    # What needs the bytes gets them from the captured kernels, checked by sha256.
    with open_device("cuda") as dev:
        replay = Replay(dev, Snapshot.open(snap.root))
        assert hashlib.sha256(replay.expected[y.name]).hexdigest() == y.post_digest.sha256

    # A corrupted digest: a mismatch naming the region (exit 1), the byte count unknown.
    bad = tmp_path / "bad"
    shutil.copytree(snap.root, bad)
    obj = json.loads((bad / "snapshot.json").read_text())
    (reg,) = [g for g in obj["regions"] if g["name"] == y.name]
    reg["post_digest"]["digest64"] = f"{int(reg['post_digest']['digest64'], 16) ^ 1:016x}"
    (bad / "snapshot.json").write_text(json.dumps(obj))
    proc = kpair("replay", "--json", "--runs", "1", str(bad))
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and report["status"] == "mismatch", report
    assert report["differing_regions"] == [y.name]
    print(json.dumps({"region_bytes": region_bytes, "stored_bytes": snap.stored_bytes(),
                      "capture_wall_s": round(capture_s, 2),
                      "replay_wall_s_2_runs": round(replay_s, 2)}))
