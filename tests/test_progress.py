"""Progress on stderr (kpair.progress), --help that explains every option, and the hang limit
derived from ref's own time."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import CSRC
from kpair import progress
from kpair.cli import build_parser
from kpair.harness import create_harness
from kpair.toolchain import compile_shared

SRC = str(Path(__file__).resolve().parent.parent / "src")


def kpair_proc(args: list[str], *, env: dict | None = None, timeout: float = 300):
    """``python -m kpair ARGS`` in a child whose stderr is a pipe (no terminal)."""
    return subprocess.run([sys.executable, "-m", "kpair", *args], capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": SRC, **(env or {})})


@pytest.fixture(scope="module")
def harness(matmul_libs, matmul_snapshot, tmp_path_factory) -> Path:
    return create_harness(matmul_snapshot, tmp_path_factory.mktemp("progress") / "h",
                          opt=matmul_libs["fast"]).root


# ----------------------------------------------------------------- the reporter itself


def test_plain_lines_name_tasks_at_once_stages_once_and_repeat_after_silence():
    out = io.StringIO()
    lines = progress.Lines("kpair test", out, interval=1000.0)  # beats driven by hand below
    try:
        with progress.using(lines):
            with progress.task("level1/op", 2, 5):
                assert out.getvalue() == "kpair test: [2/5] level1/op\n"
                progress.stage("measure")
                t0 = time.monotonic()
                lines.beat(t0)  # a stage younger than `announce` is not named yet
                assert out.getvalue().count("\n") == 1
                progress.measuring(progress.Meter("replicate 1/4", 24, 2.0, 1.05, (1.01, 1.09),
                                                  0.02, 0.005, 6.5))
                lines.beat(t0 + 2.0)  # now it is, with the meter
                lines.beat(t0 + 2.5)  # said already, and not silent for an interval
                said = out.getvalue().splitlines()
                assert len(said) == 2
                assert said[1].startswith("kpair test: [2/5] level1/op: measure - replicate "
                                          "1/4, 24 blocks, ETA 6.5 s, 1.050x [1.010, 1.090]")
                assert "\u00b12% (target 0.5%)" in said[1]
                lines.beat(t0 + 2000)  # the heartbeat: silent for an interval, said again
                lines.beat(t0 + 4000)
                assert len(out.getvalue().splitlines()) == 4
                progress.note("[2/5] level1/op: PASS")
            assert out.getvalue().splitlines()[-1] == "[2/5] level1/op: PASS"
    finally:
        lines.close()


def test_the_heartbeat_thread_speaks_when_the_command_is_silent():
    out = io.StringIO()
    with progress.using(progress.Lines("kpair test", out, interval=0.05)):
        progress.stage("trust:timing")
        deadline = time.monotonic() + 30
        while out.getvalue().count("trust:timing") < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert out.getvalue().count("kpair test: trust:timing (") >= 3


def test_labels_cannot_drive_the_terminal():
    out = io.StringIO()
    lines = progress.Lines("kpair test", out, interval=1000.0)
    try:
        with progress.using(lines), progress.task("evil\x1b[2J\rname"):
            pass
    finally:
        lines.close()
    assert "\x1b" not in out.getvalue() and "\r" not in out.getvalue()


def test_eta_is_the_first_rule_to_stop():
    kw = dict(target=0.005, min_blocks=32, max_blocks=2000, time_cap_s=30.0)
    assert progress.eta_s(blocks=0, elapsed_s=0.0, rel_ci=None, **kw) is None
    # 100 blocks in 10 s at twice the target half-width: 400 blocks needed, 30 s more ...
    assert progress.eta_s(blocks=100, elapsed_s=10.0, rel_ci=0.01, **kw) == \
        pytest.approx(20.0)  # ... but the time cap comes first
    assert progress.eta_s(blocks=100, elapsed_s=1.0, rel_ci=0.01, **kw) == pytest.approx(3.0)
    assert progress.eta_s(blocks=1990, elapsed_s=1.0, rel_ci=0.05, **kw) == \
        pytest.approx(10 / 1990)


def test_quiet_and_the_environment_choose_the_reporter(monkeypatch):
    tty = io.StringIO()
    assert isinstance(progress.for_command("k", quiet=True, stream=tty), progress.Silent)
    monkeypatch.setenv("KPAIR_PROGRESS", "off")
    assert isinstance(progress.for_command("k", stream=tty), progress.Silent)
    monkeypatch.setenv("KPAIR_PROGRESS", "plain")
    reporter = progress.for_command("k", stream=tty)
    reporter.close()
    assert isinstance(reporter, progress.Lines)


def test_a_terminal_gets_the_live_display():
    import pty

    master, slave = pty.openpty()
    stream = os.fdopen(slave, "w")
    try:
        reporter = progress.for_command("kpair run", stream=stream)
        assert isinstance(reporter, progress.Live)
        with progress.using(reporter):
            progress.stage("measure")
            progress.measuring(progress.Meter("A/B", 16, 1.0, 1.2, (1.1, 1.3), 0.04, 0.005,
                                              4.0))
            time.sleep(0.5)  # a few redraws
        shown = b""
        os.set_blocking(master, False)
        while True:
            try:
                chunk = os.read(master, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                break
            shown += chunk
    finally:
        stream.close()
        os.close(master)
    assert b"measure - A/B, 16 blocks, ETA 4.0 s, 1.200x" in shown


# ----------------------------------------------------------------- commands


def test_run_prints_progress_lines_on_stderr_while_it_measures(harness, tmp_path):
    """Not a terminal: plain lines, the stages in order, the meter while timing, and with a
    short heartbeat several lines during a measurement that runs to its time cap."""
    proc = kpair_proc(["run", str(harness), "-o", str(tmp_path / "r.json"), "--time-cap", "3",
                       "--rel-ci", "0.00001", "--replicates", "1"],
                      env={"KPAIR_PROGRESS_INTERVAL": "0.2"})
    assert proc.returncode == 0, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.startswith("kpair run: ")]
    meters = [x for x in lines if x.startswith("kpair run: measure - A/B, ")]
    assert len(meters) >= 3, proc.stderr
    assert all(" blocks" in x and "in stage)" in x for x in meters)
    assert any("x [" in x and "(target 0.001%)" in x and "ETA" in x for x in meters), meters
    first = {name: next(i for i, x in enumerate(lines) if x.startswith(f"kpair run: {name}"))
             for name in ("measure", "control")}
    assert first["measure"] < first["control"]
    assert proc.stdout.startswith("PASS")  # the verdict alone on stdout


def test_json_stdout_stays_one_document_and_quiet_silences(harness, tmp_path):
    args = ["run", str(harness), "--time-cap", "1", "--replicates", "1", "--json"]
    loud = kpair_proc([*args, "-o", str(tmp_path / "a.json")],
                      env={"KPAIR_PROGRESS_INTERVAL": "0.2"})
    assert loud.returncode == 0, loud.stderr
    assert json.loads(loud.stdout)["status"] == "pass"
    assert "kpair run: measure" in loud.stderr
    quiet = kpair_proc([*args, "-o", str(tmp_path / "b.json"), "--quiet"],
                       env={"KPAIR_PROGRESS_INTERVAL": "0.2"})
    assert quiet.returncode == 0, quiet.stderr
    assert json.loads(quiet.stdout)["status"] == "pass"
    assert "kpair run:" not in quiet.stderr


def test_evaluate_and_verify_show_which_item_is_running(harness, matmul_libs, tmp_path):
    ev = kpair_proc(["evaluate", str(harness), str(matmul_libs["fast"]),
                     str(matmul_libs["offbyone"]), "-o", str(tmp_path / "ev"), "--time-cap",
                     "1", "--replicates", "1"], env={"KPAIR_PROGRESS_INTERVAL": "0.2"})
    assert ev.returncode == 1, ev.stderr  # the off-by-one fails
    assert "kpair evaluate: [1] " in ev.stderr and "kpair evaluate: [2] " in ev.stderr
    assert ev.stderr.index("kpair evaluate: [1] ") < ev.stderr.index("kpair evaluate: [2] ")


# ----------------------------------------------------------------- the hang limit


def test_a_hanging_opt_is_killed_after_the_limit_derived_from_ref(matmul_snapshot, tmp_path):
    lib = compile_shared(CSRC / "faulty.c", tmp_path / "hang.so", flags=("-O0",),
                         defines={"KP_FAULT": 2})
    h = create_harness(matmul_snapshot, tmp_path / "h", opt=lib)
    # No --timeout: the old default bound was 600 s; the derived one, for a millisecond ref,
    # is its floor. The child's own timeout fails the test long before 600 s.
    proc = kpair_proc(["run", str(h.root)], timeout=240)
    assert proc.returncode == 5, (proc.stdout, proc.stderr)
    assert "ERROR (Timeout)" in proc.stdout and "no sign of progress" in proc.stdout
    r = json.loads((h.root / "result.json").read_text())
    assert r["status"] == "error" and r["error"]["type"] == "Timeout"
    assert r["error"]["stage"] == "opt" and "hang limit" in r["error"]["message"]
    assert r["wall_s"] < 240
    assert "kpair run: opt (" in proc.stderr  # and the wait was not silent


def test_an_explicit_timeout_still_wins(matmul_snapshot, tmp_path):
    from conftest import run_json
    from kpair.pipeline import RunOptions

    lib = compile_shared(CSRC / "faulty.c", tmp_path / "hang.so", flags=("-O0",),
                         defines={"KP_FAULT": 2})
    h = create_harness(matmul_snapshot, tmp_path / "h", opt=lib)
    r = run_json(h.root, RunOptions(timeout_s=3.0, time_cap_s=1.0))
    assert r["error"]["type"] == "Timeout" and "(--timeout)" in r["error"]["message"]
    with pytest.raises(Exception, match="timeout must be a positive"):
        RunOptions(timeout_s=-1.0)


def test_hang_limit_follows_ref():
    from kpair.isolation import HANG_FACTOR, HANG_FLOOR_S, hang_limit

    assert hang_limit(0.001) == HANG_FLOOR_S
    assert hang_limit(10.0) == 10.0 * HANG_FACTOR


# ----------------------------------------------------------------- --help


def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("kpair",)):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def test_every_option_of_every_command_has_help_that_shows_its_default():
    missing, no_default = [], []
    for path, parser in _parsers(build_parser()):
        formatter = parser._get_formatter()
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction,
                                   argparse._SubParsersAction)):
                continue
            name = " ".join(path) + " " + (action.option_strings[0] if action.option_strings
                                           else action.dest)
            if not (action.help or "").strip():
                missing.append(name)
                continue
            text = formatter._expand_help(action)
            if action.default not in (None, False, "", [], argparse.SUPPRESS) and \
                    "default" not in text:
                no_default.append(f"{name} ({action.default!r})")
    assert not missing, f"options without help: {missing}"
    assert not no_default, f"options whose help hides the default: {no_default}"


def test_run_help_shows_the_measurement_defaults_and_the_hang_limit(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "else 32" in text and "else 2000" in text and "else 30" in text
    assert "derived from ref's own time" in text and "--quiet" in text
    with pytest.raises(SystemExit):
        build_parser().parse_args(["optimize", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "prune stage" in text and "(default: 16)" in text
