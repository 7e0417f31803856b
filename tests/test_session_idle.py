"""A session's worker waits, idle, for the next candidate as long as the agent thinks: the
hang limit counts only while a candidate is being judged, and the worker outlives the thread
that started it (an MCP tool call runs on a pool thread that ends after 10 s idle; the
worker's PR_SET_PDEATHSIG follows the forking *thread*)."""

from __future__ import annotations

import threading
import time

import kpair.isolation as isolation
from conftest import record_matmul
from kpair.harness import create_harness
from kpair.pipeline import RunOptions
from kpair.session import Session

LIMIT_S = 4.0  # the hang limit for this test: a small floor, a tiny factor


def _on_a_passing_thread(fn):
    """Run ``fn`` on a thread that ends when it returns, as an SDK pool thread does."""
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("r", fn()))
    t.start()
    t.join()
    return out["r"]


def test_an_idle_session_worker_survives_its_thread_and_the_hang_limit(
        matmul_libs, tmp_path, monkeypatch):
    monkeypatch.setattr(isolation, "HANG_FLOOR_S", LIMIT_S)
    monkeypatch.setattr(isolation, "HANG_FACTOR", 1.0)
    assert isolation.hang_limit(0.01) == LIMIT_S
    snap = record_matmul(matmul_libs["naive"], tmp_path / "snap", n=32)
    harness = create_harness(snap, tmp_path / "h", opt=matmul_libs["fast"]).root
    # No --timeout: the derived hang limit is the one in force.
    options = RunOptions(time_cap_s=0.3, min_blocks=4, max_blocks=8, seed=5)
    with Session(harness, options, out=tmp_path / "ev") as s:
        first = _on_a_passing_thread(lambda: s.evaluate(matmul_libs["fast"]))
        assert first.status == "pass", first.summary()
        time.sleep(LIMIT_S + 2.5)  # idle for longer than the hang limit
        second = _on_a_passing_thread(lambda: s.evaluate(matmul_libs["fast"]))
        assert second.status == "pass", second.summary()
        assert s.workers_started == 1  # the same worker judged both
