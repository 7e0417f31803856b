"""The host sandbox: a candidate shares nothing with the judge.

Every kernel of tests/csrc/sandbox_attacks.c tries an escape (the judge's memory, tracing,
limits and signals, processes, mounts, xattrs, IPC objects, files, sockets, kernel state,
root, patching ref) and answers wrong if any attempt got through; otherwise it computes what
ref does. So each test asserts the escape failed (the answer is right) and that nothing was
left behind: no process, no SysV or POSIX IPC object, no file, no mount. No timing is
asserted: these run on a busy 2-CPU machine.
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
from kpair.backends.host import HostDevice
from kpair.harness import create_harness
from kpair.replay import Replay
from kpair.snapshot import Snapshot
from kpair.toolchain import compile_shared

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.machine() not in ("x86_64", "aarch64"),
    reason="the host sandbox runs on Linux x86_64 and aarch64")

KPAIR = [sys.executable, "-c", "import sys; from kpair.cli import main; sys.exit(main())"]
QUICK = ["--time-cap", "1", "--min-blocks", "4", "--max-blocks", "8", "--timeout", "240"]
ATTACKS = ["parent_mem", "ptrace", "prlimit", "kill", "processes", "mount", "xattr", "ipc",
           "files", "socket", "kernel_state", "setuid", "patch_ref", "spin_thread",
           "hide_refusals"]
#: System calls the sandbox must report refusing, per attack (at least these; patch_ref and
#: spin_thread make none it refuses: mprotect of its own pages and a thread are allowed).
REFUSED = {"parent_mem": {"openat"}, "ptrace": {"ptrace", "process_vm_readv"},
           "prlimit": {"prlimit64"}, "kill": {"kill", "tgkill", "tkill"},
           "processes": {"clone", "execve"}, "mount": {"mount", "umount2", "fsopen"},
           "xattr": {"setxattr", "fsetxattr"}, "ipc": {"shmget", "memfd_create"},
           "files": {"openat", "mkdir", "unlink", "rename", "chmod", "truncate"},
           "socket": {"socket", "socketpair"}, "kernel_state": {"reboot", "bpf", "unshare"},
           "setuid": {"setuid", "capset"}, "patch_ref": set(), "spin_thread": set(),
           "hide_refusals": {"rt_sigaction", "openat"}}


def _descendants() -> set[int]:
    """Every process below this one (workers, executors): other runs on the machine aside."""
    parent = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                stat = (p / "stat").read_text()
            except OSError:
                continue
            parent[int(p.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
    out, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, pp in parent.items() if pp in frontier} - out
        out |= frontier
    return out


def _listing(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _state(*dirs: Path) -> dict:
    """Everything an escape could leave behind, as far as this process can see it."""
    sysv = {}
    for kind in ("shm", "msg", "sem"):
        try:
            sysv[kind] = Path(f"/proc/sysvipc/{kind}").read_text()
        except OSError:
            sysv[kind] = None
    return {"mounts": Path("/proc/self/mountinfo").read_text(), "sysv": sysv,
            "mqueue": _listing("/dev/mqueue"), "shm": _listing("/dev/shm"),
            "dirs": {str(d): _listing(str(d)) for d in dirs}, "cwd": _listing(".")}


@pytest.fixture(scope="module")
def kit(tmp_path_factory, matmul_libs):
    d = tmp_path_factory.mktemp("sandbox")
    watched = d / "watched"
    watched.write_text("untouched")
    defines = {"KP_PID": os.getpid(), "KP_DIR": f'"{d}"', "KP_FILE": f'"{watched}"'}
    libs = {"attacks": compile_shared(CSRC / "sandbox_attacks.c", d / "attacks.so",
                                      defines=defines, flags=("-O2", "-pthread")),
            "ctor": compile_shared(CSRC / "sandbox_attacks.c", d / "ctor.so",
                                   defines={**defines, "KP_CTOR": 1}, flags=("-O2", "-pthread")),
            "killer": compile_shared(CSRC / "sandbox_attacks.c", d / "killer.so",
                                     defines={**defines, "KP_CTOR": 2},
                                     flags=("-O2", "-pthread"))}
    snap = record_matmul(matmul_libs["naive"], tmp_path_factory.mktemp("snap") / "s", n=24)
    return {"dir": d, "watched": watched, "libs": libs, "snap": snap,
            "naive": matmul_libs["naive"]}


@pytest.fixture
def nothing_left(kit):
    """The state before the test, compared after it: nothing outlives a run."""
    before, children = _state(kit["dir"]), _descendants()
    yield
    assert _state(kit["dir"]) == before
    assert _descendants() <= children
    assert kit["watched"].read_text() == "untouched"


def _replay(kit, kernels: list[tuple[Path, str]]):
    dev = HostDevice()
    replay = Replay(dev, Snapshot.open(kit["snap"]))
    loaded = [dev.load(lib.read_bytes(), name, fmt="elf-so") for lib, name in kernels]
    return dev, replay, loaded


@pytest.mark.parametrize("attack", ATTACKS)
def test_every_escape_fails_and_leaves_nothing(kit, nothing_left, attack):
    dev, replay, (ref, opt) = _replay(kit, [(kit["naive"], "kp_matmul"),
                                            (kit["libs"]["attacks"], f"kp_{attack}")])
    try:
        assert replay.run(ref) == replay.expected
        for _ in range(2):
            assert replay.run(opt) == replay.expected, f"{attack}: an escape got through"
            dev.synchronize()
        assert replay.run(ref) == replay.expected   # ref unaffected (patch_ref, spin)
        # Every refusal was reported to the judge, named, none of them at load time.
        seen = dev.refused_calls(opt)
        assert REFUSED[attack] <= set(seen["calls"]), seen
        assert (seen["count"] > 0) == bool(REFUSED[attack]) and seen["at_load"] == 0, seen
        assert seen["count"] == sum(seen["calls"].values())
        assert dev.refused_calls(ref) == {"count": 0, "at_load": 0, "calls": {}}
    finally:
        dev.close()


def test_refusals_add_up_over_every_load_of_a_code_object(kit, nothing_left):
    """A replicate reloads opt: its tally goes on; another code object keeps its own."""
    image = kit["libs"]["attacks"].read_bytes()
    dev, replay, (first,) = _replay(kit, [(kit["libs"]["attacks"], "kp_socket")])
    try:
        replay.run(first)
        assert dev.refused_calls(first)["count"] == 4
        dev.unload(first)
        again = dev.load(image, "kp_socket", fmt="elf-so")
        replay.run(again)
        assert dev.refused_calls(again) == {"count": 8, "at_load": 0,
                                            "calls": {"socket": 6, "socketpair": 2}}
        other = dev.load(image, "kp_files", fmt="elf-so")
        assert dev.refused_calls(other)["count"] == 0   # loaded, not yet run
    finally:
        dev.close()


def test_a_constructor_attacks_sandboxed_too(kit, nothing_left):
    dev, replay, (opt,) = _replay(kit, [(kit["libs"]["ctor"], "kp_matmul")])
    try:
        assert replay.run(opt) == replay.expected, "the constructor got out"
        seen = dev.refused_calls(opt)   # the constructor's refusals, counted at load
        assert seen["count"] == seen["at_load"] > 10, seen
        assert {"openat", "socket", "clone", "kill", "mount"} <= set(seen["calls"]), seen
    finally:
        dev.close()


def test_the_executor_is_confined(kit, nothing_left):
    dev, _, (k,) = _replay(kit, [(kit["naive"], "kp_matmul")])
    try:
        status = Path(f"/proc/{k.executor.pid}/status").read_text()
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        assert fields["NoNewPrivs"].strip() == "1" and fields["Seccomp"].strip() == "2"
        assert fields["Seccomp_filters"].strip() == "1"   # one filter, from before the load
        assert int(fields["CapEff"], 16) == int(fields["CapPrm"], 16) == 0
        assert int(fields["CapBnd"], 16) == 0 or os.geteuid() != 0
        if os.geteuid() == 0:
            assert fields["Uid"].split() == ["65534"] * 4 and fields["Groups"].strip() == ""
        # its log and its report pipe: no command channel, no setup socket, no code object
        assert sorted(os.listdir(f"/proc/{k.executor.pid}/fd")) == ["1", "2", "3"] \
            or os.geteuid() != 0   # as root the judge may list them; nobody holds only these
        assert fields["State"].startswith("T")   # stopped between launches
        seal = dev.seal()
        assert seal["mechanism"].startswith("seccomp allowlist") and seal["no_new_privs"]
        assert seal["rlimits"]["core"] == 0 and seal["filter_instructions"] > 10
    finally:
        dev.close()


def test_a_spinning_thread_only_runs_in_its_own_launches(kit, nothing_left):
    dev, replay, (ref, opt) = _replay(kit, [(kit["naive"], "kp_matmul"),
                                            (kit["libs"]["attacks"], "kp_spin_thread")])
    try:
        assert replay.run(opt) == replay.expected
        pid = opt.executor.pid
        assert len(os.listdir(f"/proc/{pid}/task")) == 2      # the spinner is still there
        for _ in range(3):
            replay.time_one(ref)
            states = {Path(f"/proc/{pid}/task/{t}/stat").read_text().rsplit(")", 1)[1].split()[0]
                      for t in os.listdir(f"/proc/{pid}/task")}
            assert states == {"t"} or states == {"T"}, states   # stopped while ref runs
        dev.synchronize()   # its own time: the spin ends (bounded), then it is stopped again
    finally:
        dev.close()


def test_a_crash_names_the_signal(kit, nothing_left, tmp_path):
    from kpair.errors import DriverError

    lib = compile_shared(CSRC / "faulty.c", tmp_path / "faulty.so", flags=("-O0",),
                         defines={"KP_FAULT": 1})
    dev, replay, (opt,) = _replay(kit, [(lib, "kp_matmul")])
    try:
        with pytest.raises(DriverError, match="the host kernel crashed: SIGSEGV"):
            replay.run(opt)
    finally:
        dev.close()


def test_a_refused_call_with_sigsys_blocked_is_a_named_crash(kit, nothing_left):
    """system() blocks every signal before it asks for a process: the refusal cannot become
    EPERM, the executor dies of SIGSYS, and the judge says why and counts it."""
    from kpair.errors import DriverError

    dev, replay, (opt,) = _replay(kit, [(kit["libs"]["attacks"], "kp_spawn")])
    try:
        with pytest.raises(DriverError, match="crashed: SIGSYS: it made a system call the "
                                              "sandbox refuses while SIGSYS was blocked"):
            replay.run(opt)
        seen = dev.refused_calls(opt)
        assert seen["calls"].get("(unnamed: made with SIGSYS blocked)") == 1, seen
    finally:
        dev.close()
    assert not (kit["dir"] / "spawned").exists()


def _kpair_run(harness: Path, cwd: Path) -> tuple[int, dict]:
    proc = subprocess.run(KPAIR + ["run", str(harness), "--json", *QUICK], cwd=cwd,
                          capture_output=True, text=True, timeout=600)
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.parametrize(("lib", "kernel", "calls"), [
    ("ctor", "kp_matmul", "openat"), ("killer", "kp_kill", "kill"),
    ("attacks", "kp_prlimit", "prlimit64"), ("attacks", "kp_patch_ref", None),
    ("attacks", "kp_parent_mem", "(openat ×"), ("attacks", "kp_files", "openat"),
    ("attacks", "kp_hide_refusals", "rt_sigaction")])
def test_kpair_run_fails_an_attacker_by_its_refused_calls(kit, nothing_left, tmp_path, lib,
                                                           kernel, calls):
    """End to end: the worker, its executors, the signed channel. Every escape fails; an
    attacker whose attempts the sandbox refused fails ``refused_calls``, which names them in
    the verdict line, though its answer is right; one that made no refused call (patch_ref:
    mprotect of its own code) is judged on its answer. kpair ends with its own JSON."""
    h = create_harness(kit["snap"], tmp_path / "h", opt=kit["libs"][lib], opt_kernel=kernel)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    code, result = _kpair_run(h.root, cwd)
    assert result["sandbox"]["mechanism"] == "seccomp allowlist (libseccomp) + separate process"
    assert _listing(str(cwd)) == []
    found = result["trust"]["refused_calls"]
    if calls is None:
        assert result["status"] == "pass" and code == 0, result.get("error") or result
        assert found["passed"] is True and found["finding"]["opt"]["count"] == 0
        return
    assert result["status"] == "fail" and code == 1, result.get("error") or result
    assert result["correctness"]["failed_check"] == "refused_calls"
    summary = result["correctness"]["summary"]
    assert summary.startswith("FAIL [refused_calls]: opt made ") and calls in summary, summary
    assert "the host sandbox refused" in summary and "FAIL: FAIL" not in summary
    assert found["passed"] is False and found["finding"]["ref"]["count"] == 0
    # ref and its control copy made none; they were judged like any run of a checked pass
    assert result["trust"]["baseline_determinism"]["passed"] is True


def test_an_unchecked_run_warns_of_refused_calls(kit, nothing_left, tmp_path):
    h = create_harness(kit["snap"], tmp_path / "h", opt=kit["libs"]["attacks"],
                       opt_kernel="kp_socket")
    proc = subprocess.run(KPAIR + ["run", str(h.root), "--json", "--no-checks", *QUICK],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    result = json.loads(proc.stdout)
    assert result["status"] == "pass" and proc.returncode == 0, result
    # 4 refused calls a launch, every launch counted (timed ones too)
    assert any(w.startswith("refused_calls: opt made ") and "the host sandbox refused (socket ×"
               in w and w.endswith("not judged: the checks are off")
               for w in result["warnings"] or ()), result


def test_kpair_run_with_a_spinning_thread_completes(kit, nothing_left, tmp_path):
    h = create_harness(kit["snap"], tmp_path / "h", opt=kit["libs"]["attacks"],
                       opt_kernel="kp_spin_thread")
    code, result = _kpair_run(h.root, tmp_path)
    # Its thread's time is its own: charged to opt (or flagged by the timing check), never
    # to ref; the run ends with a verdict, not an error.
    assert result["status"] in ("pass", "fail") and code in (0, 1), result
    summary = result["correctness"]["summary"]
    assert result["status"] == "pass" or "timing_integrity" in summary, summary


def test_the_refused_calls_check_judges_only_what_ref_does_not_do():
    from kpair.trust.findings import refused_calls

    none = {"count": 0, "at_load": 0, "calls": {}}
    assert refused_calls(none, None).ran is False          # a GPU: nothing to tell
    assert refused_calls(none, none).passed is True
    bad = refused_calls(none, {"count": 3, "at_load": 1, "calls": {"openat": 2, "socket": 1}})
    assert bad.failed and bad.reason.startswith(
        "opt made 3 system calls the host sandbox refused (openat ×2, socket; 1 while "
        "loading): "), bad.reason
    assert bad.finding["not_excused"] == {"openat": 2, "socket": 1}
    # ref's own library call (sysconf reading /sys) is not held against opt: a warning
    same = refused_calls({"count": 4, "at_load": 0, "calls": {"openat": 4}},
                         {"count": 1, "at_load": 0, "calls": {"openat": 1}})
    assert same.passed is None and "all of kinds ref makes too" in same.reason
    mixed = refused_calls({"count": 4, "at_load": 0, "calls": {"openat": 4}},
                          {"count": 2, "at_load": 0, "calls": {"openat": 1, "write": 1}})
    assert mixed.failed and mixed.finding["not_excused"] == {"write": 1}
