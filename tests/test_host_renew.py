"""Host ``renew_memory``: a measurement replicate meets new pages and fresh executors.

A re-run in a new process re-rolls where the regions lie in physical memory and which process
runs the kernel; a replicate must meet the same. After a renewal the region bytes are the
ones before, at the same executor addresses, in a memfd none of the old executors mapped; every
loaded kernel runs in a new executor confined as its first one was, and a code object's
refused calls go on adding up. No timing is asserted: these run on a busy 2-CPU machine.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import pytest

from conftest import CSRC, record_matmul
from kpair.backends.host import HostDevice
from kpair.replay import Replay
from kpair.snapshot import Snapshot
from kpair.toolchain import compile_shared

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.machine() not in ("x86_64", "aarch64"),
    reason="the host sandbox runs on Linux x86_64 and aarch64")


@pytest.fixture(scope="module")
def kit(tmp_path_factory, matmul_libs):
    d = tmp_path_factory.mktemp("renew")
    watched = d / "watched"
    watched.write_text("untouched")
    attacks = compile_shared(CSRC / "sandbox_attacks.c", d / "attacks.so",
                             defines={"KP_PID": os.getpid(), "KP_DIR": f'"{d}"',
                                      "KP_FILE": f'"{watched}"'}, flags=("-O2", "-pthread"))
    snap = record_matmul(matmul_libs["naive"], d / "snap", n=24)
    return {"snap": snap, "naive": matmul_libs["naive"], "fast": matmul_libs["fast"],
            "attacks": attacks}


def _regions(pid: int) -> set[str]:
    """The memfd inodes an executor maps its regions from (/proc/PID/maps)."""
    with open(f"/proc/{pid}/maps") as maps:
        return {line.split()[4] for line in maps if "kpair-regions" in line}


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _open(kit, kernels):
    dev = HostDevice()
    replay = Replay(dev, Snapshot.open(kit["snap"]))
    return dev, replay, [dev.load(lib.read_bytes(), name, fmt="elf-so") for lib, name in kernels]


def test_renewal_gives_new_pages_and_executors_and_keeps_every_byte(kit):
    dev, replay, (ref, opt) = _open(kit, [(kit["naive"], "kp_matmul"),
                                          (kit["fast"], "kp_matmul")])
    try:
        assert replay.run(ref) == replay.expected
        ranges = dev.mapped_ranges()
        before = [dev.read(lo, hi - lo) for lo, hi in ranges]
        pids = {k: k.executor.pid for k in (ref, opt)}
        inodes = {k: _regions(k.executor.pid) for k in (ref, opt)}
        assert dev.renew_memory() is True
        assert dev.mapped_ranges() == ranges                    # same executor addresses
        assert [dev.read(lo, hi - lo) for lo, hi in ranges] == before   # the same bytes
        for k in (ref, opt):
            assert k.executor.pid != pids[k] and not _alive(pids[k])   # old executor gone
            assert _regions(k.executor.pid).isdisjoint(inodes[k])       # another memfd
        # Both still compute the captured answer, on the new pages, in the new processes.
        assert replay.run(ref) == replay.expected
        assert replay.run(opt) == replay.expected
        assert replay.time_one(ref) > 0 and replay.time_one(opt) > 0
    finally:
        dev.close()
    assert not any(_alive(p) for p in pids.values())


def test_a_renewed_executor_is_confined_like_the_first(kit):
    dev, _, (k,) = _open(kit, [(kit["naive"], "kp_matmul")])
    try:
        def status() -> dict:
            text = Path(f"/proc/{k.executor.pid}/status").read_text()
            fields = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
            return {f: fields[f].strip() for f in ("NoNewPrivs", "Seccomp", "CapEff", "CapPrm",
                                                     "CapBnd", "Uid", "Groups")}

        first = status()
        assert first["NoNewPrivs"] == "1" and first["Seccomp"] == "2"
        assert dev.renew_memory()
        assert status() == first
        assert Path(f"/proc/{k.executor.pid}/status").read_text().count("State:\tT") == 1
    finally:
        dev.close()


def test_refused_calls_add_up_across_a_renewal(kit):
    dev, replay, (ref, opt) = _open(kit, [(kit["naive"], "kp_matmul"),
                                          (kit["attacks"], "kp_socket")])
    try:
        assert replay.run(opt) == replay.expected
        assert dev.refused_calls(opt)["count"] == 4
        assert dev.renew_memory()
        assert replay.run(opt) == replay.expected
        assert dev.refused_calls(opt) == {"count": 8, "at_load": 0,
                                          "calls": {"socket": 6, "socketpair": 2}}
        assert dev.refused_calls(ref)["count"] == 0
    finally:
        dev.close()


def test_an_unloaded_kernel_is_not_respawned(kit):
    dev, _, (ref, opt) = _open(kit, [(kit["naive"], "kp_matmul"), (kit["fast"], "kp_matmul")])
    try:
        dev.unload(opt)
        gone = opt.executor.pid
        assert dev.renew_memory()
        assert opt.executor.pid == gone and not _alive(gone)
        assert len(dev._executors) == 1 and dev._executors[0] is ref.executor
    finally:
        dev.close()


def test_nothing_placed_nothing_renewed():
    dev = HostDevice()
    try:
        assert dev.renew_memory() is False
    finally:
        dev.close()


def test_a_measured_run_renews_between_replicates(kit, tmp_path, monkeypatch):
    """The pipeline's replicates (3 here) each after the first get a renewal that happened
    (True), and the run still passes, byte-exact, checks on."""
    from kpair.harness import create_harness
    from kpair.pipeline import Facts, RunOptions, execute

    renewed = []
    real = HostDevice.renew_memory

    def spy(self):
        pids = sorted(ex.pid for ex in self._executors)
        out = real(self)
        renewed.append((out, pids, sorted(ex.pid for ex in self._executors)))
        return out

    monkeypatch.setattr(HostDevice, "renew_memory", spy)
    h = create_harness(kit["snap"], tmp_path / "h", opt=kit["fast"])
    result, _ = execute(h.root, RunOptions(replicates=3, min_blocks=8, max_blocks=48,
                                           time_cap_s=3, rel_ci=0.5),
                        facts=Facts(harness=str(h.root), started=""))
    assert result.status == "pass", result.to_json().get("correctness")
    assert len(renewed) == 2 and all(ok for ok, _, _ in renewed)
    for _, before, after in renewed:
        assert len(after) == len(before) == 3      # ref, opt and ref's control copy
        assert not set(before) & set(after)
    assert len(result.speed.replicates) == 3
    # The run-level term follows the measured wait for a CPU (read from outside, each
    # replicate's executors), and is the interval's whole run term on the host.
    from kpair.measure import host_run_rel
    wait = result.speed.cpu_wait
    assert wait is not None and 0.0 <= wait <= 1.0
    assert result.speed.run_rel_sd_log == pytest.approx(host_run_rel(wait))
    assert result.speed.run_sd_log == pytest.approx(result.speed.run_rel_sd_log)
    # A CPU's clock is read at its lower quartiles (its TimingModel.location), the control too.
    assert result.speed.location == "low_quartile"
    assert result.speed.systematic is not None


def test_an_executors_wait_for_a_cpu_is_read_from_outside(kit):
    """/proc/PID/schedstat of an executor: time on a CPU and time runnable but waiting. An
    executor pinned to one CPU beside a busy loop pinned there too waits for it a good part
    of the time its launches take."""
    import subprocess
    import sys
    import time

    dev, replay, (ref,) = _open(kit, [(kit["naive"], "kp_matmul")])
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        cpu = sorted(os.sched_getaffinity(0))[0]
        os.sched_setaffinity(hog.pid, {cpu})
        (pid,) = [ex.pid for ex in dev._executors]
        os.sched_setaffinity(pid, {cpu})
        before = dev.sched_times()[pid]
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            replay.run(ref)
        on_cpu, waited = (a - b for a, b in zip(dev.sched_times()[pid], before, strict=True))
        assert on_cpu > 0 and waited / (on_cpu + waited) > 0.1, (on_cpu, waited)
    finally:
        hog.kill()
        hog.wait()
        dev.close()
    assert HostDevice().sched_times() is None        # nothing loaded, nothing to read


def test_a_run_takes_extra_replicates_while_they_are_cheap(kit, tmp_path, monkeypatch):
    """Past its planned replicates a run takes more, up to max_replicates, while the extra
    time stays within budget; with no budget it keeps the planned number."""
    from kpair import measure
    from kpair.harness import create_harness
    from kpair.pipeline import Facts, RunOptions, execute

    h = create_harness(kit["snap"], tmp_path / "h", opt=kit["fast"])
    options = RunOptions(replicates=3, max_replicates=5, min_blocks=8, max_blocks=48,
                         time_cap_s=3, rel_ci=0.5, control=False)
    counts = []
    for budget in (600.0, 0.0):
        monkeypatch.setattr(measure, "EXTRA_REPLICATES_S", budget)
        result, samples = execute(h.root, options, facts=Facts(harness=str(h.root), started=""))
        assert result.status == "pass", result.to_json().get("correctness")
        counts.append(len(result.speed.replicates))
        (tmp_path / "s.npz").write_bytes(samples)     # the raw samples hold every replicate
        assert measure.load_samples(tmp_path / "s.npz").replicates == counts[-1]
    assert counts == [5, 3]


def test_an_executor_gone_behind_kpairs_back_is_a_named_crash_not_a_zero_timing(kit):
    """An executor that ended and was reaped elsewhere has no CPU clock to read: the timed
    launch says the kernel's process ended, never returns 0 s."""
    import signal

    from kpair.backends.host import KernelCrashed

    dev, replay, (k,) = _open(kit, [(kit["naive"], "kp_matmul")])
    try:
        launch = Snapshot.open(kit["snap"]).manifest.launch
        assert replay.time_one(k, launch) > 0
        pid = k.executor.pid
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)   # reaped by someone else: kpair's clock id now names nothing
        with pytest.raises(KernelCrashed, match="ended"):
            k.executor.cpu()    # the clock a timed launch reads before and after
        with pytest.raises(KernelCrashed, match="ended"):
            replay.time_one(k, launch)
    finally:
        dev.close()
