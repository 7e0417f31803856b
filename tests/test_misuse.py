"""Misuse never costs a result: every verb's options at and beyond their bounds (issue 45).

Each case calls the CLI (``kpair.cli.main`` in this process where nothing runs; a
subprocess where a signal or a whole command is needed) and asserts the exit status of the
README's table, one line on stderr naming the option or path at fault, no traceback, under
``--json`` exactly one JSON document on stdout valid against
``docs/schemas/cli/error.schema.json``, and that no file of the harness, the snapshot or the
release changed (sha256 of every file before and after). Host backend, a 32x32 matmul.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import CSRC, record_matmul
from conftest import file_state as state
from kpair.cli import main as kpair
from kpair.harness import create_harness
from kpair.toolchain import compile_shared

jsonschema = pytest.importorskip("jsonschema", reason="pip install -e '.[test]'")

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "docs" / "schemas" / "cli" / "error.schema.json").read_text())
QUICK = ["--min-blocks", "4", "--max-blocks", "8", "--time-cap", "1", "--replicates", "1",
         "--no-control"]


# ---------------------------------------------------------------------- helpers




def one_document(stdout: str) -> dict:
    """Exactly one JSON document (json.loads refuses anything before or after it)."""
    doc = json.loads(stdout)
    assert isinstance(doc, dict)
    return doc


def check_error_document(doc: dict, code: int, *words: str) -> None:
    jsonschema.validate(doc, SCHEMA)
    assert doc["status"] == ("interrupted" if code in (130, 143) else "error")
    assert doc["exit_code"] == code
    for w in words:
        assert w.lower() in doc["error"]["message"].lower(), (w, doc)


def call(capsys, argv: list[str]) -> tuple[int, str, str]:
    code = kpair([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def with_json(argv: list[str]) -> list[str]:
    """``argv`` with ``--json`` among the verb's options (before a ``--`` program)."""
    if "--" in argv:
        i = argv.index("--")
        return [*argv[:i], "--json", *argv[i:]]
    return [*argv, "--json"]


def expect(capsys, argv: list[str], code: int, *words: str, json_too: bool = True) -> str:
    """``argv`` exits ``code`` with one stderr line naming ``words``; with ``--json`` added,
    the same, plus one schema-valid error document on stdout. Returns the stderr line."""
    got, out, err = call(capsys, argv)
    assert "Traceback" not in err and "Traceback" not in out, err
    assert got == code, (got, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for w in words:
        assert w.lower() in lines[0].lower(), (w, lines[0])
    assert out == ""
    if json_too:
        got, out, err = call(capsys, with_json(argv))
        assert got == code, (got, err)
        assert len(err.strip().splitlines()) == 1, err
        check_error_document(one_document(out), code, *words)
    return lines[0]


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Path:
    """Libraries, a snapshot, a harness with a result.json, a one-operator release (whatever
    its verdicts: the cases below only need them to exist and stay as they are)."""
    from kpair.isolation import run_isolated
    from kpair.pipeline import RunOptions
    from kpair.release import add_operator

    d = tmp_path_factory.mktemp("misuse")
    for name, v in (("naive", 0), ("fast", 1)):
        compile_shared(CSRC / "matmul.c", d / f"{name}.so", defines={"KP_VARIANT": v})
    record_matmul(d / "naive.so", d / "snap", n=32)
    create_harness(d / "snap", d / "H", opt=d / "fast.so")
    quick = RunOptions(min_blocks=4, max_blocks=8, time_cap_s=1.0, replicates=1,
                       control=False, timeout_s=120)
    run_isolated(d / "H", quick)
    add_operator(d / "REL", d / "H", level=1, name="mm", options=quick, allow_slower=True)
    assert (d / "H" / "result.json").is_file() and (d / "REL" / "index.json").is_file()
    return d


@pytest.fixture
def at(lab, monkeypatch):
    """Run in the lab; afterwards, every file of the snapshot, harness and release is as it
    was before the case."""
    monkeypatch.chdir(lab)
    before = state(lab / "snap", lab / "H", lab / "REL")
    yield lab
    assert state(lab / "snap", lab / "H", lab / "REL") == before


# ---------------------------------------------------------------------- 1: bounded options

#: (verb and its arguments, the option refused, words its message says).
RUN_OPTIONS = [
    (["--seed", "-5"], "--seed"),
    (["--seed", "1e24"], "--seed"),
    (["--seed", str(2**63)], "--seed"),
    (["--min-blocks", "1e20"], "--min-blocks"),
    (["--min-blocks", str(10**20)], "--min-blocks"),
    (["--min-blocks", "3"], "--min-blocks"),
    (["--max-blocks", "1000001"], "--max-blocks"),
    (["--rel-ci", "0"], "--rel-ci"),
    (["--rel-ci", "1.5"], "--rel-ci"),
    (["--time-cap", "0"], "--time-cap"),
    (["--time-cap", "-1"], "--time-cap"),
    (["--time-cap", "nan"], "--time-cap"),
    (["--time-cap", "1e9"], "--time-cap"),
    (["--replicates", "0"], "--replicates"),
    (["--replicates", "65"], "--replicates"),
    (["--max-replicates", "1000"], "--max-replicates"),
    (["--timeout", "inf"], "--timeout"),
    (["--timeout", "0"], "--timeout"),
    (["--device", "-1"], "--device"),
    (["--device", "99999"], "--device"),
    (["--skip-check", "nosuch"], "--skip-check"),
]


@pytest.mark.parametrize("extra,option", RUN_OPTIONS, ids=lambda x: " ".join(x)
                         if isinstance(x, list) else None)
def test_run_options_beyond_their_bounds(capsys, at, extra, option):
    expect(capsys, ["run", "H", *extra], 2, option)


def test_run_options_at_their_bounds_are_taken(capsys, at):
    """The largest seed and the bounds themselves are accepted (a real run, to -o)."""
    out = at / "bounds.json"
    code, stdout, err = call(capsys, ["run", "H", "-o", out, "--seed", str(2**63 - 1),
                                      "--device", "0", "--rel-ci", "1", "--replicates", "1",
                                      "--min-blocks", "4", "--max-blocks", "8",
                                      "--time-cap", "1", "--no-control", "--json"])
    result = one_document(stdout)
    assert code != 2 and "argument" not in err, err
    assert result["schema"] == "kpair.result"
    # The seed reached the worker whole (a run the host could not time has no speed).
    assert result["checks"]["seed"] == 2**63 - 1
    assert result["speed"] is None or result["speed"]["seed"] == 2**63 - 1
    for p in (out, out.with_name("bounds.samples.npz"), out.with_name("bounds.worker.log")):
        p.unlink(missing_ok=True)


def test_min_blocks_above_max_blocks(capsys, at):
    expect(capsys, ["run", "H", "--min-blocks", "100", "--max-blocks", "50"], 2, "min_blocks",
           "max_blocks")


def test_the_host_has_one_device(capsys, at):
    expect(capsys, ["run", "H", "--device", "1"], 2, "--device 1", "one device, index 0")


#: Every other verb's numeric options, beyond their bounds: (argv, exit status, words).
VERB_CASES = [
    (["evaluate", "H", "fast.so", "--workers", "0"], 2, ["--workers"]),
    (["evaluate", "H", "fast.so", "--seed", "-1"], 2, ["--seed"]),
    (["evaluate", "H", "fast.so", "--device", "3"], 2, ["--device 3"]),
    (["verify", "REL", "--seed", "-1"], 2, ["--seed"]),
    (["verify", "REL", "--device", "5"], 2, ["--device 5"]),
    (["verify", "REL", "--workers", "0"], 2, ["--workers"]),
    (["verify", "REL", "--max-blocks", "1e9"], 2, ["--max-blocks"]),
    (["release", "add", "REL", "H", "--level", "1", "--name", "x", "--seed", "-1"], 2,
     ["--seed"]),
    (["release", "add", "REL", "H", "--level", "1e23", "--name", "x"], 2, ["--level"]),
    (["release", "add", "REL", "H", "--level", "0", "--name", "x"], 2, ["--level"]),
    (["release", "add", "REL", "H", "--level", "1", "--name", "x", "--device", "7"], 2,
     ["--device 7"]),
    (["release", "add", "REL", "H", "--level", "1", "--name", "x", "--time-cap", "-3"], 2,
     ["--time-cap"]),
    (["replay", "snap", "--runs", "1e9"], 2, ["--runs"]),
    (["replay", "snap", "--runs", "0"], 2, ["--runs"]),
    (["replay", "snap", "--runs", "100001"], 2, ["--runs", "100000"]),
    (["replay", "snap", "--timeout", "-5"], 2, ["--timeout"]),
    (["policy", "suggest", "H", "--runs", "1e9"], 2, ["--runs"]),
    (["policy", "suggest", "H", "--runs", "1"], 2, ["--runs"]),
    (["policy", "suggest", "H", "--margin", "0.5"], 2, ["--margin"]),
    (["policy", "suggest", "H", "--margin", "inf"], 2, ["--margin"]),
    (["capture", "-o", "CAP", "--nth", "0", "--", "python", "-c", "pass"], 2, ["--nth"]),
    (["capture", "-o", "CAP", "--max", "-1", "--", "python", "-c", "pass"], 2, ["--max"]),
    (["capture", "-o", "CAP", "--top", "0", "--", "python", "-c", "pass"], 2, ["--top"]),
    (["capture", "-o", "CAP", "--max-region-bytes", "0", "--", "python", "-c", "pass"], 2,
     ["--max-region-bytes"]),
    (["capture", "-o", "CAP", "--max-region-bytes", "2TiB", "--", "python", "-c", "pass"], 2,
     ["--max-region-bytes"]),
    (["profile", "-o", "P.json", "--top", "0", "--", "python", "-c", "pass"], 2, ["--top"]),
    (["optimize", "-o", "OPT", "--harness", "H", "--rungs", "9"], 2, ["--rungs"]),
    (["optimize", "-o", "OPT", "--harness", "H", "--seed", "-1"], 2, ["--seed"]),
    (["optimize", "-o", "OPT", "--harness", "H", "--level", "0"], 2, ["--level"]),
    (["optimize", "-o", "OPT", "--harness", "H", "--prune-time-cap", "0"], 2,
     ["--prune-time-cap"]),
    (["optimize", "-o", "OPT", "--harness", "H", "--top", "1e9"], 2, ["--top"]),
    (["mcp", ".", "--port", "70000"], 2, ["--port"]),
    (["mcp", ".", "--quick-replicates", "100"], 2, ["--quick-replicates"]),
    (["demo", "--out", "D", "--time-cap", "0"], 2, ["--time-cap"]),
    (["demo", "--out", "D", "--time-cap", "1e7"], 2, ["--time-cap"]),
]


@pytest.mark.parametrize("argv,code,words", VERB_CASES, ids=lambda x: " ".join(x)
                         if isinstance(x, list) and x and isinstance(x[0], str) and
                         x[0] in {"evaluate", "verify", "release", "replay", "policy",
                                  "capture", "profile", "optimize", "mcp", "demo"} else None)
def test_verb_options_beyond_their_bounds(capsys, at, argv, code, words):
    expect(capsys, argv, code, *words)
    for made in ("CAP", "P.json", "OPT", "OPT.work", "D", "evaluations"):
        assert not (at / made).exists(), made


#: --opt-launch beyond the backend's geometry: (the override, words).
LAUNCHES = [
    ('{"grid": [100000000000000000000, 1, 1]}', ["grid x", "2147483647"]),
    ('{"grid": [1e20, 1, 1]}', ["grid", "three integers"]),
    ('{"grid": [1, 65536, 1]}', ["grid y", "65535"]),
    ('{"grid": [1, 1]}', ["grid", "three integers"]),
    ('{"block": [1024, 2, 1]}', ["2048 threads", "1024"]),
    ('{"block": [0, 1, 1]}', ["block x"]),
    ('{"block": [1, 1, 65]}', ["block z", "64"]),
    ('{"dynamic_shared_bytes": -1}', ["dynamic_shared_bytes"]),
    ('{"dynamic_shared_bytes": 1000000000}', ["dynamic_shared_bytes"]),
    ('{"threads": 5}', ["unknown key", "threads"]),
    ("[1, 2, 3]", ["JSON object"]),
    ("{grid: 1}", ["not valid JSON"]),
]


@pytest.mark.parametrize("launch,words", LAUNCHES, ids=[x for x, _ in LAUNCHES])
def test_opt_launch_beyond_the_geometry_limits(capsys, at, launch, words):
    expect(capsys, ["pair", "snap", "--opt", "fast.so", "--opt-launch", launch, "-o", "P"], 2,
           "--opt-launch", *words)
    assert not (at / "P").exists()


def test_opt_launch_within_the_limits_is_recorded(capsys, at):
    code, out, err = call(capsys, ["pair", "snap", "--opt", "fast.so", "--opt-launch",
                                   '{"grid": [2147483647, 65535, 65535], "block": '
                                   '[1024, 1, 1]}', "-o", "PL", "--json"])
    assert code == 0, err
    assert one_document(out)["opt"]["launch_override"]["grid"] == [2147483647, 65535, 65535]
    shutil.rmtree(at / "PL")


# ---------------------------------------------------------------------- 2: the exit-code table


def test_ref_kernel_is_named_as_ref(capsys, at):
    line = expect(capsys, ["pair", "snap", "--opt", "fast.so", "--ref-kernel", "nosuch",
                           "-o", "P"], 4, "ref kernel 'nosuch'")
    assert "opt kernel" not in line and not (at / "P").exists()


@pytest.mark.parametrize("argv", [["verify", "/nonexistent/rel"], ["run", "/nonexistent/h"],
                                  ["report", "/nonexistent/rel"], ["inspect", "/nonexistent"],
                                  ["replay", "/nonexistent/s"],
                                  ["policy", "suggest", "/nonexistent/h"],
                                  ["evaluate", "/nonexistent/h", "fast.so"],
                                  ["release", "add", "REL", "/nonexistent/h", "--level", "1",
                                   "--name", "x"]],
                         ids=lambda a: a[0] if a[0] != "release" else "release add")
def test_a_missing_path_is_3_in_every_verb(capsys, at, argv):
    expect(capsys, argv, 3, "/nonexistent")


def test_optimize_without_a_driver_is_4_like_capture(capsys, at):
    from kpair.capture.cudadrv import CudaDriver
    from kpair.errors import BackendUnavailable

    try:
        CudaDriver()
    except BackendUnavailable:
        pass
    else:
        pytest.skip("an NVIDIA driver is installed here")
    expect(capsys, ["optimize", "-o", "OPT", "--", "python", "-c", "pass"], 4, "driver")
    assert not (at / "OPT").exists() and not (at / "OPT.work").exists()


# ---------------------------------------------------------------------- 3: report --force


def test_report_does_not_replace_a_report_elsewhere_without_force(capsys, at):
    where = at / "RPT"
    where.mkdir(exist_ok=True)
    (where / "report.md").write_text("my own notes")
    expect(capsys, ["report", "REL", "-o", where, "--markdown-only"], 2, "report.md",
           "--force")
    assert (where / "report.md").read_text() == "my own notes"
    code, out, err = call(capsys, ["report", "REL", "-o", where, "--markdown-only", "--force"])
    assert code == 0, err
    assert "my own notes" not in (where / "report.md").read_text()
    shutil.rmtree(where)


# ---------------------------------------------------------------------- 4: interrupted


def test_a_release_holding_only_its_lock_counts_as_empty(capsys, tmp_path, monkeypatch):
    """The folder a Ctrl-C'd demo leaves (its lock, held by no one) takes the next demo."""
    import kpair.demo
    from kpair.release.store import LOCK

    out = tmp_path / "demo"
    out.mkdir()
    (out / LOCK).write_text("")
    ran = []

    def demo(where, **kw):  # stands in for the build: the CLI's refusal is under test
        ran.append(where)
        raise KeyboardInterrupt

    monkeypatch.setattr(kpair.demo, "run_demo", demo)
    code, out_, err = call(capsys, ["demo", "--out", out])
    assert ran == [out] and code == 130, err
    # Anything else there is still refused, nothing written.
    (out / "mine.txt").write_text("x")
    expect(capsys, ["demo", "--out", out], 2, "not empty")


def _hold_lock(root: Path, *, fork: bool = False) -> subprocess.Popen:
    """A process holding ``root``'s release lock (``fork``: and a child that inherited it,
    left holding it when the process is killed)."""
    code = ("import os, sys, time\n"
            "from pathlib import Path\n"
            "from kpair.release.store import locked\n"
            f"with locked(Path({str(root)!r})):\n"
            + ("    if os.fork() == 0:\n        time.sleep(60); os._exit(0)\n" if fork else "")
            + "    print('held', flush=True)\n    time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_live_lock_is_refused_naming_its_pid(tmp_path):
    from kpair.errors import UsageError
    from kpair.release.store import check_empty_release_dir, locked

    p = _hold_lock(tmp_path)
    try:
        with pytest.raises(UsageError, match=f"pid {p.pid}"), locked(tmp_path):
            pass
        with pytest.raises(UsageError, match="another kpair command"):
            check_empty_release_dir(tmp_path)
    finally:
        p.kill()
        p.wait()
    check_empty_release_dir(tmp_path)  # its holder is gone: empty again
    with locked(tmp_path):
        assert (tmp_path / ".kpair-release.lock").read_text().strip() == str(os.getpid())


def test_a_lock_kept_by_an_orphan_of_a_dead_writer_is_taken_over(tmp_path):
    from kpair.release.store import LOCK, lock_held, locked

    p = _hold_lock(tmp_path, fork=True)
    p.kill()
    p.wait()
    with open(tmp_path / LOCK) as fh, pytest.raises(BlockingIOError):
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the orphan still holds the flock
    try:
        assert not lock_held(tmp_path)  # the pid in it is dead
        with locked(tmp_path):
            assert (tmp_path / LOCK).read_text().strip() == str(os.getpid())
    finally:
        _kill_orphans_holding(tmp_path / LOCK)


def _kill_orphans_holding(path: Path) -> None:
    """End the forked children of ``_hold_lock`` (found by their open lock file)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            fds = list((proc / "fd").iterdir())
            if any(os.readlink(fd).startswith(str(path)) for fd in fds):
                os.kill(int(proc.name), signal.SIGKILL)
        except OSError:
            continue


def test_ctrl_c_during_demo_then_demo_again(tmp_path):
    """The real sequence: Ctrl-C while the demo's first `release add` holds the lock, then
    a demo into the same folder is not refused (it is built, one operator for speed)."""
    from kpair.demo import OPERATORS, run_demo
    from kpair.release.store import LOCK, check_empty_release_dir

    out = tmp_path / "demo"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    p = subprocess.Popen([sys.executable, "-m", "kpair", "demo", "--out", str(out),
                          "--time-cap", "0.3", "-q"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not (out / LOCK).exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert p.poll() is None, p.communicate()
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "Traceback" not in err
    left = sorted(x.name for x in out.iterdir())
    if left != [LOCK]:
        pytest.skip(f"interrupted after the first operator was published: {left}")
    check_empty_release_dir(out)
    result = run_demo(out, time_cap_s=0.3, operators=(OPERATORS[3],), log=lambda s: None)
    assert result.index.is_file()


# ---------------------------------------------------------------------- 5: --json on every exit


@pytest.mark.parametrize("argv,code", [
    (["nosuchverb"], 2), ([], 2), (["run"], 2), (["run", "H", "--bogus"], 2),
    (["release"], 2), (["policy", "suggest"], 2), (["run", "/nonexistent"], 3),
    (["pair", "snap", "--opt", "/nonexistent.so", "-o", "P"], 3),
], ids=["unknown verb", "no verb", "no harness", "unknown option", "no action",
        "no harness (policy)", "missing harness", "missing opt"])
def test_json_on_argparse_and_input_errors(capsys, at, argv, code):
    got, out, err = call(capsys, with_json(argv))
    assert got == code and len(err.strip().splitlines()) == 1, err
    check_error_document(one_document(out), code)


@pytest.mark.parametrize("argv,code,option", [
    (["--seed", "-5"], 2, "--seed"), (["--device", "1"], 2, "--device 1"),
    (["--time-cap", "1e9"], 2, "--time-cap"), (["--nosuch"], 2, "--nosuch")])
def test_run_harness_py_bounds_its_options_too(capsys, at, argv, code, option):
    """The harness's own run_harness.py (``harness_main``) parses with the same bounds."""
    from kpair.cli.run import harness_main

    for extra in ([], ["--json"]):
        got = harness_main(at / "H", [*argv, *extra])
        out, err = capsys.readouterr()
        assert got == code and len(err.strip().splitlines()) == 1 and option in err, err
        if extra:
            check_error_document(one_document(out), code, option)
        else:
            assert out == ""


def test_the_error_schema_is_generated_from_its_record():
    from kpair.cli.errordoc import schema_text

    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert (ROOT / "docs" / "schemas" / "cli" / "error.schema.json").read_text() == \
        schema_text()


def test_json_interrupt_is_one_document(lab):
    """SIGINT under --json: exit 130 and one document saying so (a real subprocess)."""
    env = {**os.environ, "TMPDIR": str(lab)}
    p = subprocess.Popen([sys.executable, "-m", "kpair", "run", str(lab / "H"), "-o",
                          str(lab / "int.json"), "--json", "--min-blocks", "4000",
                          "--max-blocks", "8000", "--time-cap", "60", "--replicates", "1",
                          "--no-control"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(3)
    if p.poll() is not None:
        pytest.skip(f"the run ended ({p.returncode}) before it could be interrupted")
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    check_error_document(one_document(out), 130, "interrupted")
    assert not (lab / "int.json").exists()


# ---------------------------------------------------------------------- 6: full disk


def test_pair_onto_a_full_disk_is_one_line(capsys, at, monkeypatch):
    """A copy that fails midway (ENOSPC for every file, as shutil.copytree reports it): one
    line naming the file and the reason, exit 5, nothing left."""
    def full(src, dst, *a, **kw):
        names = sorted(Path(src).rglob("*"))
        raise shutil.Error([(str(n), str(Path(dst) / n.relative_to(src)),
                             f"[Errno {errno.ENOSPC}] No space left on device: "
                             f"'{Path(dst) / n.name}'") for n in names])

    monkeypatch.setattr(shutil, "copytree", full)
    line = expect(capsys, ["pair", "snap", "--opt", "fast.so", "-o", "PF"], 5,
                  "No space left on device", "PF")
    assert len(line) < 400
    assert not (at / "PF").exists()


def test_run_onto_a_full_disk_leaves_no_samples_or_log(capsys, at, monkeypatch):
    """The result's own write fails (ENOSPC, as write_bytes_atomic reports it): one line,
    exit 5, and neither the samples file nor the worker log written before it is left."""
    from kpair.errors import WriteFailed
    from kpair.result import Result

    def full(self, path, **kw):
        raise WriteFailed(f"{path}: cannot write (No space left on device)")

    monkeypatch.setattr(Result, "write", full)
    out = at / "full.json"
    code, stdout, err = call(capsys, ["run", "H", "-o", out, *QUICK])
    assert code == 5 and "No space left on device" in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert [p.name for p in at.glob("full*")] == []


def test_run_onto_a_real_full_filesystem(tmp_path, lab):
    """The same on a 16 KiB tmpfs filled to 4 KiB free (root with mount rights only)."""
    where = tmp_path / "small"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(where)],
                             capture_output=True)
    if mounted.returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        (where / "filler").write_bytes(bytes(12 * 1024))
        proc = subprocess.run([sys.executable, "-m", "kpair", "run", str(lab / "H"), "-o",
                               str(where / "r.json"), "-q", "--json", *QUICK],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 5, proc.stderr
        assert "No space left on device" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
        check_error_document(one_document(proc.stdout), 5, "No space left on device")
        assert sorted(p.name for p in where.iterdir()) == ["filler"]
    finally:
        subprocess.run(["umount", str(where)], capture_output=True)


def test_evaluate_jsonl_launch_override_beyond_the_geometry(capsys, at, tmp_path,
                                                            monkeypatch):
    """An agent's request line is bounded as --opt-launch is: an error line, exit 2, and the
    session goes on to the next request."""
    import io

    lines = [json.dumps({"binary": "fast.so", "launch_override": {"grid": [1, 1, 70000]}}),
             json.dumps({"binary": "fast.so", "launch_override": {"block": [1, 1, 1]}})]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(lines) + "\n"))
    code, out, err = call(capsys, ["evaluate", "H", "--jsonl", "-o", tmp_path / "ev", *QUICK])
    bad, good = [json.loads(x) for x in out.splitlines()]
    assert code >= 2 and "grid z is 70000" in bad["error"] and "65535" in bad["error"]
    assert "error" not in good and good["n"] == 1
