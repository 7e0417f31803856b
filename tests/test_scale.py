"""Beyond one device, on the host backend: the per-device pool (``--workers``), a worker
killed midway, resume, ``--each`` per-device rows, an evaluation batch over a pool, and the
same release verified as Ray tasks on a local 2-CPU cluster. Assertions are about statuses,
structure and files, never speeds: they hold on a busy 2-core machine."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from conftest import CSRC
from fake_release import fake_row
from kpair import release
from kpair.cli import main as kpair
from kpair.errors import UsageError
from kpair.harness import create_harness
from kpair.pipeline import RunOptions
from kpair.release.index import DeviceRun, with_devices
from kpair.result import Result
from kpair.scale import JOURNAL, parse_gpus, resolve_devices, run_local
from kpair.toolchain import compile_shared

QUICK = RunOptions(time_cap_s=0.3, min_blocks=8, timeout_s=120)
QUICK_ARGS = ["--time-cap", "0.3", "--min-blocks", "8", "--timeout", "120"]
OPS = {"1_fast": "fast", "2_wrong": "offbyone", "3_slower": "slower", "4_fast": "fast"}


@pytest.fixture(scope="module")
def pairs(matmul_libs, matmul_snapshot, tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("scale-pairs")
    out = {name: create_harness(matmul_snapshot, d / name, opt=matmul_libs[name]).root
           for name in ("fast", "offbyone")}
    out["slower"] = create_harness(matmul_snapshot, d / "slower", ref=matmul_libs["fast"],
                                   opt=matmul_libs["naive"]).root
    out["crash"] = create_harness(matmul_snapshot, d / "crash", opt=compile_shared(
        CSRC / "faulty.c", d / "crash.so", defines={"KP_FAULT": 1})).root
    return out


def make_release(pairs, root: Path, ops: dict[str, str] = OPS) -> Path:
    for name, which in ops.items():
        shutil.copytree(pairs[which], root / "level1" / name / "harness")
    return root


def verdicts(index) -> list[tuple]:
    return [(r.name, r.status, r.correctness.mode, r.kernels.opt) for r in index.operators]


def device_of(root: Path, name: str, rel: str = "harness/result.json") -> int:
    return Result.read(root / "level1" / name / rel).environment["device_index"]


# ------------------------------------------------------------------ pure parts


def test_gpus_option_reads_all_or_distinct_ordinals():
    assert parse_gpus("all") == "all"
    assert parse_gpus("0,1,3") == (0, 1, 3)
    for bad in ("", "0,,1", "a", "0,0", "-1"):
        with pytest.raises(UsageError):
            parse_gpus(bad)
    assert resolve_devices("host") == (0,)
    assert resolve_devices("host", workers=3) == (0, 1, 2)
    assert resolve_devices("host", "all") == (0,)
    with pytest.raises(UsageError, match="--workers"):
        resolve_devices("host", "0,1")
    with pytest.raises(UsageError, match="host backend"):
        resolve_devices("cuda", workers=2)


def test_a_verdict_that_differs_between_devices_is_an_error_row():
    def run(d, status, speedup=None):
        return DeviceRun(device_index=d, device="x", status=status,
                         reason=None if status == "pass" else f"{status} here",
                         speedup=speedup, ci95=(speedup * 0.9, speedup * 1.1) if speedup
                         else None, combined_ci95=None, result=f"r{d}")

    row = fake_row(1, "op", 2.0)
    same = with_devices(row, [run(0, "pass", 2.0), run(1, "pass", 2.1)])
    assert same.status == "pass" and len(same.per_device) == 2
    split = with_devices(row, [run(0, "pass", 2.0), run(1, "fail")])
    assert split.status == "error" and split.harness is None
    assert "pass on device 0, fail on device 1" in split.reason
    lost = with_devices(row, [run(0, "pass", 2.0), run(1, "error")])
    assert lost.status == "error" and "device 1: error here" in lost.reason


def test_device_option_is_recorded_in_result_json(pairs, tmp_path):
    from dataclasses import replace

    from kpair.isolation import run_isolated

    h = shutil.copytree(pairs["fast"], tmp_path / "h")
    assert kpair(["run", str(h), "--device", "0", *QUICK_ARGS]) == 0
    assert Result.read(h / "result.json").environment["device_index"] == 0
    # The host has one device: --device 3 is refused before the run; a pool's worker slot
    # (the library's device ordinal on the host) is recorded as given.
    assert kpair(["run", str(h), "--device", "3", *QUICK_ARGS]) == 2
    assert Result.read(h / "result.json").environment["device_index"] == 0
    assert run_isolated(h, replace(QUICK, device=3)).environment["device_index"] == 3
    # A run whose worker dies before it could say still names its device.
    c = shutil.copytree(pairs["crash"], tmp_path / "c")
    assert run_isolated(c, replace(QUICK, device=2)).environment["device_index"] == 2
    assert Result.read(c / "result.json").environment["device_index"] == 2


# ------------------------------------------------------------------ the local pool


def test_pool_of_two_slots_gives_the_serial_index(pairs, tmp_path, capsys):
    serial = release.verify_release(make_release(pairs, tmp_path / "serial"), QUICK)
    root = make_release(pairs, tmp_path / "pool")
    code = kpair(["verify", str(root), "--workers", "2", *QUICK_ARGS])
    assert code == 1  # 2_wrong fails correctness
    pooled = release.load_index(root)
    assert verdicts(pooled) == verdicts(serial)
    assert [r.status for r in pooled.operators] == ["pass", "fail", "pass", "pass"]
    assert {device_of(root, n) for n in OPS} == {0, 1}  # both slots took harnesses
    assert not (root / JOURNAL).exists()
    assert all(r.per_device is None for r in pooled.operators)  # the v1 row, unchanged
    assert "on device" in capsys.readouterr().err


def _workers_of(harness: Path) -> list[int]:
    """Pids of kpair isolated workers running ``harness`` (children of this process)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"-I" in cmd and str(harness.resolve()).encode() in cmd:
            pids.append(int(proc.name))
    return pids


def test_a_worker_killed_midway_is_an_error_row_and_the_others_finish(pairs, tmp_path):
    root = make_release(pairs, tmp_path / "rel")
    victim = root / "level1" / "3_slower" / "harness"
    # No differential runs: a worker that dies during trust:mutate is taken for ref failing
    # on a mutated input and set up again without them (isolation.start), so a kill landing
    # there, on a loaded machine, would end in a pass.
    slow = RunOptions(time_cap_s=3.0, min_blocks=8, max_blocks=100000, rel_ci=1e-9,
                      timeout_s=120, skip_checks=("differential",))
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault(
        "index", release.verify_release(root, slow, devices=(0, 1))))
    t.start()
    deadline = time.monotonic() + 120
    while not (pids := _workers_of(victim)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pids, "the victim's worker never started"
    time.sleep(0.3)  # well inside its run
    os.kill(pids[0], signal.SIGKILL)
    t.join(240)
    rows = {r.name: r for r in out["index"].operators}
    assert rows["3_slower"].status == "error" and "SIGKILL" in rows["3_slower"].reason
    assert [rows[n].status for n in ("1_fast", "2_wrong", "4_fast")] == ["pass", "fail", "pass"]


def test_an_interrupted_verify_resumes_without_redoing_finished_harnesses(pairs, tmp_path):
    root = make_release(pairs, tmp_path / "rel")

    def dies_after_two(jobs, options):
        for n, item in enumerate(run_local(jobs, options, (0,))):
            yield item
            if n == 1:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        release.verify_release(root, QUICK, runner=dies_after_two)
    assert (root / JOURNAL).is_file() and release.load_index(root) is None
    started = {n: Result.read(root / "level1" / n / "harness/result.json").started
               for n in ("1_fast", "2_wrong")}
    ran = []

    def counting(jobs, options):
        ran.extend(j.key for j in jobs)
        yield from run_local(jobs, options, (0,))

    index = release.verify_release(root, QUICK, runner=counting)
    assert ran == ["level1/3_slower", "level1/4_fast"]  # the finished two are kept
    assert [r.status for r in index.operators] == ["pass", "fail", "pass", "pass"]
    for n, when in started.items():
        assert Result.read(root / "level1" / n / "harness/result.json").started == when
    assert not (root / JOURNAL).exists()
    # A complete run leaves nothing to resume: the next verify runs everything.
    ran.clear()
    release.verify_release(root, QUICK, runner=counting)
    assert len(ran) == 4


def test_fresh_and_changed_inputs_run_again(pairs, tmp_path):
    root = make_release(pairs, tmp_path / "rel", {"1_fast": "fast", "2_fast": "fast"})
    ran = []

    def stops(jobs, options):
        ran.extend(j.key for j in jobs)
        yield from run_local(jobs[:1], options, (0,))
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        release.verify_release(root, QUICK, runner=stops)
    ran.clear()
    with pytest.raises(KeyboardInterrupt):
        release.verify_release(root, QUICK, runner=stops, fresh=True)
    assert ran == ["level1/1_fast", "level1/2_fast"]  # --fresh: all again
    # An input touched after its result: run again.
    manifest = root / "level1" / "1_fast" / "harness" / "MANIFEST.sha256"
    os.utime(manifest, None)
    ran.clear()
    release.verify_release(root, QUICK, runner=lambda jobs, o: (
        ran.extend(j.key for j in jobs) or run_local(jobs, o, (0,))))
    assert ran == ["level1/1_fast", "level1/2_fast"]


def test_each_runs_every_harness_on_every_slot_side_by_side(pairs, tmp_path):
    root = make_release(pairs, tmp_path / "rel",
                        {"1_fast": "fast", "2_wrong": "offbyone", "3_slower": "slower"})
    code = kpair(["verify", str(root), "--workers", "2", "--each", *QUICK_ARGS])
    assert code == 1
    index = release.load_index(root)
    for r in index.operators:
        assert [d.device_index for d in r.per_device] == [0, 1]
        assert {d.status for d in r.per_device} == {r.status}
        if r.status == "pass":
            assert all(d.speedup and d.ci95[0] <= d.ci95[1] for d in r.per_device)
        assert r.per_device[1].result == f"level1/{r.name}/devices/1/result.json"
        assert device_of(root, r.name, "devices/1/result.json") == 1
        assert device_of(root, r.name) == 0
    assert [r.status for r in index.operators] == ["pass", "fail", "pass"]
    again = release.Index.read(root / "index.json")  # the strict reader takes the new field
    assert again.operators[0].per_device == index.operators[0].per_device
    assert kpair(["report", str(root), "--markdown-only"]) == 0
    md = (root / "report.md").read_text()
    assert "## Per device" in md and "| device 0 | device 1 |" in md
    assert kpair(["verify", str(root), "--workers", "2", "--each", "--ray"]) == 2


def test_evaluate_over_two_slots_writes_one_attempts_file(pairs, matmul_libs, tmp_path,
                                                          capsys):
    out = tmp_path / "ev"
    cands = [matmul_libs["fast"], matmul_libs["offbyone"], matmul_libs["fast"],
             matmul_libs["naive"]]
    code = kpair(["evaluate", str(pairs["fast"]), *map(str, cands), "-o", str(out),
                  "--workers", "2", *QUICK_ARGS])
    assert code == 1
    lines = [json.loads(x) for x in (out / "attempts.jsonl").read_text().splitlines()]
    assert [a["n"] for a in lines] == [1, 2, 3, 4]
    assert {a["device"] for a in lines} <= {0, 1}
    assert sorted(a["status"] for a in lines) == ["fail", "pass", "pass", "pass"]
    for a in lines:
        r = Result.read(out / a["result"])
        assert r.status == a["status"] and a["result"].startswith(f"devices/{a['device']}/")
    assert "(device " in capsys.readouterr().out


# ------------------------------------------------------------------ Ray (local cluster)


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="the Ray tests need pip install 'kpair[ray]'")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_verifies_a_release_like_a_local_run(pairs, tmp_path, ray_cluster):
    from kpair.scale.ray import RayRunner

    local = release.verify_release(make_release(pairs, tmp_path / "local"), QUICK)
    root = make_release(pairs, tmp_path / "ray")
    index = release.verify_release(root, QUICK, runner=RayRunner())
    assert verdicts(index) == verdicts(local)
    for name in OPS:
        h = root / "level1" / name / "harness"
        r = Result.read(h / "result.json")
        assert r.harness == str(h.resolve()) and (h / "worker.log").is_file()
        assert r.environment["ray"]["gpu_ids"] == []
        assert (h / "samples.npz").is_file() == (r.status == "pass")


def test_ray_ships_a_harness_that_is_not_on_the_node(pairs, ray_cluster, tmp_path):
    from kpair.scale.ray import pack, run_task
    from kpair.snapshot import sha256

    h = pairs["fast"]
    digest = sha256((h / "MANIFEST.sha256").read_bytes())
    out = run_task(str(tmp_path / "elsewhere"), digest, [ray_cluster.put(pack(h))],
                   QUICK.to_json())
    assert out["where"]["shipped"] and Result.from_json(out["result"]).status == "pass"
    with pytest.raises(Exception, match="not shipped"):
        run_task(str(tmp_path / "elsewhere"), digest, [], QUICK.to_json())


def _ray_tasks_running() -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "cmdline").read_bytes().startswith(
                    b"ray::kpair_verify"):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def test_a_ray_task_killed_midway_is_retried_and_nothing_is_lost(pairs, tmp_path,
                                                                 ray_cluster):
    from kpair.scale.ray import RayRunner

    root = make_release(pairs, tmp_path / "rel")
    slow = RunOptions(time_cap_s=2.0, min_blocks=8, max_blocks=100000, rel_ci=1e-9,
                      timeout_s=120)
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault(
        "index", release.verify_release(root, slow, runner=RayRunner())))
    t.start()
    deadline = time.monotonic() + 120
    while not (pids := _ray_tasks_running()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pids, "no Ray task started"
    time.sleep(0.5)
    killed = None  # a Ray worker process with its harness in flight; on a busy machine the
    while killed is None and time.monotonic() < deadline:  # first may have ended meanwhile
        for pid in _ray_tasks_running():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            killed = pid
            break
        else:
            time.sleep(0.05)
    assert killed, "no Ray task left to kill"
    t.join(300)
    index = out["index"]
    assert [r.name for r in index.operators] == list(OPS)  # each once: nothing duplicated
    assert [r.status for r in index.operators] == ["pass", "fail", "pass", "pass"]
