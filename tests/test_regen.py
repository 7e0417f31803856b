"""Regenerable regions on the host backend (issue 48): a range whose inputs a seeded
generator and a fill made is stored as the calls that made them (tests/csrc/regen_ops.c),
replays byte-exact from a snapshot of a few KiB, and refuses a tampered or broken chain by
name before ref or opt launches; inputs rooted in host data stay bytes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import CSRC
from kpair import release
from kpair.backends import open_device
from kpair.backends.base import digest64
from kpair.cli import main as kpair
from kpair.errors import SnapshotFormatError, UsageError
from kpair.formats import convert
from kpair.pipeline import RunOptions
from kpair.record import Recorder
from kpair.regen import regenerate
from kpair.replay import Replay, reproduce
from kpair.snapshot import BlobRef, Manifest, Snapshot, sha256
from kpair.snapshot.store import Compressors, store_blob
from kpair.sol import snapshot_traffic
from kpair.toolchain import compile_shared

ROWS, COLS = 512, 1024          # 2 MiB per float32 input
N = ROWS * COLS
SEED = 1234
QUICK = RunOptions(time_cap_s=0.3, min_blocks=8, timeout_s=120, replicates=1)


def _splitmix(seed: int, n: int) -> np.ndarray:
    """kp_fill_seeded in numpy: the same values the C generator makes."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + np.arange(n, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(40)).astype(np.float32) * np.float32(2.0 / 16777216.0) \
        - np.float32(1.0)


def _record(lib: Path, out: Path, **options) -> tuple[Snapshot, dict]:
    """a = seeded, b = fill(0.5), c = 2a + b (setup), then the range: out1 = rowdot(a, b),
    out2 = rowdot(c, a)."""
    a, b, c = (np.zeros((ROWS, COLS), np.float32) for _ in range(3))
    o1, o2 = np.zeros(ROWS, np.float32), np.zeros(ROWS, np.float32)
    with Recorder(out, names={"a": a, "b": b, "c": c, "out1": o1, "out2": o2},
                  outputs=[o1, o2], **options) as r:
        r.call(lib, "kp_fill_seeded", [a, np.int64(N), np.uint64(SEED), np.int64(0)])
        r.call(lib, "kp_fill", [b, np.int64(N), np.float32(0.5)])
        r.call(lib, "kp_axpby", [c, a, b, np.int64(N), np.float32(2.0)])
        with r.range("forward"):
            r.call(lib, "kp_rowdot", [a, b, o1, np.int32(ROWS), np.int32(COLS)])
            r.call(lib, "kp_rowdot", [c, a, o2, np.int32(ROWS), np.int32(COLS)])
    return r.snapshot, {"a": a, "b": b, "c": c, "out1": o1, "out2": o2}


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("regen")
    lib = compile_shared(CSRC / "regen_ops.c", d / "ops.so", flags=("-O2", "-g"))
    snap, arrays = _record(lib, d / "snap")
    return {"dir": d, "lib": lib, "snap": snap.root, "arrays": arrays}


def _copy(lab: dict, tmp_path: Path, name: str = "copy") -> Path:
    dst = tmp_path / name
    shutil.copytree(lab["snap"], dst)
    return dst


def _edit(root: Path, change) -> None:
    path = root / "snapshot.json"
    obj = json.loads(path.read_text())
    change(obj)
    path.write_text(json.dumps(obj))


class Counting:
    """A device that counts the launches of each kernel name (what ran before a refusal)."""

    def __init__(self, inner):
        self.inner, self.launched = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def launch(self, kernel, launch, kernarg, params):
        self.launched.append(kernel.name)
        return self.inner.launch(kernel, launch, kernarg, params)


# --------------------------------------------------------------------------- capture


def test_inputs_made_by_a_generator_and_a_fill_are_stored_as_chains(lab):
    snap = Snapshot.open(lab["snap"])
    m = snap.manifest
    assert m.schema_version == 2
    regions = {r.name: r for r in m.regions}
    assert [n for n, r in regions.items() if r.regenerable] == ["a", "b", "c"]
    a, b, c = regions["a"].regen, regions["b"].regen, regions["c"].regen
    assert [op.code.kernel_name for op in a.ops] == ["kp_fill_seeded"] and a.reads == ()
    assert [op.code.kernel_name for op in b.ops] == ["kp_fill"] and b.reads == ()
    assert [op.code.kernel_name for op in c.ops] == ["kp_axpby"] and set(c.reads) == {"a", "b"}
    # Unchanged inputs keep no post blob either; the outputs are bytes, as before.
    assert all(regions[n].post_blob is None and regions[n].role == "in" for n in "abc")
    assert regions["out1"].pre_blob is not None and regions["out1"].role == "out"
    # The region's digest is the bytes the generator makes (checked against numpy).
    want = _splitmix(SEED, N)
    assert a.sha256 == sha256(want.tobytes()) == a.digests[-1]
    assert np.array_equal(lab["arrays"]["a"].ravel(), want)   # results copied back
    assert np.array_equal(lab["arrays"]["c"].ravel(), np.float32(2.0) * want + np.float32(0.5))
    # A few KiB on disk for 6 MiB of regions: the code object, the kernargs, the outputs.
    assert snap.region_bytes() >= 6 << 20
    assert snap.stored_bytes() <= snap.region_bytes() // 100
    assert snap.regenerable_bytes() == 3 * N * 4
    snap.verify()   # every chain's blobs are checked like any other


def test_store_bytes_forces_bytes(lab, tmp_path):
    snap, _ = _record(lab["lib"], tmp_path / "s", store_bytes=True)
    assert snap.manifest.schema_version == 1
    assert not any(r.regenerable for r in snap.manifest.regions)
    assert snap.stored_bytes() > 4 * N  # the seeded input is incompressible


def test_a_chain_rooted_in_host_data_is_stored_as_bytes(lab, tmp_path):
    """h comes from numpy (host data); scaling it in place, or mixing it into d, does not make
    either regenerable. g, filled in setup and scaled in place, is a two-call chain."""
    lib = lab["lib"]
    h = np.random.default_rng(0).standard_normal((ROWS, COLS)).astype(np.float32)
    d, g = np.zeros_like(h), np.zeros_like(h)
    o = np.zeros(ROWS, np.float32)
    with Recorder(tmp_path / "s", names={"h": h, "d": d, "g": g, "o": o}, outputs=[o]) as r:
        r.call(lib, "kp_scale", [h, np.int64(N), np.float32(3.0)])
        r.call(lib, "kp_fill", [g, np.int64(N), np.float32(2.0)])
        r.call(lib, "kp_scale", [g, np.int64(N), np.float32(0.25)])
        r.call(lib, "kp_axpby", [d, h, g, np.int64(N), np.float32(1.0)])
        with r.range():
            r.call(lib, "kp_rowdot", [h, d, o, np.int32(ROWS), np.int32(COLS)])
            r.call(lib, "kp_rowdot", [g, d, o, np.int32(ROWS), np.int32(COLS)])
    regions = {x.name: x for x in r.snapshot.manifest.regions}
    assert not regions["h"].regenerable and not regions["d"].regenerable
    assert [op.code.kernel_name for op in regions["g"].regen.ops] == ["kp_fill", "kp_scale"]
    assert len(regions["g"].regen.digests) == 2
    with open_device("host") as dev:
        assert reproduce(dev, Snapshot.open(tmp_path / "s"), 2).status == "byte-exact"


def test_a_recorder_refuses_a_call_after_the_range(lab, tmp_path):
    a = np.zeros(64, np.float32)
    with pytest.raises(UsageError, match="after the range"), Recorder(tmp_path / "s") as r:
        with r.range():
            r.call(lab["lib"], "kp_fill", [a, np.int64(64), np.float32(1.0)])
        r.call(lab["lib"], "kp_fill", [a, np.int64(64), np.float32(1.0)])
    assert not (tmp_path / "s").exists()


# --------------------------------------------------------------------------- replay


@pytest.mark.parametrize("relocate", [False, True])
def test_regenerated_snapshot_replays_byte_exact(lab, relocate):
    snap = Snapshot.open(lab["snap"])
    with open_device("host") as dev:
        replay = Replay(dev, snap, relocate=relocate)
        assert replay.pre["a"] == _splitmix(SEED, N).tobytes()
        assert set(snap.regenerated) == {"a", "b", "c"}
        got = replay.run(replay.load_range())
    assert got == replay.expected
    with open_device("host") as dev:   # placed again from the same Snapshot: made once
        counting = Counting(dev)
        again = Replay(counting, snap, relocate=relocate)
        assert counting.launched == [] and again.pre == replay.pre
    assert np.frombuffer(got["out1"], np.float32).tobytes() == lab["arrays"]["out1"].tobytes()
    with open_device("host") as dev:
        rep = reproduce(dev, Snapshot.open(lab["snap"]), 2)
    assert rep.status == "byte-exact" and rep.ops == 2


def _tamper_seed(root: Path) -> None:
    """Change the seed scalar in a's stored kernarg: a new blob, the manifest pointing at it
    (the snapshot stays well-formed: only the chain's meaning changes)."""
    obj = json.loads((root / "snapshot.json").read_text())
    (reg,) = [r for r in obj["regions"] if r["name"] == "a"]
    ref = reg["regen"]["ops"][0]["kernarg"]["blob"]
    data = bytearray(Snapshot.open(root).read_blob(_blob(ref), "kernarg"))
    assert int.from_bytes(data[16:24], "little") == SEED
    data[16:24] = (SEED + 1).to_bytes(8, "little")
    new = store_blob(root / "blobs", bytes(data), Compressors(3))
    reg["regen"]["ops"][0]["kernarg"]["blob"] = BlobRef(
        f"blobs/{new.path.name}", len(data), new.digest, new.compression).to_json()
    (root / "snapshot.json").write_text(json.dumps(obj))


def _blob(obj: dict) -> BlobRef:
    return convert(obj, BlobRef)


def test_a_tampered_seed_is_refused_by_name_before_any_launch(lab, tmp_path):
    root = _copy(lab, tmp_path)
    _tamper_seed(root)
    Snapshot.open(root).verify()   # every blob is intact: only a replay can tell
    with open_device("host") as dev:
        counting = Counting(dev)
        with pytest.raises(SnapshotFormatError) as e:
            Replay(counting, Snapshot.open(root))
    msg = str(e.value)
    assert "region 'a'" in msg and "operation 0 (kp_fill_seeded)" in msg
    assert "regions[0].regen.ops[0]" in msg
    assert "kp_rowdot" not in counting.launched   # neither ref nor opt ran
    # The CLI: the isolated replay says so in one line, exit 3 (a bad snapshot).
    proc = subprocess.run([sys.executable, "-m", "kpair", "replay", str(root)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stdout.count("\n") == 1 and proc.stdout.startswith("error")
    assert "region 'a'" in proc.stdout and "kp_fill_seeded" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def two(lab, tmp_path_factory) -> Path:
    """g = fill(2.0) then g *= 0.25 in place: a chain of two calls."""
    d = tmp_path_factory.mktemp("two")
    g, o = np.zeros((ROWS, COLS), np.float32), np.zeros(ROWS, np.float32)
    with Recorder(d / "s", names={"g": g, "o": o}, outputs=[o]) as r:
        r.call(lab["lib"], "kp_fill", [g, np.int64(N), np.float32(2.0)])
        r.call(lab["lib"], "kp_scale", [g, np.int64(N), np.float32(0.25)])
        with r.range():
            r.call(lab["lib"], "kp_rowdot", [g, g, o, np.int32(ROWS), np.int32(COLS)])
    regen = r.snapshot.manifest.region("g").regen
    assert [op.code.kernel_name for op in regen.ops] == ["kp_fill", "kp_scale"]
    return d / "s"


class Digesting(Counting):
    """Counts ``digest`` calls too: a region checked where its memory is."""

    def __init__(self, inner):
        super().__init__(inner)
        self.digested = []

    def digest(self, address, size, key=0):
        self.digested.append(size)
        return self.inner.digest(address, size, key)


def test_chains_record_digest64_and_replay_checks_by_it_on_the_device(lab, tmp_path):
    snap = Snapshot.open(lab["snap"])
    a = snap.manifest.region("a").regen
    want = _splitmix(SEED, N).tobytes()
    assert a.digest64 == f"{digest64(want):016x}" == a.digests64[-1]
    assert len(snap.manifest.region("c").regen.digests64) == 1
    with open_device("host") as dev:
        d = Digesting(dev)
        replay = Replay(d, Snapshot.open(lab["snap"]))
        assert replay.pre["a"] == want
    assert d.digested == [N * 4] * 3   # a, b and c, each checked once by its digest64

    # The recorded digest64 wrong (the sha256 right): the digest is what is checked.
    root = _copy(lab, tmp_path, "bad-digest")

    def wrong(o):
        chain = o["regions"][0]["regen"]
        chain["digest64"] = chain["digests64"][-1] = "0123456789abcdef"
    _edit(root, wrong)
    with open_device("host") as dev, pytest.raises(SnapshotFormatError) as e:
        Replay(Counting(dev), Snapshot.open(root))
    msg = str(e.value)
    assert "region 'a' does not regenerate to its digest64 0123456789abcdef" in msg
    assert "operation 0 (kp_fill_seeded)" in msg and "digest64 after it" in msg

    # A snapshot written before digest64 existed: checked by its sha256, read back.
    root = _copy(lab, tmp_path, "older")

    def older(o):
        for r in o["regions"]:
            if "regen" in r:
                del r["regen"]["digest64"], r["regen"]["digests64"]
    _edit(root, older)
    with open_device("host") as dev:
        d = Digesting(dev)
        assert reproduce(d, Snapshot.open(root), 2).status == "byte-exact"
    assert d.digested == []
    _tamper_seed(root)
    with open_device("host") as dev, pytest.raises(SnapshotFormatError,
                                                    match=r"its sha256 .*operation 0"):
        Replay(dev, Snapshot.open(root))


def test_a_missing_link_is_refused(lab, two, tmp_path):
    # The fill removed from g's chain (with its digest): refused at the scale, by name.
    root = tmp_path / "no-fill"
    shutil.copytree(two, root)

    _edit(root, _drop_fill)
    with open_device("host") as dev:
        counting = Counting(dev)
        with pytest.raises(SnapshotFormatError) as e:
            Replay(counting, Snapshot.open(root))
    msg = str(e.value)
    assert "region 'g'" in msg and "operation 0 (kp_scale)" in msg, msg
    assert "kp_rowdot" not in counting.launched
    # Removed without its digest: the reader refuses the chain outright.
    _edit(root, lambda o: o["regions"][0]["regen"]["digests"].insert(0, "0" * 64))
    with pytest.raises(SnapshotFormatError, match=r"regions\[0\]\.regen\.digests"):
        Snapshot.open(root)

    # A code object blob gone: refused by field before anything runs.
    root = _copy(lab, tmp_path, "no-blob")
    code = Snapshot.open(lab["snap"]).manifest.region("a").regen.ops[0].code.blob
    (root / code.path).unlink()
    with open_device("host") as dev:
        counting = Counting(dev)
        with pytest.raises(SnapshotFormatError,
                           match=r"regions\[0\]\.regen\.ops\[0\]\.code_object\.blob"):
            Replay(counting, Snapshot.open(root))
    assert counting.launched == []

    # A chain reading a region the snapshot lacks, or one stored as bytes: refused on read.
    root = _copy(lab, tmp_path, "no-region")
    _edit(root, lambda o: o["regions"][2]["regen"].update(reads=["a", "zz"]))
    with pytest.raises(SnapshotFormatError, match=r"regions\[2\]\.regen\.reads\[1\].*'zz'"):
        Snapshot.open(root)
    _edit(root, lambda o: o["regions"][2]["regen"].update(reads=["a", "out1"]))
    with pytest.raises(SnapshotFormatError, match="out1.*not regenerable"):
        Snapshot.open(root)


def test_a_chain_pointing_outside_its_regions_is_refused(lab, tmp_path):
    """c's chain reads a and b; told it reads only a, its pointer to b is refused by name."""
    root = _copy(lab, tmp_path)
    _edit(root, lambda o: o["regions"][2]["regen"].update(reads=["a"]))
    with open_device("host") as dev, pytest.raises(SnapshotFormatError,
                                                    match=r"argument 2.*points at") as e:
        Replay(Counting(dev), Snapshot.open(root))
    assert "regions[2].regen.ops[0].kernarg.params[2]" in str(e.value)


def test_v1_reader_rules(lab, tmp_path):
    root = _copy(lab, tmp_path)
    _edit(root, lambda o: o.update(schema_version=1))
    with pytest.raises(SnapshotFormatError, match=r"regions\[0\]\.regen.*schema_version 2"):
        Snapshot.open(root)
    obj = json.loads((lab["snap"] / "snapshot.json").read_text())
    del obj["regions"][0]["regen"]
    with pytest.raises(SnapshotFormatError, match="exactly one"):
        Manifest.from_json(obj)


def test_pre_bytes_of_a_chain_need_a_device(lab):
    snap = Snapshot.open(lab["snap"])
    with pytest.raises(SnapshotFormatError, match="made on a device"):
        snap.pre(0)
    assert snap.known_pre(0) is None and snap.known_pre(3) is not None
    # The bytes a kernel must move need none: the chains' regions are read whole.
    t = snapshot_traffic(snap)
    assert t.read_bytes == 3 * N * 4 and [x.role for x in t.regions][:3] == ["read"] * 3
    with open_device("host") as dev:
        m = snap.manifest
        dev.map([(r.address, r.end) for r in m.regions])
        made = regenerate(dev, snap, [r.address for r in m.regions])
    assert set(made) == {"a", "b", "c"} and snap.pre(0) == made["a"] == snap.post(0)


# --------------------------------------------------------------------------- release


def _plan(lab: dict, tmp_path: Path) -> Path:
    d = tmp_path / "plan"
    d.mkdir()
    (d / "ops.so").write_bytes(lab["lib"].read_bytes())

    def launch(x: str, y: str, out: str) -> dict:
        return {"code": "ops.so", "kernel": "kp_rowdot", "args": [
            {"bind": "region", "name": x}, {"bind": "region", "name": y},
            {"bind": "region", "name": out, "access": "write"},
            {"bind": "scalar", "kind": "i32", "value": ROWS},
            {"bind": "scalar", "kind": "i32", "value": COLS}]}

    plan = {"schema": "kpair.plan", "schema_version": 1,
            "launches": [launch("a", "b", "out1"), launch("c", "a", "out2")]}
    (d / "opt.plan.json").write_text(json.dumps(plan))
    return d / "opt.plan.json"


def test_a_release_of_a_regenerable_harness_verifies_and_inspect_shows_bytes(lab, tmp_path,
                                                                              capsys):
    # kpair pair plans its differential runs without a device: the chains' regions are
    # read-only by their digests.
    assert kpair(["pair", str(lab["snap"]), "-o", str(tmp_path / "H"), "--plan",
                  str(_plan(lab, tmp_path)), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {"resample a as float32", "resample b as float32", "resample c as float32"} <= \
        set(doc["differential"]["mutations"])
    root = tmp_path / "rel"
    added = release.add_operator(root, tmp_path / "H", level=1, name="1_rowdot",
                                 options=QUICK, allow_slower=True)
    assert added.added, added
    (row,) = release.load_index(root).operators
    assert row.status == "pass" and row.correctness.mode == "byte-exact"
    assert row.region_bytes >= 6 << 20 and row.stored_bytes <= row.region_bytes // 100
    capsys.readouterr()
    assert kpair(["verify", str(root), "--time-cap", "0.3", "--min-blocks", "8",
                  "--timeout", "120", "--replicates", "1"]) == 0
    out = capsys.readouterr().out
    assert "level1/1_rowdot: reproduced" in out or "level1/1_rowdot: NOT reproduced" in out
    (again,) = release.load_index(root).operators
    assert again.verifications[0].verdict == "pass"
    harness = root / "level1" / "1_rowdot" / "harness"
    assert kpair(["inspect", str(harness), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    snap = doc["snapshot"]
    assert snap["region_bytes"] == row.region_bytes
    assert snap["stored_bytes"] <= snap["region_bytes"] // 100


def test_a_memset_in_a_chain(lab, tmp_path):
    """b (every float 0.5) made by a memset of the word 0x3F000000 instead of kp_fill; a
    memset of another value is refused naming the memset."""
    root = _copy(lab, tmp_path)
    b = Snapshot.open(root).manifest.region("b")

    def memset(value: int):
        def change(o):
            (reg,) = [r for r in o["regions"] if r["name"] == "b"]
            reg["regen"]["ops"] = [{"kind": "memset", "dst": hex(b.address), "size": b.size,
                                    "value": value, "element_size": 4}]
        return change
    _edit(root, memset(0x3F000000))
    with open_device("host") as dev:
        counting = Counting(dev)
        replay = Replay(counting, Snapshot.open(root), relocate=True)
        assert "kp_fill" not in counting.launched
        assert replay.pre["b"] == np.full(N, 0.5, np.float32).tobytes()
        assert replay.run(replay.load_range()) == replay.expected
    _edit(root, memset(0x3F800000))
    with open_device("host") as dev, pytest.raises(SnapshotFormatError,
                                                    match=r"region 'b'.*operation 0 \(memset\)"):
        Replay(dev, Snapshot.open(root))


def test_inspect_names_what_made_each_region(lab, capsys):
    assert kpair(["inspect", str(lab["snap"])]) == 0
    out = capsys.readouterr().out
    assert "(schema v2, complete)" in out
    assert "unchanged (in), made by kp_fill_seeded" in out
    assert "unchanged (in), made by kp_axpby" in out
    assert "written (out)\n" in out and "6.0 MiB (stored" in out


def _drop_fill(o: dict) -> None:
    """g's chain without its first operation (the fill) nor that operation's digest: a
    well-formed chain that makes other bytes."""
    chain = o["regions"][0]["regen"]
    del chain["ops"][0], chain["digests"][0], chain["digests64"][0]


@pytest.mark.parametrize("fault", ["seed", "link"])
def test_kpair_replay_of_a_tampered_chain_exits_3_as_one_json_document(lab, two, tmp_path,
                                                                        fault):
    """The worker refuses the chain before ref runs; the CLI exits with the bad-snapshot code
    (3, as for any tampered snapshot), the one JSON document naming region and operation."""
    if fault == "seed":
        root, region, op = _copy(lab, tmp_path), "a", "operation 0 (kp_fill_seeded)"
        _tamper_seed(root)
    else:
        root, region, op = tmp_path / "no-fill", "g", "operation 0 (kp_scale)"
        shutil.copytree(two, root)
        _edit(root, _drop_fill)
    proc = subprocess.run([sys.executable, "-m", "kpair", "replay", str(root), "--runs", "2",
                           "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)   # exactly one document: anything more fails to parse
    assert doc["status"] == "error" and doc["exit_code"] == 3
    assert doc["error"].startswith("SnapshotFormatError")
    assert f"region {region!r}" in doc["error"] and op in doc["error"]
    assert "refused before any launch of ref or opt" in doc["error"]
    assert "Traceback" not in proc.stdout + proc.stderr
