"""The whole pipeline on the host backend: record a real call, pair, replay, judge, time."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import CSRC, record_matmul, run_json
from kpair.cli import main as kpair
from kpair.harness import create_harness
from kpair.pipeline import RunOptions
from kpair.snapshot import Snapshot
from kpair.toolchain import compile_shared

QUICK = RunOptions(time_cap_s=3.0, max_blocks=64, timeout_s=120)


def test_record_call_really_calls_and_snapshots(matmul_libs, tmp_path):
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((64, 64), dtype=np.float32) for _ in range(2))
    c = np.zeros((64, 64), np.float32)
    from kpair.record import record_call

    snap = record_call(matmul_libs["naive"], "kp_matmul", [a, b, c, np.int32(64)],
                       tmp_path / "s", names=["a", "b", "c", "n"])
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
    m = snap.manifest
    assert [r.name for r in m.regions] == ["a", "b", "c"]
    assert [p.kind for p in m.kernarg.params] == ["pointer", "pointer", "pointer", "i32"]
    assert snap.pre(0) == snap.post(0) == a.tobytes()
    assert snap.post(2) == c.tobytes() and snap.pre(2) == bytes(64 * 64 * 4)
    assert struct.unpack_from("<Q", snap.kernarg(), 16)[0] == m.region("c").address


@pytest.fixture(scope="module")
def pair(matmul_libs, matmul_snapshot, tmp_path_factory) -> Path:
    return create_harness(matmul_snapshot, tmp_path_factory.mktemp("h") / "fast",
                          opt=matmul_libs["fast"]).root


def test_honest_pair_is_byte_exact_and_faster(matmul_libs, tmp_path):
    # n=256: the naive loop walks B by columns, the reordered one streams rows.
    snap = record_matmul(matmul_libs["naive"], tmp_path / "s", n=256)
    h = create_harness(snap, tmp_path / "h", opt=matmul_libs["fast"])
    r = run_json(h.root, RunOptions(time_cap_s=8.0, timeout_s=120))
    assert r["status"] == "pass" and r["correct"] is True
    assert r["correctness"]["mode"] == "byte-exact"
    assert r["replay"]["fidelity"]["passed"] is True
    s = r["speed"]
    assert s["speedup"] > 1.05 and s["ci95"][0] > 1.0, s
    assert 0.95 < s["slot_bias"] < 1.05
    assert (h.root / "samples.npz").is_file()
    from kpair.snapshot import sha256

    assert s["samples_sha256"] == sha256((h.root / "samples.npz").read_bytes())
    saved = json.loads((h.root / "result.json").read_text())
    assert saved["speed"]["speedup"] == s["speedup"]


def test_off_by_one_is_rejected_with_a_useful_report(matmul_libs, matmul_snapshot, tmp_path):
    h = create_harness(matmul_snapshot, tmp_path / "h", opt=matmul_libs["offbyone"])
    r = run_json(h.root, QUICK)
    assert r["status"] == "fail" and r["correct"] is False and r["speed"] is None
    bad = [x for x in r["correctness"]["regions"] if not x["passed"]]
    assert [x["region"] for x in bad] == ["c"]
    first = bad[0]["mismatch"]["first"][0]
    # The last column of row 0 (element 127) is the first one never written.
    assert first["element_offset"] == 127 * 4 and first["dtype"] == "float32"
    assert "region c" in r["correctness"]["summary"]


def test_relocated_replay_patches_pointers_and_stays_byte_exact(pair):
    r = run_json(pair, RunOptions(relocate=True, time_cap_s=1.0, max_blocks=32,
                                     timeout_s=120))
    assert r["status"] == "pass", r.get("error")
    rep = r["replay"]
    assert rep["mode"] == "relocated" and rep["delta"] != 0 and rep["delta"] % 4096 == 0
    assert rep["patched_kernarg_words"] == 3  # a, b, c; not the int n


def test_run_harness_py_and_kpair_run_agree(pair, capsys):
    proc = subprocess.run([sys.executable, "run_harness.py", "--time-cap", "1"], cwd=pair,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("PASS: byte-exact")
    first = json.loads((pair / "result.json").read_text())
    assert kpair(["run", str(pair), "--time-cap", "1", "--json"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert (first["status"], first["correct"], first["correctness"]["mode"]) == \
           (second["status"], second["correct"], second["correctness"]["mode"])
    assert first["inputs_digest"] == second["inputs_digest"]


def test_tampered_input_is_an_error_without_a_verdict(pair, tmp_path):
    import shutil

    h = tmp_path / "h"
    shutil.copytree(pair, h)
    opt = h / "opt.so"
    data = bytearray(opt.read_bytes())
    data[-1] ^= 0xFF
    opt.write_bytes(bytes(data))
    assert kpair(["run", str(h)]) == 3
    r = json.loads((h / "result.json").read_text())
    assert r["status"] == "error" and r["correct"] is None and r["correctness"] is None
    assert "opt.so does not match its sha256" in r["error"]["message"]


def copy_harness_with(pair: Path, tmp_path: Path, edit) -> Path:
    """A copy of the harness with ``edit(dir)`` applied and the manifest re-sealed."""
    import shutil

    from kpair.harness import write_manifest

    h = tmp_path / "h"
    shutil.copytree(pair, h)
    edit(h)
    write_manifest(h)
    return h


def test_missing_symbol(pair, tmp_path):
    def rename(h):
        spec = json.loads((h / "harness.json").read_text())
        spec["opt"]["kernel"] = "kp_matmul_v2"
        (h / "harness.json").write_text(json.dumps(spec))

    h = copy_harness_with(pair, tmp_path, rename)
    assert kpair(["run", str(h)]) == 4
    r = json.loads((h / "result.json").read_text())
    assert r["status"] == "error" and "kp_matmul_v2" in r["error"]["message"]
    assert r["error"]["type"] == "SymbolNotFound"


def test_wrong_architecture(pair, tmp_path):
    def retarget(h):
        data = bytearray((h / "opt.so").read_bytes())
        data[18:20] = struct.pack("<H", 183 if data[18] == 62 else 62)  # x86_64 <-> aarch64
        (h / "opt.so").write_bytes(bytes(data))

    h = copy_harness_with(pair, tmp_path, retarget)
    assert kpair(["run", str(h)]) == 4
    r = json.loads((h / "result.json").read_text())
    assert r["error"]["type"] == "ArchitectureMismatch" and r["correct"] is None


@pytest.mark.parametrize("fault, expect", [(1, "SIGSEGV"), (2, "timed out")])
def test_crashing_or_hanging_opt_is_an_error_and_the_caller_survives(
        matmul_snapshot, tmp_path, fault, expect):
    lib = compile_shared(CSRC / "faulty.c", tmp_path / "faulty.so", flags=("-O0",),
                         defines={"KP_FAULT": fault})
    h = create_harness(matmul_snapshot, tmp_path / "h", opt=lib)
    # A crash ends the run at once: a generous bound keeps a busy machine from turning it
    # into a timeout; a hang costs the whole bound, so it stays short.
    r = run_json(h.root, RunOptions(timeout_s=30.0 if fault == 1 else 3.0, time_cap_s=1.0))
    assert r["status"] == "error" and r["correct"] is None
    assert expect in r["error"]["message"]
    assert r["error"]["stage"] not in (None, "verify", "place", "load", "ref")


@pytest.mark.parametrize("loaded", [False, True], ids=["idle", "under-load"])
def test_aa_control_contains_one(pair, request, loaded):
    if loaded:
        request.getfixturevalue("cpu_hogs")
    r = run_json(pair, RunOptions(aa=True, time_cap_s=2.0, timeout_s=120))
    aa = r["speed"]["aa_control"]
    assert aa["mode"] == "A/A"
    # ref against itself: no speedup beyond timing noise — within 3%, or, on a machine so
    # loaded that the noise is wider than that, inside the A/A run's own interval (which
    # itself misses 1 in 5% of runs, so both must miss for a failure).
    lo, hi = aa["ci95"]
    assert abs(aa["speedup"] - 1) < 0.03 or lo <= 1.0 <= hi, aa
    assert r["trust"]["timing_integrity"]["passed"] is True


def test_identical_binary_shows_no_measurable_difference(matmul_snapshot, matmul_libs,
                                                         tmp_path):
    """opt = ref's own binary: the identical-binary control's offset is folded into the
    interval, which then holds 1.0, and the verdict says so instead of faster or slower."""
    from conftest import summarize

    h = create_harness(matmul_snapshot, tmp_path / "same", opt=matmul_libs["naive"])
    r = run_json(h.root, RunOptions(time_cap_s=2.0, timeout_s=120))
    s = r["speed"]
    assert r["status"] == "pass" and s["systematic"]["control"].startswith("identical binary")
    lo, hi = s["combined_ci95"]
    assert lo <= s["ci95"][0] and hi >= s["ci95"][1] and s["systematic"]["bound"] >= 1.0
    assert s["difference"] == "none" and lo <= 1.0 <= hi, s
    assert "no measurable difference" in summarize(r)
    fast = run_json(create_harness(matmul_snapshot, tmp_path / "fast",
                                   opt=matmul_libs["fast"]).root,
                    RunOptions(time_cap_s=2.0, timeout_s=120, control=False))
    assert "systematic" not in fast["speed"] and "combined_ci95" not in fast["speed"]


def test_pair_refuses_to_overwrite(pair, matmul_snapshot, matmul_libs, tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    code = kpair(["pair", str(matmul_snapshot), "--opt", str(matmul_libs["fast"]),
                  "-o", str(tmp_path / "taken")])
    assert code == 2 and (tmp_path / "taken" / "keep.txt").read_text() == "mine"


def test_inspect(pair, capsys):
    assert kpair(["inspect", str(pair)]) == 0
    text = capsys.readouterr().out
    assert "kp_matmul" in text and "every file matches MANIFEST.sha256" in text
    assert kpair(["inspect", str(pair / "capture"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "snapshot" and len(info["regions"]) == 3
    assert Snapshot.open(pair / "capture").manifest.backend == "host"
