"""Post-states kept as digests (issue 48): a written region larger than the threshold keeps
its post-state as size, sha256 and digest64, no bytes; ``kpair replay`` reproduces it by a
digest computed on the device; what needs the bytes refuses it by name. Host backend,
tests/csrc/regen_ops.c; the threshold is passed small (1 MiB) so 2 MiB regions cross it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import CSRC
from kpair.backends import open_device
from kpair.backends.base import digest64
from kpair.errors import SnapshotFormatError
from kpair.record import Recorder
from kpair.replay import Replay, reproduce
from kpair.snapshot import Manifest, Snapshot, sha256
from kpair.toolchain import compile_shared

ROWS, COLS = 512, 1024
N = ROWS * COLS              # 2 MiB of float32
OVER = 1 << 20
SEED = 99


def _record(lib: Path, out: Path, **options) -> dict:
    """a seeded and b filled in setup (chains); the range: d = 2a + b (2 MiB written: over
    the threshold), o = rowdot(d, a) (2 KiB written: bytes)."""
    a, b, d = (np.zeros((ROWS, COLS), np.float32) for _ in range(3))
    o = np.zeros(ROWS, np.float32)
    with Recorder(out, names={"a": a, "b": b, "d": d, "o": o}, outputs=[d, o],
                  **options) as r:
        r.call(lib, "kp_fill_seeded", [a, np.int64(N), np.uint64(SEED), np.int64(0)])
        r.call(lib, "kp_fill", [b, np.int64(N), np.float32(0.5)])
        with r.range("forward"):
            r.call(lib, "kp_axpby", [d, a, b, np.int64(N), np.float32(2.0)])
            r.call(lib, "kp_rowdot", [d, a, o, np.int32(ROWS), np.int32(COLS)])
    return {"a": a, "b": b, "d": d, "o": o}


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("postdigest")
    lib = compile_shared(CSRC / "regen_ops.c", root / "ops.so", flags=("-O2", "-g"))
    arrays = _record(lib, root / "snap", post_digest_over=OVER)
    return {"dir": root, "lib": lib, "snap": root / "snap", "arrays": arrays}


def _copy(lab: dict, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(lab["snap"], dst)
    return dst


def _kpair(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kpair", *args], capture_output=True,
                          text=True, timeout=300)


def test_a_large_written_region_keeps_its_post_state_as_digests(lab):
    snap = Snapshot.open(lab["snap"])
    m = snap.manifest
    d, o = m.region("d"), m.region("o")
    want = lab["arrays"]["d"].tobytes()   # the results came back to the caller's array
    assert np.array_equal(lab["arrays"]["d"], np.float32(2.0) * lab["arrays"]["a"]
                          + np.float32(0.5))
    assert d.post_is_digest and d.post_blob is None and d.post.size == N * 4
    assert d.post_digest.sha256 == sha256(want)
    assert d.post_digest.digest64 == f"{digest64(want):016x}"
    assert not o.post_is_digest and o.post_blob is not None   # under the threshold: bytes
    assert m.schema_version == 2
    # d's pre-state (zeros) is a blob of a few bytes; its post-state stores none at all.
    assert snap.stored_bytes() < (N * 4) // 100
    snap.verify()
    with pytest.raises(SnapshotFormatError, match=r"region 'd'.*kept as a digest"):
        snap.post(m.regions.index(d))
    # The reader's rules: a blob and digests both, or digests of another size, are refused.
    obj = m.to_json()
    (reg,) = [r for r in obj["regions"] if r["name"] == "d"]
    bad = json.loads(json.dumps(obj))
    [r for r in bad["regions"] if r["name"] == "d"][0]["post"] = reg["pre"]
    with pytest.raises(SnapshotFormatError, match="not both"):
        Manifest.from_json(bad)
    bad = json.loads(json.dumps(obj))
    [r for r in bad["regions"] if r["name"] == "d"][0]["post_digest"]["size"] = 8
    with pytest.raises(SnapshotFormatError, match=r"post_digest\.size"):
        Manifest.from_json(bad)
    bad = json.loads(json.dumps(obj))
    bad["schema_version"] = 1
    for r in bad["regions"]:
        r.pop("regen", None)
    with pytest.raises(SnapshotFormatError, match=r"post_digest.*schema_version 2"):
        Manifest.from_json(bad)


def test_store_bytes_keeps_bytes(lab, tmp_path):
    _record(lab["lib"], tmp_path / "s", post_digest_over=OVER, store_bytes=True)
    m = Snapshot.open(tmp_path / "s").manifest
    assert not any(r.post_is_digest for r in m.regions)
    assert m.region("d").post_blob is not None
    # No threshold (the library's default): bytes too.
    _record(lab["lib"], tmp_path / "t")
    assert not any(r.post_is_digest for r in Snapshot.open(tmp_path / "t").manifest.regions)


def test_replay_reproduces_it_by_digest_on_the_device(lab):
    with open_device("host") as dev:
        rep = reproduce(dev, Snapshot.open(lab["snap"]), 2)
    assert rep.status == "byte-exact", rep
    assert rep.digest_regions == ["d"]
    proc = _kpair("replay", str(lab["snap"]), "--runs", "2", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["status"] == "byte-exact" and doc["digest_regions"] == ["d"]


def test_a_corrupted_digest_is_a_mismatch_naming_the_region(lab, tmp_path):
    root = _copy(lab, tmp_path)
    path = root / "snapshot.json"
    obj = json.loads(path.read_text())
    (reg,) = [r for r in obj["regions"] if r["name"] == "d"]
    reg["post_digest"]["digest64"] = f"{int(reg['post_digest']['digest64'], 16) ^ 1:016x}"
    path.write_text(json.dumps(obj))
    with open_device("host") as dev:
        rep = reproduce(dev, Snapshot.open(root), 2)
    assert rep.status == "mismatch" and rep.differing_regions == ["d"], rep
    proc = _kpair("replay", str(root), "--runs", "2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.startswith("mismatch") and "differs from the capture in d" in proc.stdout
    assert "the digest differs" in proc.stdout and "how many bytes differ is unknown" in \
        proc.stdout


def _plan(lab: dict, tmp_path: Path) -> Path:
    """The range's own two calls as a launch plan (what ``kpair pair --plan`` judges)."""
    d = tmp_path / "plan"
    d.mkdir()
    (d / "ops.so").write_bytes(lab["lib"].read_bytes())

    def region(name: str, access: str = "read") -> dict:
        return {"bind": "region", "name": name, "access": access}

    def scalar(kind: str, value) -> dict:
        return {"bind": "scalar", "kind": kind, "value": value}

    plan = {"schema": "kpair.plan", "schema_version": 1, "launches": [
        {"code": "ops.so", "kernel": "kp_axpby", "args": [
            region("d", "write"), region("a"), region("b"), scalar("i64", N),
            scalar("f32", 2.0)]},
        {"code": "ops.so", "kernel": "kp_rowdot", "args": [
            region("d"), region("a"), region("o", "write"), scalar("i32", ROWS),
            scalar("i32", COLS)]}]}
    (d / "opt.plan.json").write_text(json.dumps(plan))
    return d / "opt.plan.json"


def test_pair_and_run_make_the_post_bytes_by_replaying_the_captured_operations(lab,
                                                                              tmp_path):
    """A Replay that needs every post's bytes (kpair run's fidelity and verdicts, the trust
    checks) makes them: the captured operations run once, the result checked against the
    recorded sha256. ``kpair pair`` and ``kpair run`` then work as with bytes."""
    with open_device("host") as dev:
        replay = Replay(dev, Snapshot.open(lab["snap"]))
        assert replay.expected["d"] == lab["arrays"]["d"].tobytes()
        assert replay.run(replay.load_range()) == replay.expected
    harness = tmp_path / "H"
    proc = _kpair("pair", str(lab["snap"]), "--plan", str(_plan(lab, tmp_path)), "-o",
                  str(harness), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = _kpair("run", str(harness), "--time-cap", "0.3", "--min-blocks", "8",
                  "--replicates", "1", "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["correct"] is True and doc["replay"]["fidelity"]["passed"] is True
    proc = _kpair("inspect", str(lab["snap"]))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "written (out), post-state kept as a digest" in proc.stdout


def test_a_post_digest_the_captured_operations_do_not_make_is_refused_by_name(lab,
                                                                              tmp_path):
    root = _copy(lab, tmp_path)
    path = root / "snapshot.json"
    obj = json.loads(path.read_text())
    (reg,) = [r for r in obj["regions"] if r["name"] == "d"]
    reg["post_digest"]["sha256"] = "0" * 64
    path.write_text(json.dumps(obj))
    with open_device("host") as dev, pytest.raises(SnapshotFormatError) as e:
        Replay(dev, Snapshot.open(root))
    msg = str(e.value)
    assert "region 'd'" in msg and "kept as a digest" in msg and "do not make its sha256" in msg
    assert "regions[2].post_digest" in msg


class Drifting:
    """A device whose digest of region d changes from run to run (a nondeterministic
    kernel, as the device sees it)."""

    def __init__(self, inner, address: int):
        self.inner, self.address, self.calls = inner, address, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def digest(self, address, size, key=0):
        got = self.inner.digest(address, size, key)
        if address == self.address:
            self.calls += 1
            got ^= self.calls
        return got


def test_digests_that_differ_between_runs_are_nondeterministic(lab):
    snap = Snapshot.open(lab["snap"])
    with open_device("host") as dev:
        # placed at its captured addresses (the host maps them), so d is where capture saw it
        rep = reproduce(Drifting(dev, snap.manifest.region("d").address), snap, 3)
    assert rep.status == "nondeterministic" and rep.unstable_regions == ["d"], rep


def _digest64_by_word(data: bytes, key: int = 0) -> int:
    """The digest's definition, one word at a time in Python integers (what kp_diff does)."""
    m, total = 2**64 - 1, 0
    data = data + bytes(-len(data) % 16)
    for i in range(len(data) // 8):
        x = int.from_bytes(data[8 * i:8 * i + 8], "little") ^ ((key + i * 0x9E3779B97F4A7C15) & m)
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
        total += x ^ (x >> 31)
    return total & m


@pytest.mark.parametrize("size", [0, 1, 15, 16, 17, 4133, (1 << 16) + 8])
def test_the_host_digest_in_pieces_is_the_digests_definition(size):
    from kpair.snapshot.store import state_digest

    data = np.random.default_rng(size).integers(0, 256, size, np.uint8).tobytes()
    want, want7 = _digest64_by_word(data), _digest64_by_word(data, 7)
    for chunk in (16, 48, 4096, 1 << 20):
        assert digest64(data, chunk=chunk) == want
        assert digest64(bytearray(data), 7, chunk=chunk) == want7
    if size:
        d = state_digest(memoryview(data))
        assert (d.size, d.sha256, d.digest64) == (size, sha256(data), f"{want:016x}")
    with pytest.raises(ValueError, match="multiple of 16"):
        digest64(data, chunk=24)


class InPlace:
    """The host device as a GPU's checks see it: ``compares_in_place`` (held copies, compares
    and digests work through the base class's reads)."""

    compares_in_place = True

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_on_a_device_that_compares_in_place_regenerated_inputs_stay_there(lab, tmp_path):
    """``kpair replay`` on such a device (a GPU) never stages a regenerated region from the
    host: a held copy on the device is its pristine pre-state and its unchanged post-state is
    compared by the chain's digest64."""
    snap = Snapshot.open(lab["snap"])
    with open_device("host") as dev:
        replay = Replay(InPlace(dev), snap, digest_posts=True)
        assert "a" not in replay.pre and "b" not in replay.pre and "o" in replay.pre
        assert {n: d.digest64 for n, d in replay.expected_digests.items() if n in "ab"} == \
            {n: snap.manifest.region(n).regen.digest64 for n in "ab"}
        assert len(replay.held_pre) == 2 and not snap.regenerated
    with open_device("host") as dev:
        rep = reproduce(InPlace(dev), Snapshot.open(lab["snap"]), 3)
    assert rep.status == "byte-exact", rep
    assert rep.digest_regions == ["a", "b", "d"]
    with open_device("host") as dev:   # a device that reads back: staged from the host
        replay = Replay(dev, Snapshot.open(lab["snap"]), digest_posts=True)
        assert "a" in replay.pre and replay.held_pre == []
        assert set(replay.expected_digests) == {"d"}
