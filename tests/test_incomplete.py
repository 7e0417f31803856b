"""Incomplete snapshots (capture left a region out) are refused by replay, pair and run before
anything is placed, with the regions, their bytes and the capture flag named; inspect shows
them. The incomplete snapshots come from the capture session on a scripted driver (a region
above ``max_region_bytes``), as ``kpair capture --max-region-bytes`` makes them on a GPU."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import record_matmul
from kpair.cli import main
from kpair.errors import IncompleteSnapshot, SnapshotFormatError
from kpair.harness import create_harness, write_manifest
from kpair.replay import Replay
from kpair.snapshot import Manifest, Snapshot, describe_left_out, left_out
from test_capture_cpu import SEG, HostArgs, add_launch, make_session

MIB = 1 << 20


@pytest.fixture
def incomplete(tmp_path) -> Path:
    """A captured dispatch whose 8 KiB arg1 is above a 5000-byte cap (arg0 and arg2 kept)."""
    session, _ = make_session(tmp_path, max_region_bytes=5000)
    args = HostArgs(("c_uint64", SEG), ("c_uint64", SEG + 4096), ("c_uint64", SEG + 64 * MIB),
                    ("c_int32", 1))
    launch, kernel = add_launch(args)
    session.launch_enter(launch, kernel, 1)
    session.launch_exit(1, 0)
    session.close(0)
    return tmp_path / "cap" / "0001_kp_add"


def refused(capsys, code: int) -> str:
    out = capsys.readouterr()
    assert code == 3, out
    assert "Traceback" not in out.err + out.out
    return out.err


def test_capture_records_what_it_left_out_in_the_manifest(incomplete):
    m = Snapshot.open(incomplete).manifest
    assert m.complete is False
    (o,) = m.omitted_regions
    assert (o.name, o.address, o.size, o.max_region_bytes, o.over_cap) == \
        ("arg1", SEG + 4096, 8192, 5000, True)
    lines = describe_left_out(m)
    assert "1 region" in lines[0] and "8192 bytes" in lines[0]
    assert lines[1].startswith(f"arg1 at {SEG + 4096:#x}, 8.0 KiB (8192 bytes)")
    assert "--max-region-bytes 1MiB" in lines[2]


def test_a_complete_manifest_has_no_omitted_field(tmp_path):
    session, driver = make_session(tmp_path)
    # Bound to a name: the launch holds only the address of its kernelParams array, which
    # must outlive launch_enter (a temporary could be freed first: "kernelParams[0] is NULL").
    args = HostArgs(("c_uint64", SEG), ("c_int32", 1))
    launch, kernel = add_launch(args)
    session.launch_enter(launch, kernel, 1)
    session.launch_exit(1, 0)
    obj = json.loads((tmp_path / "cap" / "0001_kp_add" / "snapshot.json").read_text())
    assert obj["complete"] is True and "omitted_regions" not in obj


def test_replay_refuses_it_before_any_worker(incomplete, capsys):
    err = refused(capsys, main(["replay", str(incomplete)]))
    assert "incomplete snapshot" in err and "arg1" in err and "8192 bytes" in err
    assert "--max-region-bytes 1MiB" in err


def test_replay_refusal_as_a_process_has_no_traceback(incomplete):
    p = subprocess.run([sys.executable, "-m", "kpair", "replay", str(incomplete)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 3, p.stderr
    assert "Traceback" not in p.stderr and "arg1" in p.stderr


def test_pair_refuses_it_and_writes_nothing(incomplete, matmul_libs, tmp_path, capsys):
    out = tmp_path / "h"
    err = refused(capsys, main(["pair", str(incomplete), "--opt", str(matmul_libs["fast"]),
                                "-o", str(out)]))
    assert "arg1" in err and "--max-region-bytes" in err
    assert not out.exists()


def test_inspect_shows_what_is_missing(incomplete, capsys):
    assert main(["inspect", str(incomplete)]) == 0
    text = capsys.readouterr().out
    assert "INCOMPLETE" in text and "arg1 at" in text and "--max-region-bytes 1MiB" in text
    assert "replay, pair and run refuse it" in text
    assert main(["inspect", "--json", str(incomplete)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["complete"] is False
    assert [(o["name"], o["size"]) for o in info["omitted_regions"]] == [("arg1", 8192)]


def _mark_incomplete(snapshot: Path, *, typed: bool) -> None:
    """Edit a snapshot's manifest as capture writes an incomplete one (``typed``), or as
    capture wrote one before ``omitted_regions`` existed (provenance only)."""
    path = snapshot / "snapshot.json"
    obj = json.loads(path.read_text())
    entry = {"name": "arg9", "address": "0x7f0000000000", "size": 3 << 30,
             "reason": "larger than the per-region cap of 2.0 GiB"}
    obj["complete"] = False
    if typed:
        obj["omitted_regions"] = [{**entry, "max_region_bytes": 2 << 30}]
    else:
        obj["provenance"] = {**obj.get("provenance", {}), "omitted_regions": [entry]}
    path.write_text(json.dumps(obj))


def test_run_refuses_a_harness_whose_snapshot_is_incomplete(matmul_libs, tmp_path, capsys):
    snap = record_matmul(matmul_libs["naive"], tmp_path / "s")
    h = create_harness(snap, tmp_path / "h", opt=matmul_libs["fast"])
    _mark_incomplete(h.root / "capture", typed=True)
    write_manifest(h.root)  # a harness made so before pair refused it: its inputs still match
    code = main(["run", str(h.root), "--no-control", "--replicates", "1"])
    out = capsys.readouterr()
    assert code == 3, out
    assert "IncompleteSnapshot" in out.out and "arg9" in out.out
    assert "--max-region-bytes 3GiB" in out.out and "Traceback" not in out.err
    result = json.loads((h.root / "result.json").read_text())
    assert result["status"] == "error" and result["error"]["stage"] == "verify"
    # inspect still opens it, and says why runs refuse it
    assert main(["inspect", str(h.root)]) == 0
    assert "INCOMPLETE" in capsys.readouterr().out


def test_an_older_snapshot_listing_omissions_in_provenance_only(matmul_snapshot, tmp_path,
                                                                 capsys):
    snap = tmp_path / "old"


    shutil.copytree(matmul_snapshot, snap)
    _mark_incomplete(snap, typed=False)
    (o,) = left_out(Snapshot.open(snap).manifest)
    assert o.over_cap and o.size == 3 << 30
    err = refused(capsys, main(["replay", str(snap)]))
    assert "arg9" in err and "--max-region-bytes 3GiB" in err


def test_incomplete_without_a_record_is_still_refused(matmul_snapshot, tmp_path, capsys):


    snap = tmp_path / "bare"
    shutil.copytree(matmul_snapshot, snap)
    path = snap / "snapshot.json"
    obj = json.loads(path.read_text())
    obj["complete"] = False
    path.write_text(json.dumps(obj))
    err = refused(capsys, main(["replay", str(snap)]))
    assert "without recording which regions" in err


def test_an_unreadable_region_is_not_blamed_on_the_cap(incomplete):
    m = Snapshot.open(incomplete).manifest
    o = m.omitted_regions[0].replace(size=100, reason="could not be read: CUDA_ERROR_X")
    lines = describe_left_out(m.replace(omitted_regions=(o,)))
    assert not any("--max-region-bytes" in line for line in lines)
    assert "kept by no capture setting" in lines[-1]


def test_listing_omissions_on_a_complete_manifest_is_refused(incomplete):
    obj = json.loads((incomplete / "snapshot.json").read_text())
    obj["complete"] = True
    with pytest.raises(SnapshotFormatError, match="field complete"):
        Manifest.from_json(obj)


class _Untouchable:
    """A device that fails the test if anything is placed on it."""

    backend = "cuda"

    def arch(self):
        return "sm_90"

    def __getattr__(self, name):
        raise AssertionError(f"Replay used device.{name} on an incomplete snapshot")


def test_the_library_replay_refuses_before_placing(incomplete):
    with pytest.raises(IncompleteSnapshot, match="arg1"):
        Replay(_Untouchable(), Snapshot.open(incomplete))
