"""A newcomer's first hour, as a battery: bad inputs and interruptions through the real CLI.

Each case runs ``python -m kpair ...`` in a subprocess (with a private TMPDIR, so that
leftover ``kpair-*`` temporary directories can be counted) and asserts its exit status
(README "Exit codes"), a message that names the problem, no traceback, and that nothing was
left behind or replaced: existing files stay byte-identical. Host backend, small harnesses,
few blocks.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import CSRC, record_matmul
from conftest import file_state as state
from kpair.harness import create_harness
from kpair.toolchain import compile_shared

SRC = Path(__file__).resolve().parent.parent / "src"
QUICK = ["--min-blocks", "4", "--max-blocks", "8", "--time-cap", "2", "--replicates", "1",
         "--no-control"]
#: A run long enough to be interrupted in the middle.
LONG = ["--min-blocks", "2000", "--max-blocks", "4000", "--time-cap", "60", "--replicates",
        "1", "--no-control"]


# ---------------------------------------------------------------------- helpers


class Kpair:
    """Runs the CLI in ``cwd`` with its own TMPDIR; remembers the last call."""

    def __init__(self, cwd: Path):
        self.cwd, self.tmp = cwd, cwd / ".tmp"
        self.tmp.mkdir(exist_ok=True)
        self.env = {**os.environ, "TMPDIR": str(self.tmp),
                    "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "kpair", *map(str, args)]

    def __call__(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(*args), cwd=self.cwd, env=self.env, input=stdin,
                              capture_output=True, text=True, timeout=600)

    def leftovers(self) -> list[str]:
        return sorted(p.name for p in self.tmp.iterdir())


def expect(proc: subprocess.CompletedProcess, code: int, *words: str) -> str:
    """The exit status is ``code``, the output (stderr, or a run's verdict line on stdout)
    names every one of ``words`` (case-insensitive), and nothing printed a traceback.
    Returns stderr."""
    err, said = proc.stderr, (proc.stderr + proc.stdout).lower()
    assert "Traceback" not in err and "Traceback" not in proc.stdout, err
    assert proc.returncode == code, (proc.returncode, err[-2000:])
    for w in words:
        assert w.lower() in said, (w, err[-2000:], proc.stdout[-2000:])
    return err




def interrupt(k: Kpair, sig: int, *args: str, after: Path | None = None, wait_s: float = 4.0
              ) -> subprocess.CompletedProcess:
    """Start ``kpair args``, send ``sig`` once it is well under way (``after`` exists, or
    ``wait_s`` passed), and collect it."""
    # SIGINT as at a terminal: a suite started in the background (``cmd &`` in a script)
    # runs with SIGINT ignored, and kpair would inherit that and never see Ctrl-C.
    p = subprocess.Popen(k.argv(*args), cwd=k.cwd, env=k.env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    started = time.monotonic()
    while time.monotonic() < deadline and p.poll() is None:
        ready = after is None or any(after.glob("kpair-*"))
        if ready and time.monotonic() - started >= wait_s:
            break
        time.sleep(0.1)
    if p.poll() is not None:
        out, err = p.communicate()
        raise AssertionError(f"ended ({p.returncode}) before it could be interrupted: "
                             f"{out[-1000:]} {err[-1000:]}")
    p.send_signal(sig)
    out, err = p.communicate(timeout=120)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Path:
    """Libraries (naive, fast, off-by-one, one without the symbol), a snapshot, a harness
    with a passing result.json, and a one-operator release."""
    d = tmp_path_factory.mktemp("newcomer")
    for name, v in (("naive", 0), ("fast", 1), ("offbyone", 2)):
        compile_shared(CSRC / "matmul.c", d / f"{name}.so", defines={"KP_VARIANT": v})
    (d / "other.c").write_text("int other_function(int x) { return x + 1; }\n")
    compile_shared(d / "other.c", d / "nosym.so")
    record_matmul(d / "naive.so", d / "snap", n=32)
    create_harness(d / "snap", d / "H", opt=d / "fast.so")
    create_harness(d / "snap", d / "BAD", opt=d / "offbyone.so")
    k = Kpair(d)
    expect(k("run", "H", *QUICK), 0)
    expect(k("release", "add", "REL", "H", "--level", "1", "--name", "mm", "--allow-slower",
             *QUICK), 0)
    return d


@pytest.fixture
def k(lab) -> Kpair:
    return Kpair(lab)


# ---------------------------------------------------------------------- outputs (items 1, 3)


def test_run_onto_dev_full_is_refused_before_anything_is_written(k, lab):
    before = state(lab / "H")
    err = expect(k("run", "H", "-o", "/dev/full", *QUICK), 2, "/dev/full", "character device")
    assert "give a file path" in err
    assert stat.S_ISCHR(os.lstat("/dev/full").st_mode)
    assert state(lab / "H") == before and k.leftovers() == []


def test_policy_suggest_onto_dev_full_is_refused_before_the_ref_runs(k):
    err = expect(k("policy", "suggest", "H", "-o", "/dev/full"), 2, "/dev/full")
    assert "kpair policy: region" not in err  # refused before ref ran
    assert stat.S_ISCHR(os.lstat("/dev/full").st_mode)


def test_run_onto_a_directory(k, lab):
    (lab / "adir").mkdir(exist_ok=True)
    expect(k("run", "H", "-o", "adir", *QUICK), 2, "adir", "is a directory")
    assert list((lab / "adir").iterdir()) == []


def test_run_onto_a_fifo(k, lab):
    fifo = lab / "pipe.json"
    if not fifo.exists():
        os.mkfifo(fifo)
    expect(k("run", "H", "-o", "pipe.json", *QUICK), 2, "pipe.json", "FIFO")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_run_under_a_file(k, lab):
    (lab / "plain.txt").write_text("mine")
    expect(k("run", "H", "-o", "plain.txt/r.json", *QUICK), 2, "not a directory")
    assert (lab / "plain.txt").read_text() == "mine"


def test_run_into_a_folder_that_cannot_be_written(k, lab):
    if os.geteuid() == 0:
        target = "/sys/kpair-newcomer.json"  # root ignores mode bits; sysfs does not
    else:
        ro = lab / "ro"
        ro.mkdir(exist_ok=True)
        ro.chmod(0o555)
        target = str(ro / "r.json")
    expect(k("run", "H", "-o", target, *QUICK), 2, "cannot be written")
    assert not os.path.lexists(target)


def test_run_does_not_replace_a_file_without_force(k, lab):
    (lab / "taken.json").write_text("my notes")
    expect(k("run", "H", "-o", "taken.json", *QUICK), 2, "taken.json", "--force")
    assert (lab / "taken.json").read_text() == "my notes"
    assert not (lab / "taken.samples.npz").exists()


def test_run_with_force_replaces_it(k, lab):
    (lab / "forced.json").write_text("old")
    expect(k("run", "H", "-o", "forced.json", "--force", *QUICK), 0)
    assert json.loads((lab / "forced.json").read_text())["status"] == "pass"


def test_usage_error_leaves_the_passing_result_alone(k, lab):
    before = state(lab / "H")
    expect(k("run", "H", "--time-cap", "-1"), 2, "--time-cap")
    expect(k("run", "H", "--min-blocks", "2"), 2, "--min-blocks")
    expect(k("run", "H", "--min-blocks", "64", "--max-blocks", "8"), 2, "min_blocks")
    assert state(lab / "H") == before
    assert json.loads((lab / "H" / "result.json").read_text())["status"] == "pass"


def test_each_result_has_its_own_samples_file(k, lab):
    from kpair.snapshot import sha256

    for name in ("r2", "r3"):
        expect(k("run", "H", "-o", f"{name}.json", *QUICK), 0)
    for name in ("r2", "r3"):
        speed = json.loads((lab / f"{name}.json").read_text())["speed"]
        assert speed["samples_file"] == f"{name}.samples.npz"
        assert sha256((lab / f"{name}.samples.npz").read_bytes()) == speed["samples_sha256"]
        assert (lab / f"{name}.worker.log").is_file()


def test_a_reused_evaluation_directory_appends(k, lab):
    expect(k("evaluate", "H", "fast.so", "-o", "EV", *QUICK), 0)
    first = state(lab / "EV" / "results" / "0001")
    expect(k("evaluate", "BAD", "offbyone.so", "fast.so", "-o", "EV", *QUICK), 1)
    assert state(lab / "EV" / "results" / "0001") == first
    lines = [json.loads(x) for x in (lab / "EV" / "attempts.jsonl").read_text().splitlines()]
    assert [x["n"] for x in lines] == [1, 2, 3]
    assert sorted(p.name for p in (lab / "EV" / "results").iterdir()) == ["0001", "0002",
                                                                          "0003"]


def test_evaluate_onto_a_file_is_refused(k, lab):
    (lab / "evfile").write_text("x")
    expect(k("evaluate", "H", "fast.so", "-o", "evfile", *QUICK), 2, "evfile", "not a directory")
    assert (lab / "evfile").read_text() == "x"


def test_evaluate_of_a_missing_candidate_makes_nothing(k, lab):
    expect(k("evaluate", "H", "fast.so", "gone.so", "-o", "EVGONE", *QUICK), 3, "gone.so",
           "no such candidate")
    assert not (lab / "EVGONE").exists()


def test_evaluate_json_and_jsonl_exclude_each_other(k, lab):
    expect(k("evaluate", "H", "--json", "--jsonl", "-o", "EVBOTH", *QUICK), 2, "--jsonl")
    assert not (lab / "EVBOTH").exists()


# ---------------------------------------------------------------------- machine output (4)


def test_evaluate_json_is_one_document(k):
    proc = k("evaluate", "H", "fast.so", "offbyone.so", "-o", "EVJ", "--json", *QUICK)
    expect(proc, 1)  # one candidate fails correctness, none errored
    doc = json.loads(proc.stdout)
    assert [a["status"] for a in doc["attempts"]] == ["pass", "fail"]
    assert doc["exit_code"] == 1 and "[1]" in proc.stderr  # human lines on stderr


def test_json_on_pair_run_report_inspect(k, lab):
    proc = k("pair", "snap", "--opt", "fast.so", "-o", "HJ", "--json")
    assert expect(proc, 0) == "" and json.loads(proc.stdout)["opt"]["kernel"] == "kp_matmul"
    proc = k("run", "HJ", "--json", *QUICK)
    expect(proc, 0)
    assert json.loads(proc.stdout)["status"] == "pass"
    proc = k("report", "REL", "--json", "--markdown-only")
    expect(proc, 0)
    assert (lab / json.loads(proc.stdout)["markdown"]).is_file()
    proc = k("inspect", "snap", "--json")
    expect(proc, 0)
    json.loads(proc.stdout)


def test_evaluate_jsonl_bad_request_line(k):
    proc = k("evaluate", "H", "--jsonl", "-o", "EVL", *QUICK, stdin="not json\n")
    expect(proc, 2)
    assert "not JSON" in json.loads(proc.stdout.splitlines()[0])["error"]


# ---------------------------------------------------------------------- bad inputs (8)


def test_missing_opt_and_missing_snapshot_are_the_same_code(k, lab):
    expect(k("pair", "snap", "--opt", "nope.so", "-o", "P1"), 3, "nope.so", "no such file")
    expect(k("pair", "nosnap", "--opt", "fast.so", "-o", "P2"), 3, "nosnap")
    assert not (lab / "P1").exists() and not (lab / "P2").exists()


@pytest.fixture(scope="module")
def corrupt(lab) -> dict[str, Path]:
    """Three damaged copies of the snapshot: a truncated blob, a truncated manifest, a
    manifest whose sha256 of a blob is wrong."""
    out = {}
    for kind in ("blob", "manifest", "hash"):
        d = lab / f"snap-{kind}"
        if not d.exists():
            shutil.copytree(lab / "snap", d)
            manifest = d / "snapshot.json"
            if kind == "blob":
                blob = sorted((d / "blobs").iterdir())[0]
                blob.write_bytes(blob.read_bytes()[:7])
            elif kind == "manifest":
                text = manifest.read_text()
                manifest.write_text(text[:len(text) // 2])
            else:
                m = json.loads(manifest.read_text())
                m["regions"][0]["pre"]["sha256"] = "0" * 64
                manifest.write_text(json.dumps(m))
        out[kind] = d
    return out


@pytest.mark.parametrize("kind", ["blob", "manifest", "hash"])
@pytest.mark.parametrize("verb", ["pair", "inspect", "replay"])
def test_a_corrupt_snapshot_is_3_in_every_verb(k, lab, corrupt, kind, verb):
    snap = corrupt[kind].name
    args = {"pair": ["pair", snap, "--opt", "fast.so", "-o", f"P-{kind}"],
            "inspect": ["inspect", snap], "replay": ["replay", snap, "--runs", "1"]}[verb]
    expect(k(*args), 3, snap)
    assert not (lab / f"P-{kind}").exists() and k.leftovers() == []


def test_missing_symbol_is_refused_at_pair_time(k, lab):
    expect(k("pair", "snap", "--opt", "nosym.so", "-o", "P3"), 4, "kp_matmul",
           "not exported", "other_function")
    expect(k("pair", "snap", "--opt", "fast.so", "--opt-kernel", "kp_nope", "-o", "P4"), 4,
           "kp_nope")
    assert not (lab / "P3").exists() and not (lab / "P4").exists()


def test_wrong_architecture_is_refused_at_pair_time(k, lab):
    data = bytearray((lab / "fast.so").read_bytes())
    data[18:20] = struct.pack("<H", 183 if data[18] == 62 else 62)  # x86_64 <-> aarch64
    (lab / "alien.so").write_bytes(bytes(data))
    expect(k("pair", "snap", "--opt", "alien.so", "-o", "P5"), 4, "built for")
    assert not (lab / "P5").exists()


def test_not_a_code_object(k, lab):
    (lab / "notes.txt").write_text("hello")
    expect(k("pair", "snap", "--opt", "notes.txt", "-o", "P6"), 3, "notes.txt",
           "unrecognised code object")


def test_pair_onto_a_non_empty_directory_or_a_device(k, lab):
    (lab / "full").mkdir(exist_ok=True)
    (lab / "full" / "keep.txt").write_text("mine")
    expect(k("pair", "snap", "--opt", "fast.so", "-o", "full"), 2, "not empty")
    assert (lab / "full" / "keep.txt").read_text() == "mine"
    expect(k("pair", "snap", "--opt", "fast.so", "-o", "/dev/full"), 2, "character device")


def test_run_of_a_missing_or_tampered_harness(k, lab):
    expect(k("run", "no-such-harness", *QUICK), 3, "no-such-harness")
    if not (lab / "HT").exists():
        shutil.copytree(lab / "H", lab / "HT")
        data = bytearray((lab / "HT" / "opt.so").read_bytes())
        data[-1] ^= 0xFF
        (lab / "HT" / "opt.so").write_bytes(bytes(data))
    expect(k("run", "HT", *QUICK), 3, "opt.so", "sha256")
    result = json.loads((lab / "HT" / "result.json").read_text())  # an error, no verdict
    assert result["correct"] is None and result["error"]["exit_code"] == 3


def test_release_add_onto_a_file_or_with_missing_provenance(k, lab):
    (lab / "relfile").write_text("x")
    expect(k("release", "add", "relfile", "H", "--level", "1", "--name", "mm", *QUICK), 2,
           "relfile")
    assert (lab / "relfile").read_text() == "x"
    expect(k("release", "add", "REL2", "H", "--level", "1", "--name", "mm",
             "--provenance", "nowhere", *QUICK), 3, "nowhere")
    assert not (lab / "REL2").exists()


def test_report_of_a_non_release_and_onto_a_device(k, lab):
    expect(k("report", "H"), 3, "index.json")
    before = state(lab / "REL")
    expect(k("report", "REL", "-o", "/dev/full"), 2, "/dev/full")
    assert state(lab / "REL") == before


def test_demo_onto_a_device_or_a_non_empty_directory(k, lab):
    expect(k("demo", "--out", "/dev/full"), 2, "/dev/full")
    expect(k("demo", "--out", "full"), 2, "not empty")
    assert (lab / "full" / "keep.txt").read_text() == "mine"


def test_policy_suggest_of_a_missing_harness(k):
    expect(k("policy", "suggest", "nothing-here"), 3, "nothing-here")


def test_replay_usage_errors(k):
    expect(k("replay", "snap", "--timeout", "-1"), 2, "--timeout")
    expect(k("replay", "snap", "--runs", "0"), 2, "--runs")


# ---------------------------------------------------------------------- messages (11)


def test_a_refused_fail_says_fail_once_and_the_report_counts_it(k, lab):
    proc = k("release", "add", "REL", "BAD", "--level", "1", "--name", "bad", *QUICK)
    expect(proc, 1)
    assert "refused level1/bad" in proc.stdout and "FAIL: FAIL" not in proc.stdout
    assert "FAIL" in proc.stdout
    expect(k("report", "REL", "--markdown-only"), 0)
    md = (lab / "REL" / "report.md").read_text()
    assert "1 fail" in md and "0 fail" not in md


# ---------------------------------------------------------------------- interruptions (9)


def test_sigterm_during_run(k, lab):
    before = state(lab / "H")
    proc = interrupt(k, signal.SIGTERM, "run", "H", *LONG, after=k.tmp)
    expect(proc, 143, "SIGTERM")
    assert state(lab / "H") == before and k.leftovers() == []


def test_ctrl_c_during_run(k, lab):
    before = state(lab / "H")
    proc = interrupt(k, signal.SIGINT, "run", "H", *LONG, after=k.tmp)
    expect(proc, 130, "interrupted")
    assert state(lab / "H") == before and k.leftovers() == []


def test_ctrl_c_during_verify(k, lab):
    before = state(lab / "REL" / "index.json", lab / "REL" / "level1")
    proc = interrupt(k, signal.SIGINT, "verify", "REL", *LONG, after=k.tmp)
    expect(proc, 130, "interrupted")
    time.sleep(0.5)
    assert k.leftovers() == []
    assert state(lab / "REL" / "index.json", lab / "REL" / "level1") == before


def test_sigterm_during_evaluate_keeps_earlier_results(k, lab):
    expect(k("evaluate", "H", "fast.so", "-o", "EVT", *QUICK), 0)
    before = state(lab / "EVT" / "results")
    proc = interrupt(k, signal.SIGTERM, "evaluate", "H", "fast.so", "-o", "EVT", *LONG,
                     after=k.tmp)
    expect(proc, 143)
    assert state(lab / "EVT" / "results") == before and k.leftovers() == []


# ---------------------------------------------------------------------- pair-time checks (7)


def test_cubin_symbol_and_parameter_layout_are_read_without_a_gpu():
    """The checks ``kpair pair`` makes on a CUDA code object, on a real sm_90 cubin."""
    from types import SimpleNamespace as NS

    from kpair.codecheck import check_kernel
    from kpair.errors import AbiMismatch, ArchitectureMismatch, SymbolNotFound

    cubin = (Path(__file__).parent / "data" / "kp_add_sm90.cubin").read_bytes()

    def manifest(*layout, backend="cuda"):
        return NS(backend=backend, arch="sm_90", kernarg=NS(params=[
            NS(offset=o, size=s) for o, s in layout]))

    add = manifest((0, 8), (8, 8), (16, 8), (24, 4))
    check_kernel(cubin, "cubin", "kp_add", add, "opt")  # the right layout passes
    with pytest.raises(SymbolNotFound, match="kp_add"):
        check_kernel(cubin, "cubin", "kp_sub", add, "opt")
    with pytest.raises(AbiMismatch, match=r"\(8, 4\)"):
        check_kernel(cubin, "cubin", "_Z8kp_scaleIfEvPT_S0_i", add, "opt")
    with pytest.raises(ArchitectureMismatch, match="host backend"):
        check_kernel(cubin, "cubin", "kp_add", manifest(backend="host"), "opt")


# ---------------------------------------------------------------------- every verb's --json (4)


@pytest.fixture
def program(monkeypatch, tmp_path):
    """``kpair capture`` and ``kpair profile`` without a GPU: the stand-in children of
    tests/test_capture_cpu.py and tests/test_profile_cpu.py (a real CaptureSession on a fake
    driver; the real profiler over a stand-in CUPTI), each printing to stdout as a program
    does (the profiled one is ``PROG``, run for real)."""
    import kpair.capture.profiler as profiler
    import kpair.capture.workflow as cli_capture
    from kpair.capture import cupti
    from test_capture_cpu import FAKE_CHILD
    from test_profile_cpu import PROFILE_CHILD

    tests = str(Path(__file__).parent)
    cap, prof = tmp_path / "cap_child.py", tmp_path / "prof_child.py"
    cap.write_text(FAKE_CHILD.format(tests=tests))
    prof.write_text(PROFILE_CHILD.format(tests=tests))
    monkeypatch.setattr(cupti, "find_cupti", lambda *a: "/fake/libcupti.so")
    monkeypatch.setattr(cli_capture, "child_command", lambda cmd: [sys.executable, str(cap)])
    monkeypatch.setattr(profiler, "child_command",
                        lambda command, **kw: [sys.executable, str(prof), *command[1:]])
    monkeypatch.chdir(tmp_path)
    return tmp_path


PROG = ["--", "python", "-c", "print('the program', 'ran')"]  # printed unlike its text


def _one_document(out: str) -> dict:
    doc = json.loads(out)   # exactly one JSON document: nothing before or after it
    assert isinstance(doc, dict)
    return doc


def test_capture_json_is_one_document_and_the_program_prints_to_stderr(program, capfd):
    from kpair.cli import main

    assert main(["capture", "-o", "cap", "--json", "--", "python", "prog.py"]) == 3
    out, err = capfd.readouterr()
    doc = _one_document(out)
    assert doc["exit_status"] == 3 and doc["capture"]["exit_status"] == 3
    assert doc["out"] == "cap" and "the program ran" in err and "the program ran" not in out
    assert "0 dispatches captured" in err and "Traceback" not in err


def test_capture_refuses_a_device_a_file_and_a_non_empty_directory(program, capfd):
    from kpair.cli import main

    (program / "mine.txt").write_text("mine")
    (program / "full").mkdir()
    (program / "full" / "keep").write_text("mine")
    for target, words in (("/dev/full", "character device"), ("mine.txt", "not a directory"),
                          ("full", "not empty")):
        assert main(["capture", "-o", target, "--", "python", "prog.py"]) == 2
        err = capfd.readouterr().err
        assert words in err and err.startswith("kpair capture: "), err
    assert (program / "mine.txt").read_text() == "mine"
    assert stat.S_ISCHR(os.lstat("/dev/full").st_mode)
    assert sorted(os.listdir(program / "full")) == ["keep"]


def test_profile_json_force_and_refusals(program, capfd):
    from kpair.cli import main

    assert main(["profile", "-o", "p.json", "--json", *PROG]) == 0
    out, err = capfd.readouterr()
    doc = _one_document(out)
    assert doc["out"] == "p.json" and len(doc["profile"]["kernels"]) == 3
    assert "the program ran" in err and "the program ran" not in out
    assert doc["profile"] == json.loads((program / "p.json").read_text())
    # the file is the user's now: not replaced without --force, refused before the program runs
    (program / "p.json").write_text("my notes")
    assert main(["profile", "-o", "p.json", *PROG]) == 2
    out, err = capfd.readouterr()
    assert "p.json exists" in err and "--force" in err and "the program ran" not in err + out
    assert (program / "p.json").read_text() == "my notes"
    assert main(["profile", "-o", "p.json", "--force", *PROG]) == 0
    assert json.loads((program / "p.json").read_text())["schema"] == "kpair.profile"
    capfd.readouterr()
    for target, words in (("/dev/full", "character device"), (".", "is a directory")):
        assert main(["profile", "-o", target, "--force", *PROG]) == 2
        err = capfd.readouterr().err
        assert words in err and err.startswith("kpair profile: "), err
    assert stat.S_ISCHR(os.lstat("/dev/full").st_mode)
    assert not list(program.glob(".p.json.*"))   # no temporary file left


def test_optimize_json_is_one_document(k, lab):
    """A resumed optimize (the operator is already in the release): the summary as JSON."""
    before = state(lab / "REL" / "index.json")
    proc = k("optimize", "-o", "REL", "--harness", "H", "--name", "mm", "--level", "1",
             "--json")
    expect(proc, 0, "already in")
    doc = _one_document(proc.stdout)
    assert doc["skipped"] == 1 and doc["published"] == 0 and doc["exit_code"] == 0
    assert doc["operators"] == [{"key": "level1/mm", "status": "skipped",
                                 "line": "already in the release", "snapshot": None,
                                 "harness": "H", "producer": None}]
    assert state(lab / "REL" / "index.json") == before


def test_optimize_messages_name_the_verb_not_the_program(k):
    """The program after ``--`` once took the place of the verb's name in every message."""
    err = expect(k("optimize", "-o", "REL-X", "--harness", "H", "--", "python", "x.py"), 2)
    assert err.startswith("kpair optimize: give exactly one of"), err


def test_asm_json_and_its_refusals(k, lab):
    expect(k("asm", "disassemble", "no-such.co", "-o", "ASM"), 3, "no-such.co",
           "no such code object")
    assert not (lab / "ASM").exists()
    (lab / "asm-taken.co").write_text("mine")
    (lab / "asmsrc").mkdir(exist_ok=True)
    (lab / "asmsrc" / "code.s").write_text("\t.text\n")
    expect(k("asm", "assemble", "asmsrc", "-o", "asm-taken.co"), 2, "asm-taken.co", "--force")
    expect(k("asm", "assemble", "asmsrc", "-o", "/dev/full", "--force"), 2, "character device")
    assert (lab / "asm-taken.co").read_text() == "mine"
    from amd_kit import _MISSING, build

    if _MISSING is not None:
        pytest.skip(f"the asm round trip needs LLVM's tools: {_MISSING}")
    co = build("elementwise", lab)
    proc = k("asm", "disassemble", str(co), "-o", "ASM", "--json")
    expect(proc, 0)
    doc = _one_document(proc.stdout)
    assert doc["identical"] is True and (lab / "ASM" / "code.s").is_file()
    before = state(lab / "ASM")
    expect(k("asm", "disassemble", str(co), "-o", "ASM"), 2, "code.s", "--force")
    assert state(lab / "ASM") == before
    proc = k("asm", "assemble", "ASM", "-o", "asm-out.co", "--json")
    expect(proc, 0)
    assert _one_document(proc.stdout)["identical"] is True


# ---------------------------------------------------------------------- API entry points (2)


def test_write_report_of_a_non_release_is_the_clis_error(lab):
    from kpair.errors import InputError
    from kpair.report import write_report

    with pytest.raises(InputError, match="no index.json here: not a release") as e:
        write_report(lab / "H")
    assert e.value.exit_code == 3
    assert not (lab / "H" / "report.md").exists()


def test_ray_names_samples_and_log_per_result_as_a_local_run(lab, tmp_path):
    """The Ray runner writes a task's result as ``run_isolated`` does: r2.json beside
    r2.samples.npz and r2.worker.log (no shared samples.npz), the result naming both."""
    from types import SimpleNamespace as NS

    from kpair.pipeline import RunOptions
    from kpair.scale.jobs import HarnessJob
    from kpair.scale.ray import RayRunner
    from kpair.snapshot import sha256

    result = json.loads((lab / "H" / "result.json").read_text())
    samples = (lab / "H" / "samples.npz").read_bytes()
    task = {"result": result, "samples": samples, "log": b"worker said hi\n",
            "where": {"node": "n1", "gpu_ids": []}}
    ray = NS(get=lambda ref: task)
    (tmp_path / "samples.npz").write_bytes(b"someone else's")
    for name in ("r2", "r3"):
        job = HarnessJob(name, lab / "H", tmp_path / f"{name}.json")
        _, _, written = RayRunner()._gather(ray, job, None, RunOptions())
        assert written.speed.samples_file == f"{name}.samples.npz"
        assert written.log == f"{name}.worker.log"
        assert sha256((tmp_path / f"{name}.samples.npz").read_bytes()) == \
            written.speed.samples_sha256
        assert (tmp_path / f"{name}.worker.log").read_bytes() == b"worker said hi\n"
    assert (tmp_path / "samples.npz").read_bytes() == b"someone else's"


# ---------------------------------------------------------------------- the sandbox (11)


def test_an_opt_that_writes_a_file_fails_by_name(k, lab):
    """Item 11: a write the sandbox blocks no longer passes in silence."""
    if not (lab / "HW").exists():
        (lab / "writer.c").write_text(
            '#include <fcntl.h>\n#include <stdint.h>\n#include <unistd.h>\n'
            'void kp_matmul(const float *a, const float *b, float *c, int32_t n) {\n'
            f'    int fd = open("{lab}/written-by-opt", O_CREAT | O_WRONLY, 0644);\n'
            '    if (fd >= 0) { (void)!write(fd, "x", 1); close(fd); }\n'
            '    for (int i = 0; i < n; i++) for (int j = 0; j < n; j++) {\n'
            '        float s = 0.0f;\n'
            '        for (int q = 0; q < n; q++) s += a[i * n + q] * b[q * n + j];\n'
            '        c[i * n + j] = s; }\n}\n')
        compile_shared(lab / "writer.c", lab / "writer.so", flags=("-O0",))
        create_harness(lab / "snap", lab / "HW", opt=lab / "writer.so")
    proc = k("run", "HW", *QUICK)
    expect(proc, 1, "FAIL [refused_calls]", "the host sandbox refused (openat")
    assert not (lab / "written-by-opt").exists()
    result = json.loads((lab / "HW" / "result.json").read_text())
    assert result["correctness"]["failed_check"] == "refused_calls"
    assert result["trust"]["refused_calls"]["finding"]["opt"]["calls"]["openat"] == 3


# ---------------------------------------------------------------------- found on a second pass


@pytest.mark.parametrize("target", ["", ".", "/"])
def test_run_onto_an_empty_or_directory_name(k, lab, target):
    """``-o ""`` once ended in a ValueError traceback (exit 1: "incorrect")."""
    before = state(lab / "H")
    expect(k("run", "H", "-o", target, *QUICK), 2, "is a directory", "give a file path")
    assert state(lab / "H") == before and k.leftovers() == []


def test_optimize_onto_a_file_a_device_or_an_unwritable_folder(k, lab):
    """Once an OSError at the first write (exit 5), after the capture or search had begun."""
    (lab / "opt-file").write_text("mine")
    expect(k("optimize", "-o", "opt-file", "--harness", "H"), 2, "opt-file",
           "not a directory")
    expect(k("optimize", "-o", "OPTR", "--work", "/dev/null", "--harness", "H"), 2,
           "/dev/null", "character device")
    target = "/sys/kpair-opt" if os.geteuid() == 0 else "/proc/kpair-opt"
    expect(k("optimize", "-o", target, "--harness", "H"), 2, "cannot be written")
    assert (lab / "opt-file").read_text() == "mine" and not (lab / "OPTR").exists()
    assert not (lab / "OPTR.work").exists()
