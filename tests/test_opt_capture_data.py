"""``kpair pair SNAP --opt-capture SNAP2`` where SNAP2 holds memsets (as Inductor zeroes a
buffer before an atomic reduction): each becomes a plan memset launch on what its region is
bound to, the candidate passes; a memset into memory SNAP only reads is refused at pair time.

A host range records calls only, so SNAP2's memsets are added to its recorded operations
(``snapshot.json``): one zeroing its output before the fused call (its pre-state is zero:
the post-state stays true), one zeroing its scratch row after it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import CSRC, record_mlp_range, run_json
from kpair.bind import BindError, bind_capture
from kpair.pipeline import RunOptions
from kpair.record import Recorder
from kpair.snapshot import Snapshot
from kpair.toolchain import compile_shared

N = 32


def _kpair(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kpair", *args], capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("optcap-data")
    lib = compile_shared(CSRC / "range_ops.c", d / "ops.so", flags=("-O2", "-g"))
    rng = np.random.default_rng(3)
    x = {"a": rng.standard_normal((N, N), dtype=np.float32),
         "b": rng.standard_normal((N, N), dtype=np.float32),
         "bias": rng.standard_normal(N, dtype=np.float32),
         "out": np.zeros((N, N), np.float32), "out2": np.zeros((N, N), np.float32),
         "row": np.zeros(N, np.float32)}
    ref = record_mlp_range(lib, d / "ref", x, N)
    with Recorder(d / "cand", names={k: x[k] for k in ("a", "b", "bias", "out2", "row")},
                  outputs=[x["out2"]], scratch=[x["row"]]) as r:
        r.call(lib, "kp_fused", [np.int32(N), x["bias"], x["a"], x["b"], x["out2"],
                                 x["row"]])
    np.testing.assert_array_equal(x["out"], x["out2"])
    return {"dir": d, "lib": lib, "x": x, "ref": ref, "cand": r.snapshot}


def _with_memsets(lab: dict, name: str, first: str = "out2") -> Snapshot:
    """SNAP2 copied to ``name`` with a memset of region ``first`` (to 0) before its call and
    one of its scratch row after it."""
    import shutil

    root = lab["dir"] / name
    shutil.copytree(lab["cand"].root, root)
    doc = json.loads((root / "snapshot.json").read_text())
    where = {r["name"]: r for r in doc["regions"]}
    row = doc["scratch"][0]
    target = where[first]
    doc["ops"] = [{"kind": "memset", "dst": target["address"], "size": target["size"],
                   "value": 0, "element_size": 4},
                  *doc["ops"],
                  {"kind": "memset", "dst": row["address"], "size": row["size"], "value": 0,
                   "element_size": 1}]
    (root / "snapshot.json").write_text(json.dumps(doc))
    return Snapshot.open(root)


def test_memsets_are_bound_to_what_their_regions_are_bound_to(lab):
    bound = bind_capture(lab["ref"], _with_memsets(lab, "bind"))
    kinds = [x.kind for x in bound.plan.launches]
    assert kinds == ["memset", "kernel", "memset"]
    zero, _, scratch = bound.plan.launches
    assert (zero.dst.name, zero.dst.offset, zero.dst.access) == ("out", 0, "write")
    assert (zero.count, zero.element_size, zero.value) == (N * N, 4, 0)
    assert (type(scratch.dst).__name__, scratch.dst.name, scratch.count) == \
        ("ScratchArg", "row", N * 4)


def test_a_candidate_with_memsets_is_bound_and_passes(lab):
    cand = _with_memsets(lab, "pass")
    out = lab["dir"] / "H"
    proc = _kpair("pair", str(lab["ref"].root), "--opt-capture", str(cand.root), "-o",
                  str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["plan_launches"] == 3
    r = run_json(out, RunOptions(time_cap_s=2.0, max_blocks=32, timeout_s=300))
    assert r["status"] == "pass", r.get("correctness") or r.get("error")
    assert r["replay"]["plan_launches"] == 3
    assert all(t["passed"] is not False for t in r["trust"].values())


def test_a_memset_into_memory_ref_only_reads_is_refused(lab, tmp_path):
    cand = _with_memsets(lab, "live-in", first="bias")
    proc = _kpair("pair", str(lab["ref"].root), "--opt-capture", str(cand.root), "-o",
                  str(tmp_path / "H"))
    assert proc.returncode == 3, proc.stderr
    assert "launch 0 (memset) dst: region 'bias' is live-in" in proc.stderr
    assert not Path(tmp_path / "H").exists()


# ------------------------------------------------- outputs bound by their declared spans


@pytest.fixture(scope="module")
def blocks(tmp_path_factory, lab) -> dict:
    """SNAP2 writes its output as a tensor at the start of a larger block (an allocator's
    block around it, 192 bytes more; a second call takes the block's own pointer): both
    snapshots declare their outputs as spans, the tensors' own bytes."""
    d = tmp_path_factory.mktemp("optcap-span")
    lib, x = lab["lib"], lab["x"]   # SNAP's live-in arrays: the same memory
    block = np.zeros(N * N + 48, np.float32)
    view = block[:N * N].reshape(N, N)
    row = np.zeros(N, np.float32)
    with Recorder(d / "cand", names={"a": x["a"], "b": x["b"], "bias": x["bias"],
                                     "blk": block, "row": row},
                  outputs=[view], scratch=[row]) as r:
        r.call(lib, "kp_fused", [np.int32(N), x["bias"], x["a"], x["b"], view, row])
        r.call(lib, "kp_relu", [block, np.int32(1)])   # ReLU again of element 0: the same
    assert r.snapshot.manifest.region("blk").size == N * N * 4 + 192
    cand = _declare(r.snapshot.root, "blk", 0)
    ref_root = d / "ref"
    import shutil

    shutil.copytree(lab["ref"].root, ref_root)
    return {"dir": d, "ref": _declare(ref_root, "out", 0), "cand": cand}


def _declare(root: Path, region: str, offset: int) -> Snapshot:
    """The snapshot at ``root`` declaring its output as the span of the tensor (where the
    recorder wrote no spans, they are written here as a capture writes them)."""
    doc = json.loads((root / "snapshot.json").read_text())
    span = {"region": region, "offset": offset, "size": N * N * 4}
    doc.setdefault("outputs", [span])
    assert doc["outputs"] == [span]
    (root / "snapshot.json").write_text(json.dumps(doc))
    return Snapshot.open(root)


def test_outputs_are_bound_by_their_declared_spans(blocks):
    bound = bind_capture(blocks["ref"], blocks["cand"])
    (b,) = [b for b in bound.bindings if b.region == "blk"]
    assert (b.to, b.name, b.offset, b.spans, b.why) == \
        ("region", "out", 0, ((0, N * N * 4),), "declared output")
    assert [[(r.name, r.offset_in_region) for r in launch.relocations if r.name == "out"]
            for launch in bound.plan.launches] == [[("out", 0)], [("out", 0)]]
    out = blocks["dir"] / "H"
    proc = _kpair("pair", str(blocks["ref"].root), "--opt-capture",
                  str(blocks["cand"].root), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    r = run_json(out, RunOptions(time_cap_s=2.0, max_blocks=32, timeout_s=300))
    assert r["status"] == "pass", r.get("correctness") or r.get("error")


def test_a_span_of_another_size_is_refused(blocks, tmp_path):
    import shutil

    shutil.copytree(blocks["cand"].root, tmp_path / "c")
    doc = json.loads((tmp_path / "c" / "snapshot.json").read_text())
    doc["outputs"][0]["size"] -= 4
    (tmp_path / "c" / "snapshot.json").write_text(json.dumps(doc))
    with pytest.raises(BindError, match=rf"blk: different size \(SNAP2's output is "
                                        rf"{N * N * 4 - 4} bytes, SNAP's 'out' is "):
        bind_capture(blocks["ref"], Snapshot.open(tmp_path / "c"))


def test_a_memset_of_the_whole_block_is_refused(blocks, tmp_path):
    """Only the declared output is bound: SNAP2 writing its block around it cannot land."""
    import shutil

    shutil.copytree(blocks["cand"].root, tmp_path / "c")
    doc = json.loads((tmp_path / "c" / "snapshot.json").read_text())
    blk = next(r for r in doc["regions"] if r["name"] == "blk")
    doc["ops"].insert(0, {"kind": "memset", "dst": blk["address"], "size": blk["size"],
                          "value": 0, "element_size": 4})
    (tmp_path / "c" / "snapshot.json").write_text(json.dumps(doc))
    with pytest.raises(BindError, match=r"SNAP2 operation 0 \(memset\) dst addresses byte 0 "
                                        r"of 'blk', outside the bytes of it that are bound, "
                                        rf"\[0, \+{N * N * 4}\)"):
        bind_capture(blocks["ref"], Snapshot.open(tmp_path / "c"))
