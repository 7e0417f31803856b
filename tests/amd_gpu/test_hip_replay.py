"""On a real AMD GPU (gfx942): record a clang-built kernel, replay it byte-exact at the
captured addresses and relocated, time it, and refuse gfx90a code. Marker ``hip``; skipped
without hip-python, a visible AMD GPU or LLVM. Not run by the project (no AMD GPU here):
docs/evidence/amd.md says what it must print.
"""

from __future__ import annotations

import numpy as np
import pytest

from amd_kit import build, needs_llvm
from kpair.backends import open_device
from kpair.errors import ArchitectureMismatch, BackendUnavailable
from kpair.record import record_call
from kpair.replay import Replay
from kpair.snapshot import Launch, Snapshot

pytestmark = [pytest.mark.hip, needs_llvm]


@pytest.fixture(scope="module")
def device():
    try:
        dev = open_device("hip")
    except BackendUnavailable as e:
        pytest.skip(str(e))
    yield dev
    dev.close()


def test_record_replay_byte_exact_and_timed(device, tmp_path):
    mcpu = str(device.target)
    co = build("elementwise", tmp_path, mcpu)
    n = 1 << 16
    x = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    y = np.ones(n, dtype=np.float32)
    expected = 1.5 * x + y
    record_call(co, "axpy", [x.copy(), y, np.float32(1.5), np.int32(n)], tmp_path / "s",
                backend="hip", launch=Launch((n // 256, 1, 1), (256, 1, 1)))
    snap = Snapshot.open(tmp_path / "s")
    assert np.array_equal(np.frombuffer(snap.post(0), np.float32), expected)
    for relocate in (False, True):
        with open_device("hip") as dev:
            replay = Replay(dev, snap, relocate=relocate)
            kernel = dev.load(snap.code_object(), "axpy", fmt="hsaco")
            replay.check_abi(kernel, "ref")
            assert replay.run(kernel) == replay.expected
            assert 0 < replay.time_one(kernel) < 1.0
            print(f"relocate={relocate}: {replay.info.to_json()}")


def test_gfx90a_code_is_refused(device, tmp_path):
    co = build("elementwise", tmp_path, "gfx90a")
    with pytest.raises(ArchitectureMismatch, match="gfx90a"):
        device.load(co.read_bytes(), "axpy", fmt="hsaco")
