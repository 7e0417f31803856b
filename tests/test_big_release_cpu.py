"""benchmarks/big_release.py on the host backend (issue 48; its GPU run is the lead's): a
forward whose inputs a seeded generator made is captured as regenerable ranges, paired
(eager against fused), run, published and packed into one small tar; the tar alone, unpacked
afresh elsewhere, is re-verified, and the verdict per operator is read from the re-run.
Refusals: regions under the requested size, a packed release over the limit (the tar on disk
is never partly written)."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import random
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "big_release.py"
#: Short measurements: the fused candidate is several times faster, far outside the noise.
QUICK = ["--time-cap", "0.5"]


def _script(*args: str, timeout: float = 600) -> tuple[int, dict, str]:
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=timeout)
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def _module():
    spec = importlib.util.spec_from_file_location("big_release", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tar(path: Path) -> tarfile.TarFile:
    """The tar inside a .tar.zst, opened from memory."""
    import zstandard

    with open(path, "rb") as f:
        data = zstandard.ZstdDecompressor().stream_reader(f).read()
    return tarfile.open(fileobj=io.BytesIO(data))


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("publish")
    code, doc, stderr = _script("publish", "--backend", "host", "-o", str(out), "--work-tar",
                                str(out / "work.tar.zst"), "--mutate-mib", "1", *QUICK)
    assert code == 0, (stderr, doc.get("error"), doc.get("failed_step"))
    return {"out": out, "doc": doc}


def test_publish_packs_a_regenerable_release(published):
    out, doc = published["out"], published["doc"]
    assert doc["status"] == "published" and doc["backend"] == "host"
    assert doc == json.loads((out / "publish.json").read_text())
    # The regions are at least what was asked for, made by the seeded generator, and the
    # published harness stores under 1% of them.
    asked = int(doc["problem"]["requested_gib"] * (1 << 30))
    assert doc["region_bytes"] >= asked
    made = {r["name"]: r["made_by"] for r in doc["regions"]}
    assert made["x"] == ["bk_uniform"] and made["y"] is None
    assert doc["published"]["region_bytes"] == doc["region_bytes"]
    assert 0 < doc["stored_bytes"] <= doc["region_bytes"] // 100
    # Judged under the declared policy (tolerance on y; x resampled in its first MiB, the
    # other inputs whole by kpair's derived mutations), faster by its estimate.
    assert doc["policy"]["tolerances"][0]["region"] == "y"
    run = json.loads((out / "work" / "run.json").read_text())
    assert run["trust"]["differential"]["finding"]["mutations"] == [
        f"resample x[0:{1 << 20}) as float32", "resample scale as float32",
        "resample bias as float32"]
    assert doc["published"]["status"] == "pass"
    assert doc["published"]["correctness"].startswith("tolerance")
    assert doc["run"]["speedup"] > 1 and doc["published"]["speedup"] > 1
    assert set(doc["seconds"]) >= {"capture", "pair", "run", "publish", "pack"}
    # One tar, its size as reported, and no temporary left beside it.
    tar = out / "release.tar.zst"
    assert tar.stat().st_size == doc["tar_bytes"] <= 16 << 20
    assert sorted(p.name for p in out.iterdir()) == ["publish.json", "release.tar.zst", "work",
                                                     "work.tar.zst"]
    assert doc["work_tar_bytes"] == (out / "work.tar.zst").stat().st_size
    with _tar(tar) as t:
        names = set(t.getnames())
    key = "release/level2/ScaleBiasHardtanhSum"
    assert {"release/index.json", f"{key}/harness/harness.json",
            f"{key}/harness/capture/snapshot.json"} <= names
    assert not any(n.endswith(".kpair-release.lock") for n in names)
    with _tar(tar) as t:
        policy = json.loads(t.extractfile(f"{key}/harness/capture/validation_policy.json")
                            .read())
    assert policy["mutations"] == doc["policy"]["mutations"]


def test_verify_from_the_tar_alone(published, tmp_path):
    """The tar copied elsewhere, the publish folder moved out of the way: verify unpacks it
    afresh and says per operator what kpair verify found there."""
    tar = tmp_path / "carried" / "release.tar.zst"
    tar.parent.mkdir()
    shutil.copyfile(published["out"] / "release.tar.zst", tar)
    gone = published["out"].with_name(published["out"].name + ".away")
    published["out"].rename(gone)
    try:
        code, doc, stderr = _script("verify", str(tar), "-o", str(tmp_path / "v"),
                                    "--backend", "host", *QUICK)
        wrong = _script("verify", str(tar), "-o", str(tmp_path / "w"), "--backend", "cuda")
    finally:
        gone.rename(published["out"])
    assert wrong[0] == 2 and "a host release, not cuda" in wrong[2]
    assert code == 0, (stderr, doc)
    assert doc["status"] == "verified" and doc["backend"] == "host"
    assert doc == json.loads((tmp_path / "v" / "verify.json").read_text())
    fresh = Path(doc["unpacked_into"])
    assert fresh.parent == tmp_path / "v" and (fresh / "release" / "index.json").is_file()
    index = json.loads((tmp_path / "v" / "index.json").read_text())
    assert index == json.loads((fresh / "release" / "index.json").read_text())
    (row,) = index["operators"]
    (v,) = row["verifications"]       # the fresh copy's first verification: this one
    (op,) = doc["operators"]
    assert op["key"] == f"level{row['level']}/{row['name']}"
    assert (op["verdict"], op["outcome"], op["inside"]) == (v["verdict"], v["outcome"],
                                                             v["inside"])
    assert op["speedup"] == v["speedup"] and op["ci95"] == v["ci95"]
    lo, hi = op["published_ci95"]
    assert op["inside"] == (lo <= op["speedup"] <= hi)
    assert doc["inside"] == int(op["inside"]) and doc["compared"] == 1
    assert op["stage_s"]["measure"] > 0 and op["run_wall_s"] > 0   # the re-run's own file
    assert op["stored_bytes"] <= op["region_bytes"] // 100


def test_over_the_limit_is_refused_at_the_first_step_that_shows_it(published):
    """Publishing again into the same folder resumes every step from its work folder. A
    limit under what the capture stores is refused after the capture, one under the harness
    packed alone before any run, one under the whole release at the pack; each leaves the
    earlier release.tar.zst as it was, and no temporary file."""
    out, first = published["out"], published["doc"]
    assert first["snapshot_stored_bytes"] < first["harness_packed_bytes"] < first["tar_bytes"]
    before = _sha(out / "release.tar.zst")
    cases = [((0, first["snapshot_stored_bytes"]), ["capture"], "stored as bytes, not"),
             ((first["snapshot_stored_bytes"], first["harness_packed_bytes"]),
              ["capture", "pair"], "the harness alone, before any run"),
             ((first["harness_packed_bytes"], first["tar_bytes"]),
              ["capture", "pair", "run", "publish"], "over the limit")]
    try:
        for (lo, hi), resumed, says in cases:
            mib = (lo + hi) / 2 / (1 << 20)
            code, doc, stderr = _script("publish", "--backend", "host", "-o", str(out),
                                        "--force", "--max-tar-mib", repr(mib), *QUICK)
            assert code == 1, (stderr, doc)
            assert doc["resumed"] == resumed and doc["status"] == "refused"
            assert says in doc["error"] and "over" in doc["error"]
            assert stderr.count("\n") == 1 and says in stderr and "Traceback" not in stderr
            assert _sha(out / "release.tar.zst") == before
            assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
            assert json.loads((out / "publish.json").read_text()) == doc
    finally:   # the published JSON back, for the tests after this one
        (out / "publish.json").write_text(json.dumps(first, indent=1) + "\n")


def test_a_publish_resumes_elsewhere_from_its_work_tar(published, tmp_path):
    """The work folder packed by the first publish, unpacked under another folder: every
    step is taken from it, the same operator is packed again, the first call's device and
    seconds are kept beside this one's."""
    carried = tmp_path / "work.tar.zst"
    shutil.copyfile(published["out"] / "work.tar.zst", carried)
    code, doc, stderr = _script("publish", "--backend", "host", "-o", str(tmp_path / "again"),
                                "--resume", str(carried), *QUICK)
    assert code == 0, (stderr, doc)
    first = published["doc"]
    assert doc["resumed"] == ["capture", "pair", "run", "publish"]
    assert doc["earlier"]["device"] == first["device"]
    assert doc["earlier"]["seconds"] == first["seconds"]
    assert doc["published"] == first["published"] and doc["run"] == first["run"]
    assert doc["region_bytes"] == first["region_bytes"]
    with _tar(tmp_path / "again" / "release.tar.zst") as a, \
            _tar(published["out"] / "release.tar.zst") as b:
        index_a = json.loads(a.extractfile("release/index.json").read())
        index_b = json.loads(b.extractfile("release/index.json").read())
    assert index_a == index_b
    # A second resume into a folder that holds a capture is refused, the folder kept.
    code, doc, stderr = _script("publish", "--backend", "host", "-o", str(tmp_path / "again"),
                                "--force", "--resume", str(carried), *QUICK)
    assert code == 2 and "already holds a capture" in stderr
    assert (tmp_path / "again" / "work" / "cap" / "done.json").is_file()


def test_regions_under_the_requested_size_are_refused(tmp_path):
    code, doc, stderr = _script("publish", "--backend", "host", "-o", str(tmp_path),
                                "--rows", "16", "--cols", "64", "--gib", "0.001", *QUICK)
    assert code == 1, (stderr, doc)
    assert doc["status"] == "refused" and doc["region_bytes"] < int(0.001 * (1 << 30))
    assert "under the requested" in stderr and stderr.count("\n") == 1
    assert not (tmp_path / "release.tar.zst").exists() and "pair" not in doc["seconds"]


def test_an_existing_tar_needs_force(tmp_path):
    (tmp_path / "release.tar.zst").write_bytes(b"x")
    code, doc, stderr = _script("publish", "--backend", "host", "-o", str(tmp_path))
    assert code == 2 and "--force" in stderr and doc["status"] == "error"
    assert (tmp_path / "release.tar.zst").read_bytes() == b"x"


#: 16 KiB no compressor shrinks.
BLOB = random.Random(0).randbytes(16 << 10)


def test_pack_writes_the_whole_tar_or_nothing(tmp_path, monkeypatch):
    br = _module()
    rel = tmp_path / "rel"
    (rel / "level1" / "op").mkdir(parents=True)
    (rel / "index.json").write_text("{}")
    (rel / "level1" / "op" / "blob").write_bytes(BLOB)
    out = tmp_path / "release.tar.zst"
    out.write_bytes(b"the earlier tar")

    calls = []
    real_add = tarfile.TarFile.add

    def failing_add(self, *a, **kw):   # the disk fills after the first member
        calls.append(a[0])
        if len(calls) > 1:
            raise OSError(28, "No space left on device")
        return real_add(self, *a, **kw)

    monkeypatch.setattr(tarfile.TarFile, "add", failing_add)
    with pytest.raises(OSError, match="No space"):
        br.pack(rel, out, 1 << 20)
    assert out.read_bytes() == b"the earlier tar"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rel", "release.tar.zst"]
    monkeypatch.undo()

    with pytest.raises(br.Stop, match="over the limit") as e:
        br.pack(rel, out, 4096)
    assert e.value.code == 1 and out.read_bytes() == b"the earlier tar"
    size = br.pack(rel, out, 1 << 20)
    assert size == out.stat().st_size
    with _tar(out) as t:
        assert t.extractfile("release/level1/op/blob").read() == BLOB
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rel", "release.tar.zst"]
    # A name without .zst: a plain tar; both unpack to the same release.
    plain = br.pack(rel, tmp_path / "plain.tar", 1 << 20)
    assert plain > size
    for packed in (out, tmp_path / "plain.tar"):
        got = br.unpack(packed, tmp_path / f"fresh-{packed.name}")
        assert (got / "level1" / "op" / "blob").read_bytes() == BLOB
        assert sorted(p.name for p in got.parent.iterdir()) == ["release"]


def test_verify_refuses_what_is_not_a_release_tar(tmp_path):
    code, doc, stderr = _script("verify", str(tmp_path / "none.tar"), "-o", str(tmp_path / "v"))
    assert code == 3 and "no such release tar" in stderr and doc["status"] == "error"
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w") as t:
        info = tarfile.TarInfo("release/link")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        t.addfile(info)
    code, doc, stderr = _script("verify", str(bad), "-o", str(tmp_path / "v"))
    assert code == 3 and "neither a file nor a folder" in stderr
    empty = tmp_path / "empty.tar"
    with tarfile.open(empty, "w"):
        pass
    code, doc, stderr = _script("verify", str(empty), "-o", str(tmp_path / "v2"))
    assert code == 3 and "no release/index.json" in stderr


def test_the_cuda_steps_with_a_host_stand_in_for_kpair_capture(tmp_path, monkeypatch, capsys):
    """The cuda publish as the lead's GPU call runs it, its one GPU step (``kpair capture``
    of the program) replaced by the host recording written where and as ``kpair capture``
    writes it (``capture.json``'s ``ranges``, one folder per range): the arguments it is
    given parse as the program's, the rest (policy, pair, release add, pack) runs for real on
    what it wrote. The separate ``kpair run`` is made to run past its time: it is recorded as
    timed out, given at most half the time left, and the publication goes on."""
    br = _module()
    real = br._kpair
    seen = []

    def fake(*args, timeout):
        if args[0] == "run":
            seen.append(timeout)
            return {"exit_code": 124, "stdout": "", "stderr": "timed out", "s": timeout}
        if args[0] != "capture":
            return real(*args, timeout=timeout)
        seen.append(args)
        out = Path(args[args.index("-o") + 1])
        program = br.parser().parse_args(list(args[args.index("--") + 3:]))
        assert args[args.index("--") + 1] == sys.executable and program.verb == "program"
        stats = br.record_host(out, program.rows, program.cols, program.seed)
        program.stats.write_text(json.dumps(stats))
        records = [{"name": n, "status": "captured", "occurrence": 1, "source": "mark",
                    "snapshot": n, "ops": ops, "capture_s": 0.5, "regenerated": 3}
                   for n, ops in (("eager", 4), ("compiled", 1))]
        (out / "capture.json").write_text(json.dumps({"ranges": records}))
        return {"exit_code": 0, "stdout": "", "stderr": "3 regenerable region(s) verified",
                "s": 1.0}

    monkeypatch.setattr(br, "_kpair", fake)
    out = tmp_path / "out"
    code = br.main(["publish", "--backend", "cuda", "-o", str(out), "--gib", "0.0078125",
                    "--cols", "1024", "--seed", "3", "--time-cap", "0.5",
                    "--deadline", "400"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, doc
    capture, run_timeout = seen
    assert 60 <= run_timeout <= 200 and doc["run"]["status"] == "timed out"
    size = int(capture[capture.index("--max-region-bytes") + 1])
    assert size >= 5 * doc["region_bytes"]   # x and its whole-size scratch fit under it
    assert capture[capture.index("--range") + 1] == "eager" and "compiled" in capture
    assert doc["program"]["rows"] == 2048 and doc["program"]["seed"] == 3
    assert [r["name"] for r in doc["capture_ranges"]] == ["eager", "compiled"]
    assert doc["capture_stderr"] == "3 regenerable region(s) verified"
    assert doc["status"] == "published" and doc["published"]["status"] == "pass"
    assert doc["stored_bytes"] <= doc["region_bytes"] // 100
    assert (out / "release.tar.zst").stat().st_size == doc["tar_bytes"]
    with _tar(out / "release.tar.zst") as t:
        index = json.loads(t.extractfile("release/index.json").read())
    (row,) = index["operators"]
    assert row["range"] == {"name": "eager", "ops": 4} and row["plan_launches"] == 1
