"""Snapshot format v1: round trip, and every way a reader must refuse a bad snapshot."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kpair.errors import SnapshotFormatError, UsageError
from kpair.snapshot import (
    CodeObject,
    Kernarg,
    Launch,
    LaunchAttribute,
    Manifest,
    Param,
    Region,
    Snapshot,
    SnapshotWriter,
    detect_format,
)


def make_snapshot(root: Path) -> Snapshot:
    w = SnapshotWriter(root)
    pre, post = bytes(range(256)) * 16, bytes(4096)
    manifest = Manifest(
        backend="cuda", arch="sm_90",
        code=CodeObject(w.put(b"\x7fELF fake cubin"), "cubin", "_Z3addPfS_"),
        launch=Launch((64, 1, 1), (256, 1, 1), 49152,
                      (LaunchAttribute(4, "cluster_dimension", bytes([2, 0, 0, 0] + [0] * 60)),)),
        kernarg=Kernarg(w.put(bytes(20)), (Param(0, 8, "pointer", "x"),
                                           Param(8, 8, "pointer", "y"), Param(16, 4, "i32", "n"))),
        regions=(Region("x", 0x7F0000000000, 4096, w.put(pre), w.put(pre), "float32"),
                 Region("y", 0x7F0000200000, 4096, w.put(pre), w.put(post), "float32")),
        environment={"device": "test"}, provenance={"command": ["python", "prog.py"]})
    return w.finish(manifest)


def test_round_trip_and_dedupe(tmp_path):
    snap = make_snapshot(tmp_path / "s")
    again = Snapshot.open(tmp_path / "s")
    assert again.manifest == snap.manifest
    assert again.manifest.launch.attributes[0].value[0] == 2
    assert again.manifest.region("x").address == 0x7F0000000000
    assert again.post(1) == bytes(4096)
    # x's pre, x's post and y's pre are the same bytes, stored once: 4 distinct blobs
    # (code object, kernarg, that pre-state, y's post-state) for 7 references.
    assert len(list((tmp_path / "s" / "blobs").iterdir())) == 4
    assert again.verify() == 15 + 20 + 4 * 4096


def test_writer_refuses_to_overwrite(tmp_path):
    make_snapshot(tmp_path / "s")
    with pytest.raises(UsageError, match="already holds a snapshot"):
        SnapshotWriter(tmp_path / "s")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not empty"):
        SnapshotWriter(tmp_path / "other")
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"


@pytest.fixture
def snap_dir(tmp_path) -> Path:
    make_snapshot(tmp_path / "s")
    return tmp_path / "s"


def edit_manifest(root: Path, fn) -> None:
    path = root / "snapshot.json"
    obj = json.loads(path.read_text())
    fn(obj)
    path.write_text(json.dumps(obj))


def blob_of(root: Path, field: str) -> Path:
    obj = json.loads((root / "snapshot.json").read_text())
    ref = obj["regions"][1][field]
    return root / ref["path"]


def test_hash_mismatch_names_the_field(snap_dir):
    import zstandard

    blob = blob_of(snap_dir, "post")
    blob.write_bytes(zstandard.ZstdCompressor().compress(b"\x01" * 4096))
    snap = Snapshot.open(snap_dir)
    with pytest.raises(SnapshotFormatError, match=r"regions\[1\]\.post.*sha256"):
        snap.post(1)


def test_truncated_blob(snap_dir):
    blob = blob_of(snap_dir, "post")
    blob.write_bytes(blob.read_bytes()[:-5])
    with pytest.raises(SnapshotFormatError, match=r"regions\[1\]\.post.*(corrupt|truncated)"):
        Snapshot.open(snap_dir).verify()


def test_wrong_size_blob(snap_dir):
    edit_manifest(snap_dir, lambda o: o["kernarg"]["blob"].update(size=24))
    with pytest.raises(SnapshotFormatError, match=r"kernarg\.blob.*holds 20 bytes"):
        Snapshot.open(snap_dir).kernarg()


def test_missing_blob(snap_dir):
    blob_of(snap_dir, "post").unlink()
    with pytest.raises(SnapshotFormatError, match=r"regions\[1\]\.post.*missing"):
        Snapshot.open(snap_dir).verify()


@pytest.mark.parametrize("bad", ["../../etc/passwd", "/etc/passwd", "blobs/../../x.zst"])
def test_path_escape(snap_dir, bad):
    edit_manifest(snap_dir, lambda o: o["regions"][0]["pre"].update(path=bad))
    with pytest.raises(SnapshotFormatError, match=r"regions\[0\]\.pre\.path"):
        Snapshot.open(snap_dir)


def test_symlink_escape(snap_dir, tmp_path):
    outside = tmp_path / "outside.zst"
    shutil.copy(blob_of(snap_dir, "post"), outside)
    link = snap_dir / "blobs" / "link.zst"
    link.symlink_to(outside)
    edit_manifest(snap_dir, lambda o: o["regions"][1]["post"].update(path="blobs/link.zst"))
    with pytest.raises(SnapshotFormatError, match="leaves the snapshot directory"):
        Snapshot.open(snap_dir).post(1)


def test_unknown_version(snap_dir):
    edit_manifest(snap_dir, lambda o: o.update(schema_version=3))
    with pytest.raises(SnapshotFormatError, match="schema_version.*not supported"):
        Snapshot.open(snap_dir)


@pytest.mark.parametrize("edit, field", [
    (lambda o: o.update(surprise=1), "surprise"),
    (lambda o: o["regions"][0].update(address="12345"), r"regions\[0\]\.address"),
    (lambda o: o["regions"][1].update(address="0x7f0000000800"), "regions.*overlap"),
    (lambda o: o["regions"][1].update(name="x"), r"regions\[1\]\.name"),
    (lambda o: o["launch"].update(grid=[0, 1, 1]), r"launch\.grid"),
    (lambda o: o["kernarg"]["params"][2].update(kind="i64"), r"params\[2\]\.size"),
    (lambda o: o["kernarg"]["params"][1].update(offset=4), r"params\[1\]\.offset"),
    (lambda o: o["code_object"].update(format="exe"), r"code_object\.format"),
    (lambda o: o["regions"][0]["pre"].update(sha256="XYZ"), r"regions\[0\]\.pre\.sha256"),
    (lambda o: o["regions"][0].update(size=True), r"regions\[0\]\.size.*boolean"),
    (lambda o: o.pop("launch"), "launch.*missing"),
    (lambda o: o["regions"][0].update(dtype="f32"), r"regions\[0\]\.dtype"),
])
def test_malformed_manifest_names_the_field(snap_dir, edit, field):
    edit_manifest(snap_dir, edit)
    with pytest.raises(SnapshotFormatError, match=field):
        Snapshot.open(snap_dir)


def test_not_json_and_not_a_snapshot(tmp_path, snap_dir):
    (snap_dir / "snapshot.json").write_text("{ not json")
    with pytest.raises(SnapshotFormatError, match="not valid JSON"):
        Snapshot.open(snap_dir)
    with pytest.raises(SnapshotFormatError, match="not a kpair snapshot"):
        Snapshot.open(tmp_path)


def test_detect_format():
    assert detect_format(b"\x7fELF\x02\x01" + bytes(12) + b"\xbe\x00" + bytes(40)) == "cubin"
    assert detect_format(b"\x7fELF\x02\x01" + bytes(12) + b"\x3e\x00" + bytes(40)) == "elf-so"
    assert detect_format(b"\x7fELF\x02\x01" + bytes(12) + b"\xe0\x00" + bytes(40)) == "hsaco"
    assert detect_format(b"\x50\xed\x55\xba" + bytes(16)) == "fatbin"
    assert detect_format(b"//\n.version 8.0\n.target sm_90\n") == "ptx"
    with pytest.raises(SnapshotFormatError):
        detect_format(b"MZ\x90\x00")


V1_FIXTURE = Path(__file__).parent / "data" / "snapshot_v1"


def test_a_v1_snapshot_written_before_the_struct_model_still_loads(tmp_path):
    on_disk = json.loads((V1_FIXTURE / "snapshot.json").read_text())
    snap = Snapshot.open(V1_FIXTURE)
    m = snap.manifest
    assert m.region("x").address == 0x7F0000000000 and m.region("x").dtype == "float32"
    assert m.region("arg1").dtype is None and not m.complete
    assert m.launch.grid == (2, 1, 1) and m.launch.attributes[0].value[:4] == b"\1\0\0\0"
    assert m.kernarg.params[1] == Param(8, 8, "pointer")
    assert m.environment["nested"] == {"a": [1, 2]}
    assert snap.verify() == 15 + 24 + 4 * 64
    # Written again, it is the same document; the one difference is that a parameter without
    # a name now says so ("name": "") instead of leaving the key out.
    for p in on_disk["kernarg"]["params"]:
        p.setdefault("name", "")
    assert m.to_json() == on_disk
    assert Manifest.from_json(m.to_json()) == m


def test_records_built_in_code_obey_the_rules_of_the_reader():
    from kpair.errors import FormatError
    from kpair.formats import Address
    from kpair.snapshot import BlobRef

    blob = BlobRef("blobs/a.zst", 16, "0" * 64)
    r = Region("a", 4096, 16, blob, blob)
    assert type(r.address) is Address and r.to_json()["address"] == "0x1000"
    assert "dtype" not in r.to_json()
    with pytest.raises(FormatError, match=r"pre\.size.*blob holds 16 bytes, region is 32"):
        Region("a", 4096, 32, blob, blob)
    with pytest.raises(FormatError, match="relative path"):
        BlobRef("../a.zst", 16, "0" * 64)
    with pytest.raises(FormatError, match=r"params\[1\]\.offset.*overlap"):
        Kernarg(blob, [Param(0, 8), Param(4, 8)])
    launch = Launch([2, 1, 1], [32, 1, 1], 0, [LaunchAttribute(1, "X", b"\1")])
    assert launch == Launch((2, 1, 1), (32, 1, 1), 0, (LaunchAttribute(1, "X", b"\1"),))
    assert launch.to_json()["attributes"] == [{"id": 1, "name": "X", "value": "01"}]


def test_launch_override_is_checked_and_named():
    base = Launch((4, 1, 1), (256, 1, 1), 1024)
    assert base.override({"grid": [8, 1, 1]}) == Launch((8, 1, 1), (256, 1, 1), 1024)
    assert base.override({}) == base
    with pytest.raises(SnapshotFormatError, match=r"launch_override\.grid"):
        base.override({"grid": [0, 1, 1]})
    with pytest.raises(SnapshotFormatError, match=r"launch_override\.attributes.*unknown"):
        base.override({"attributes": []})


# --- hostile blobs: a reader never allocates more than the manifest declares (issue 10) ----

def _bomb(snap_dir: Path, declared: int, payload: bytes, *, content_size: bool) -> None:
    """Make regions[1].post a zstd blob of ``payload`` whose manifest declares ``declared``."""
    import hashlib

    import zstandard

    packed = zstandard.ZstdCompressor(write_content_size=content_size).compress(payload)
    blob = snap_dir / "blobs" / "bomb.zst"
    blob.write_bytes(packed)

    def edit(o):
        o["regions"][1]["post"] = {"path": "blobs/bomb.zst", "size": declared,
                                   "sha256": hashlib.sha256(payload).hexdigest(),
                                   "compression": "zstd"}
        o["regions"][1]["size"] = declared
        o["regions"][1]["pre"]["size"] = declared  # a region's blobs declare its size
    edit_manifest(snap_dir, edit)


def test_a_blob_declaring_a_terabyte_without_a_frame_size_is_refused_without_allocating(
        snap_dir):
    _bomb(snap_dir, 1 << 40, bytes(4096), content_size=False)
    snap = Snapshot.open(snap_dir)
    # No zstd stream of a few bytes holds a terabyte (a block of <= 128 KiB takes >= 4 bytes):
    # refused before a byte is decompressed.
    with pytest.raises(SnapshotFormatError,
                       match=r"regions\[1\]\.post.*no zstd stream that short") as e:
        snap.post(1)
    assert e.value.exit_code == 3


def test_a_blob_declaring_more_than_it_holds_is_read_piece_by_piece(snap_dir):
    import os
    import tracemalloc

    # 64 MiB declared, 4 KiB of random bytes stored: plausible by size, so it is read, but in
    # pieces that stop at what the stream holds, never allocating what the manifest claims.
    _bomb(snap_dir, 64 << 20, os.urandom(4096), content_size=False)
    tracemalloc.start()
    try:
        with pytest.raises(SnapshotFormatError, match=r"holds 4096 bytes, manifest says"):
            Snapshot.open(snap_dir).post(1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20


def test_a_frame_claiming_more_than_the_manifest_is_refused_before_decompressing(snap_dir):
    _bomb(snap_dir, 4096, bytes(64 << 20), content_size=True)
    with pytest.raises(SnapshotFormatError, match=r"regions\[1\]\.post.*frame header"):
        Snapshot.open(snap_dir).post(1)


def test_a_stream_longer_than_declared_stops_one_byte_past_it(snap_dir):
    _bomb(snap_dir, 4096, bytes(64 << 20), content_size=False)
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(SnapshotFormatError, match=r"more than the 4096 bytes"):
            Snapshot.open(snap_dir).post(1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20


def test_an_uncompressed_blob_of_the_wrong_size_is_refused_before_reading(snap_dir):
    (snap_dir / "blobs" / "raw").write_bytes(bytes(100))
    edit_manifest(snap_dir, lambda o: o["regions"][1]["post"].update(
        path="blobs/raw", compression="none"))
    with pytest.raises(SnapshotFormatError, match="holds 100 bytes, manifest says 4096"):
        Snapshot.open(snap_dir).post(1)


def test_kpair_inspect_on_a_bomb_exits_3(snap_dir, capsys):
    from kpair.cli import main

    _bomb(snap_dir, 1 << 40, bytes(4096), content_size=False)
    assert main(["inspect", str(snap_dir)]) == 3
    assert "holds 4096 bytes" in capsys.readouterr().err


# --- big regions: a blob is never held in host memory twice (issue 23) --------------------

def _region_snapshot(root: Path, data: bytes, *, chunk: int) -> Snapshot:
    w = SnapshotWriter(root, level=1, chunk=chunk)
    ref = w.put(data)
    return w.finish(Manifest(
        backend="host", arch="x86_64", code=CodeObject(w.put(b"\x7fELF"), "elf-so", "k"),
        launch=Launch(), kernarg=Kernarg(w.put(bytes(8)), (Param(0, 8, "pointer", "x"),)),
        regions=(Region("x", 0x10000, len(data), ref, ref),)))


def _peak(fn) -> int:
    import tracemalloc

    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_large_blob_is_written_as_a_stream_and_read_without_a_second_copy(tmp_path):
    import os

    import zstandard

    size, chunk = 24 << 20, 1 << 20
    # compressible (4 random bits a byte), so zstd-compressed: a one-shot compress would hold
    # ~half the size again (incompressible bytes are stored raw: tests/test_big_region.py)
    data = os.urandom(size).translate(bytes(i & 15 for i in range(256)))
    holder = {}
    peak = _peak(lambda: holder.update(s=_region_snapshot(tmp_path / "s", data, chunk=chunk)))
    assert peak < 6 * chunk, peak
    snap = holder["s"]
    blob = tmp_path / "s" / snap.manifest.regions[0].pre.path
    # streamed frames still record the raw size: readers rely on it
    assert zstandard.frame_content_size(blob.read_bytes()[:18]) == size

    peak = _peak(lambda: holder.update(pre=snap.pre(0)))
    assert holder["pre"] == data and isinstance(holder["pre"], bytes)
    assert peak < size + 6 * chunk, peak  # the bytes returned, and no second copy

    buffer = bytearray(size)
    peak = _peak(lambda: snap.read_into(snap.manifest.regions[0].post, buffer, chunk=chunk))
    assert buffer == data and peak < 6 * chunk, peak
    peak = _peak(lambda: holder.update(n=snap.verify(chunk=chunk)))
    assert holder["n"] == 2 * size + 4 + 8 and peak < 6 * chunk, peak


def test_read_into_refuses_a_wrong_buffer_and_a_tampered_blob(tmp_path):
    snap = _region_snapshot(tmp_path / "s", bytes(range(256)) * 4096, chunk=64 << 10)
    ref = snap.manifest.regions[0].pre
    with pytest.raises(ValueError, match="writable buffer of 1048576 bytes"):
        snap.read_into(ref, bytearray(10))
    with pytest.raises(ValueError, match="read-only"):
        snap.read_into(ref, bytes(ref.size))
    import zstandard

    (tmp_path / "s" / ref.path).write_bytes(zstandard.ZstdCompressor().compress(
        bytes(ref.size)))
    with pytest.raises(SnapshotFormatError, match=r"regions\[0\]\.pre.*sha256"):
        snap.read_into(ref, bytearray(ref.size), "regions[0].pre", chunk=64 << 10)
    with pytest.raises(SnapshotFormatError, match="sha256"):
        snap.verify()


def test_large_blobs_use_every_cpu_and_say_how_far_they_are(tmp_path, monkeypatch):
    from kpair import progress
    from kpair.snapshot import store

    monkeypatch.setattr(store, "THREADED_BYTES", 1 << 20)
    monkeypatch.setattr(store, "PROGRESS_BYTES", 1 << 20)
    monkeypatch.setattr(store, "CHUNK", 256 << 10)

    said = []

    class Recorder(progress.Silent):
        def stage(self, name: str) -> None:
            said.append(name)

    data = bytes(range(256)) * (16 << 10)  # 4 MiB
    with progress.using(Recorder()):
        snap = _region_snapshot(tmp_path / "s", data, chunk=256 << 10)
        assert snap.pre(0) == data
        snap.verify(chunk=256 << 10)
    assert snap.manifest.regions[0].pre.size == 4 << 20
    assert any(s.startswith("store blob: ") and s.endswith("of 4.0 MiB") for s in said), said
    assert "load regions[0].pre (4.0 MiB)" in said
    assert any(s.startswith("check regions[0].pre: ") for s in said), said
    made = store.Compressors(1)  # one compressor on every CPU for large blobs, one for small
    assert made.for_size(4 << 20) is made.for_size(2 << 20) is not made.for_size(10)


def test_verify_reads_a_blob_named_twice_once(snap_dir, monkeypatch):
    snap = Snapshot.open(snap_dir)
    seen = []
    real = Snapshot.check_blob
    monkeypatch.setattr(Snapshot, "check_blob",
                        lambda self, ref, field="blob", **kw: seen.append(ref.sha256)
                        or real(self, ref, field, **kw))
    assert snap.verify() == 15 + 20 + 4 * 4096
    assert len(seen) == len(set(seen)) == 4


def test_regions_data_reads_each_stored_blob_once_and_shares_the_bytes(snap_dir, monkeypatch):
    snap = Snapshot.open(snap_dir)
    read = []
    real = Snapshot._verified
    monkeypatch.setattr(Snapshot, "_verified",
                        lambda self, ref, field: read.append(field) or real(self, ref, field))
    data = snap.regions_data()
    # x's pre, x's post and y's pre are one stored blob: read once, one bytes object.
    assert sorted(read) == ["regions[0].pre", "regions[1].post"]
    assert data[0][0] is data[0][1] is data[1][0]
    assert data == [(snap.pre(i), snap.post(i)) for i in range(2)]


def test_regions_data_names_a_bad_blob_and_returns_nothing(snap_dir):
    import zstandard

    blob_of(snap_dir, "post").write_bytes(zstandard.ZstdCompressor().compress(b"\x01" * 4096))
    with pytest.raises(SnapshotFormatError, match=r"regions\[1\]\.post.*sha256"):
        Snapshot.open(snap_dir).regions_data()


def test_threaded_map_keeps_the_order_and_raises_the_first_error_in_it():
    import threading
    import time

    from kpair._util import threaded_map

    def slow_square(x):
        time.sleep(0.01 * (5 - x))     # the later items finish first
        return x * x, threading.get_ident()

    out = threaded_map(slow_square, range(5))
    assert [v for v, _ in out] == [0, 1, 4, 9, 16]

    def fail(x):
        if x in (1, 3):
            time.sleep(0.05 if x == 1 else 0)
            raise ValueError(f"item {x}")
        return x

    with pytest.raises(ValueError, match="item 1"):
        threaded_map(fail, range(5))
