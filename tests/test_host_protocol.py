"""The host executor owns no protocol a kernel could take over.

A host launch is timed as the executor's CPU time from the judge's SIGCONT to the process's
next stop; between calls the executor only stops itself, and the judge writes the next
call into a page the executor maps read-only. Every kernel of tests/csrc/protocol_attacks.c
does exactly ref's work (the naive kp_matmul, bit-identical) and tries to take that path
over: stopping itself before or after computing, running its own stop-compute loop, forging
records on every descriptor it holds, stacking a seccomp filter that fakes success, forging
a setup failure, dropping the shared regions' pages. Each either fails by a named check or
reads no faster than ref against an identical copy of itself. No timing is asserted beyond
"no PASS with its whole interval above 1.0": these run on a busy 2-CPU machine.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import CSRC, record_matmul
from kpair.backends import _sandbox
from kpair.backends.host import HostDevice, KernelCrashed
from kpair.errors import DriverError, SymbolNotFound
from kpair.harness import create_harness
from kpair.replay import Replay
from kpair.snapshot import Snapshot
from kpair.toolchain import compile_shared

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.machine() not in ("x86_64", "aarch64"),
    reason="the host sandbox runs on Linux x86_64 and aarch64")

KPAIR = [sys.executable, "-c", "import sys; from kpair.cli import main; sys.exit(main())"]
QUICK = ["--time-cap", "1", "--min-blocks", "4", "--max-blocks", "8", "--timeout", "240"]


@pytest.fixture(scope="module")
def kit(tmp_path_factory, matmul_libs):
    d = tmp_path_factory.mktemp("protocol")
    created = d / "created-by-ifunc"
    libs = {name: compile_shared(CSRC / "protocol_attacks.c", d / f"{name}.so",
                                 defines={"KP_CTOR": ctor, "KP_FILE": f'"{created}"'},
                                 flags=("-O2",))
            for name, ctor in (("attacks", 0), ("stacker", 1), ("setup_forger", 2),
                               ("ifunc", 3))}
    snap = record_matmul(matmul_libs["naive"], tmp_path_factory.mktemp("snap") / "s", n=48)
    return {"libs": libs, "snap": snap, "naive": matmul_libs["naive"], "created": created}


def _device(kit, kernels: list[tuple[Path, str]]):
    dev = HostDevice()
    replay = Replay(dev, Snapshot.open(kit["snap"]))
    loaded = [dev.load(lib.read_bytes(), name, fmt="elf-so") for lib, name in kernels]
    return dev, replay, loaded


def _seccomp_filters(pid: int) -> str:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(line.split(":", 1)[1].strip() for line in status.splitlines()
                if line.startswith("Seccomp_filters:"))


@pytest.mark.parametrize("kernel", ["kp_stop_after", "kp_stop_before"])
def test_a_kernel_that_stops_itself_ends_its_own_launch_unfinished(kit, kernel):
    """Its stop ends the launch it was called for; the launch whose output it skipped is
    judged like any other: some run's output is not ref's."""
    dev, replay, (ref, opt) = _device(kit, [(kit["naive"], "kp_matmul"),
                                            (kit["libs"]["attacks"], kernel)])
    try:
        outs = [replay.run(opt) for _ in range(4)]
        assert any(o != replay.expected for o in outs), f"{kernel}: every run was right"
        assert replay.run(ref) == replay.expected
        assert dev.refused_calls(opt)["count"] == 0   # stopping itself is allowed
    finally:
        dev.close()


def test_a_kernel_running_its_own_stop_loop_computes_every_launch(kit):
    """kp_own_loop never returns: each SIGCONT resumes its loop (compute, stop). The judge
    sees the same thing as from the executor's loop: the work, then a stop."""
    dev, replay, (ref, opt) = _device(kit, [(kit["naive"], "kp_matmul"),
                                            (kit["libs"]["attacks"], "kp_own_loop")])
    try:
        for _ in range(3):
            assert replay.run(opt) == replay.expected
            assert replay.time_one(opt) > 0 and replay.time_one(ref) > 0
        dev.synchronize()
        assert replay.run(opt) == replay.expected
    finally:
        dev.close()


def test_forged_records_on_every_descriptor_change_nothing(kit):
    dev, replay, (opt,) = _device(kit, [(kit["libs"]["attacks"], "kp_forge")])
    try:
        for _ in range(3):
            assert replay.run(opt) == replay.expected
        seen = dev.refused_calls(opt)
        assert seen == {"count": 0, "at_load": 0, "calls": {}}, seen
    finally:
        dev.close()


def test_a_forged_setup_failure_is_the_kernels_crash_not_the_sandboxs(kit):
    """Its constructor writes setup-failure records everywhere and exits: the setup channel
    was closed before the load, so this is the code object's failure (KernelCrashed, exit
    5), never SandboxUnavailable (exit 4)."""
    dev = HostDevice()
    try:
        with pytest.raises(KernelCrashed) as e:
            dev.load(kit["libs"]["setup_forger"].read_bytes(), "kp_matmul", fmt="elf-so")
        assert not isinstance(e.value, _sandbox.SandboxUnavailable)
        assert e.value.exit_code == 5
        assert "failed while loading: it exited with status 121" in str(e.value), e.value
    finally:
        dev.close()


def test_a_symbol_missing_is_told_by_the_judge(kit):
    dev = HostDevice()
    try:
        with pytest.raises(SymbolNotFound, match="'kp_nowhere' is not exported"):
            dev.load(kit["naive"].read_bytes(), "kp_nowhere", fmt="elf-so")
    finally:
        dev.close()


def test_a_stacked_filter_is_refused_and_the_filter_count_checked(kit):
    """The final filter is in force before the constructor runs and refuses seccomp() and
    prctl(): nothing is stacked (Seccomp_filters stays 1) and every attempt is counted."""
    dev, replay, (opt,) = _device(kit, [(kit["libs"]["stacker"], "kp_matmul")])
    try:
        assert _seccomp_filters(opt.executor.pid) == str(_sandbox.FILTERS) == "1"
        assert replay.run(opt) == replay.expected
        seen = dev.refused_calls(opt)
        assert seen["calls"].get("seccomp") == 1 and seen["calls"].get("prctl") == 3, seen
        assert seen["count"] == seen["at_load"] == 4, seen
        # and no open succeeds after the load (the stacked filter would have hidden them)
    finally:
        dev.close()


def test_an_ifunc_resolver_runs_under_the_final_filter(kit):
    """An IFUNC resolver runs while the object is relocated, before any constructor: the
    final filter is already in force (no file created, no filter stacked, both counted)."""
    dev, replay, (opt,) = _device(kit, [(kit["libs"]["ifunc"], "kp_ifunc")])
    try:
        assert _seccomp_filters(opt.executor.pid) == "1"
        assert replay.run(opt) == replay.expected
        seen = dev.refused_calls(opt)
        assert seen["calls"] == {"openat": 1, "seccomp": 1} and seen["at_load"] == 2, seen
        assert not kit["created"].exists()
    finally:
        dev.close()


def test_dropping_the_shared_pages_is_refused(kit):
    dev, replay, (ref, opt) = _device(kit, [(kit["naive"], "kp_matmul"),
                                            (kit["libs"]["attacks"], "kp_madvise")])
    try:
        assert replay.run(opt) == replay.expected   # c[0] = -1 if any advice got through
        seen = dev.refused_calls(opt)
        assert seen["calls"] == {"madvise": 15} and seen["at_load"] == 0, seen
        assert replay.run(ref) == replay.expected
    finally:
        dev.close()


def test_the_executor_cannot_write_its_call_page(kit):
    """The call page is mapped from a read-only descriptor: nothing in the executor can
    make it writable (the mapping is not VM_MAYWRITE)."""
    dev, _, (k,) = _device(kit, [(kit["naive"], "kp_matmul")])
    try:
        maps = Path(f"/proc/{k.executor.pid}/maps").read_text().splitlines()
        page = [line for line in maps if "kpair-call-page" in line]
        assert len(page) == 1 and page[0].split()[1] == "r--s", page
    finally:
        dev.close()


def _kpair_run(harness: Path, cwd: Path) -> tuple[int, dict]:
    proc = subprocess.run(KPAIR + ["run", str(harness), "--json", *QUICK], cwd=cwd,
                          capture_output=True, text=True, timeout=600)
    return proc.returncode, json.loads(proc.stdout)


def _harness(kit, tmp_path: Path, lib: str, kernel: str) -> Path:
    opt = kit["naive"] if lib == "naive" else kit["libs"][lib]
    return create_harness(kit["snap"], tmp_path / kernel, opt=opt, opt_kernel=kernel).root


@pytest.fixture(scope="module")
def control(kit, tmp_path_factory) -> dict:
    """ref against an identical copy of itself, judged the same way."""
    tmp = tmp_path_factory.mktemp("control")
    code, result = _kpair_run(_harness(kit, tmp, "naive", "kp_matmul"), tmp)
    assert result["status"] == "pass" and code == 0, result.get("error") or result
    return result["speed"]


@pytest.mark.parametrize("kernel", ["kp_own_loop", "kp_forge"])
def test_kpair_run_a_protocol_taker_reads_no_faster_than_the_control(kit, tmp_path, control,
                                                                       kernel):
    """Nothing is refused and the answer is right: its speed is ref's, within what ref
    against an identical copy of itself reads (two binaries doing the same work can differ
    a little, on a busy machine more). It may pass; it may not read faster than that."""
    code, result = _kpair_run(_harness(kit, tmp_path, "attacks", kernel), tmp_path)
    assert result["status"] in ("pass", "fail") and code in (0, 1), result.get("error")
    speed = result.get("speed") or {}
    if result["status"] == "pass":
        interval = speed.get("combined_ci95") or speed["ci95"]
        offset = control.get("combined_ci95") or control["ci95"]
        assert interval[0] <= max(1.0, offset[1]), (speed, control)


@pytest.mark.parametrize("kernel", ["kp_stop_after", "kp_stop_before"])
def test_kpair_run_fails_a_kernel_that_stops_itself(kit, tmp_path, kernel):
    code, result = _kpair_run(_harness(kit, tmp_path, "attacks", kernel), tmp_path)
    assert result["status"] == "fail" and code == 1, result.get("error") or result
    assert result["correctness"]["failed_check"], result["correctness"]


@pytest.mark.parametrize(("lib", "kernel", "call"), [("stacker", "kp_matmul", "seccomp"),
                                                     ("attacks", "kp_madvise", "madvise")])
def test_kpair_run_fails_a_filter_stacker_and_a_page_dropper(kit, tmp_path, lib, kernel, call):
    code, result = _kpair_run(_harness(kit, tmp_path, lib, kernel), tmp_path)
    assert result["status"] == "fail" and code == 1, result.get("error") or result
    assert result["correctness"]["failed_check"] == "refused_calls"
    assert call in result["correctness"]["summary"], result["correctness"]["summary"]


def test_kpair_run_a_forged_setup_failure_is_the_candidates_error(kit, tmp_path):
    code, result = _kpair_run(_harness(kit, tmp_path, "setup_forger", "kp_matmul"), tmp_path)
    assert code == DriverError.exit_code == 5 and result["status"] == "error", result
    text = json.dumps(result["error"])
    assert "failed while loading" in text and "SandboxUnavailable" not in text, text
    assert os.listdir(tmp_path / "kp_matmul")   # the harness is there; nothing else changed
