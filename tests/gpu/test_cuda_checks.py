"""Checks in place on a real GPU: the cuda backend's kp_diff / kp_copy kernels against what
host-side reads of the same memory say, and a checked run over three 16 MiB regions that
reads back only what its verdicts need.

    python -m pytest -q -m gpu tests/gpu/test_cuda_checks.py
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import plain_answers_left
from kpair.backends import open_device
from kpair.backends.base import byte_diff, digest64, fill_bytes

pytestmark = pytest.mark.gpu

MIB = 1 << 20
SIZES = [1, 15, 16, 17, 4096 + 37, 3 * MIB + 5, 16 * MIB]


@pytest.fixture(scope="module")
def dev(gpu_arch):
    with open_device("cuda") as d:
        yield d


@pytest.fixture(scope="module")
def span(dev):
    """A placed, relocated 40 MiB range; returns its first replay address."""
    return dev.map([(0, 40 * MIB)], relocate=True).delta


def test_check_kernels_load_and_pass_their_self_test(dev, evidence):
    env = dev.environment()
    evidence("checks[load]", {"checks_in_place": env["checks_in_place"]})
    assert dev.compares_in_place, env["checks_in_place"]
    assert env["checks_in_place"] == "kernels (kp_diff, kp_fill, kp_copy)"


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("misalign", [0, 3, 8])
def test_compare_digest_and_fill_check_agree_with_host_reads(dev, span, size, misalign):
    rng = np.random.default_rng(size + misalign)
    a = span + 4096 + misalign
    data = rng.integers(0, 256, size, np.uint8).tobytes()
    dev.write(a, data)
    held = dev.keep(a, size)
    try:
        assert dev.fetch(held) == data
        assert dev.compare(a, size, held) == (0, None)
        key = int(rng.integers(0, 2**63))
        assert dev.digest(a, size, key) == digest64(data, key)
        # Differences at the edges and in the middle.
        bad = bytearray(data)
        for at in {0, size // 2, size - 1}:
            bad[at] ^= 0x81
        dev.write(a, bytes(bad))
        assert dev.compare(a, size, held) == byte_diff(dev.read(a, size), data)
        dev.put(a, held)
        assert dev.read(a, size) == data
        # Fill checks: an exact fill, and one with its last byte changed.
        word = int(rng.integers(0, 2**32))
        dev.fill(a, size, word) if size % 4 == 0 and a % 4 == 0 else \
            dev.write(a, fill_bytes(word, size))
        assert dev.check_fills([(a, size)], word) == [(0, None)]
        dev.write(a + size - 1, bytes([fill_bytes(word, size)[-1] ^ 0xFF]))
        assert dev.check_fills([(a, size), (a, size - 1)], word) == \
            [byte_diff(dev.read(a, size), fill_bytes(word, size)), (0, None)]
    finally:
        dev.drop(held)


def test_an_overwritten_held_copy_makes_compare_unknown(dev, span):
    a = span + 20 * MIB
    data = np.random.default_rng(1).integers(0, 256, MIB, np.uint8).tobytes()
    dev.write(a, data)
    held = dev.keep(a, MIB)
    dev.write(held.ptr + 12345, b"\x00\x01")            # what a stray kernel write would do
    assert dev.compare(a, MIB, held) is None
    dev.drop(held)


def test_batched_restore_puts_back_every_region(gpu_arch):
    sizes = [16 * MIB, 16 * MIB + 4, 3]
    with open_device("cuda") as d:
        base = d.map([(0, 64 * MIB)], relocate=True).delta
        at = [base, base + 16 * MIB + 64, base + 32 * MIB + 256 + 3]
        rng = np.random.default_rng(2)
        pre = [rng.integers(0, 256, n, np.uint8).tobytes() for n in sizes]
        for a, p in zip(at, pre, strict=True):
            d.stage(a, p)
            d.write(a, bytes(len(p)))
        assert d.compares_in_place
        d.restore()
        assert [d.read(a, len(p)) for a, p in zip(at, pre, strict=True)] == pre


def test_checked_run_over_three_16mib_regions(kit, evidence):
    """z = a*x + y over 16 MiB each (the trust_overhead benchmark's case): a checked A/A run
    passes every check and runs its checks in place."""
    src = kit.root / "axpbyz.cu"
    src.write_text('extern "C" __global__ void axpbyz(const float* x, const float* y, '
                   'float* z, float a, int n) {\n  int i = blockIdx.x * blockDim.x + '
                   'threadIdx.x;\n  if (i < n) z[i] = a * x[i] + y[i];\n}\n')
    from kpair.record import record_call
    from kpair.snapshot import Launch
    from kpair.toolchain import compile_cubin

    binary = compile_cubin(src, kit.root / "axpbyz.cubin", arch=kit.arch)
    n = 4 << 20
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(n, np.float32), rng.standard_normal(n, np.float32)
    snap = kit.path("snap-axpbyz")
    record_call(binary, "axpbyz", [x, y, np.zeros(n, np.float32), np.float32(1.5),
                                   np.int32(n)], snap, backend="cuda",
                launch=Launch((n // 256, 1, 1), (256, 1, 1)), names=["x", "y", "z", "a", "n"])
    harness = kit.pair(snap, opt=binary)
    on = kit.run(harness, timeout_s=300, **kit.quick)
    off = kit.run(harness, timeout_s=300, checks=False, **kit.quick)
    evidence("checks[axpbyz_3x16M]", {"checked_wall_s": on.get("wall_s"),
                                      "unchecked_wall_s": off.get("wall_s"),
                                      "checked_stage_s": on.get("stage_s"),
                                      "unchecked_stage_s": off.get("stage_s")})
    assert on["status"] == "pass" and off["status"] == "pass", on.get("error") or on
    assert on["environment"]["checks_in_place"] == "kernels (kp_diff, kp_fill, kp_copy)"
    assert not [k for k, v in on["trust"].items() if v["passed"] is False]


def test_work_queued_right_after_a_write_sees_every_written_byte(dev, span):
    """write() lands before the next stream-ordered work: a copy made at once holds the new
    bytes in every round (a legacy-stream cuMemcpyHtoD from pageable memory may still be in
    flight when it returns; benchmarks/htod_order.py shows both)."""
    size = 32 * MIB
    for i in range(12):
        data = bytes([i + 1]) * size
        dev.write(span, data)
        held = dev.keep(span, size)
        try:
            got = np.frombuffer(dev.fetch(held), np.uint8)
        finally:
            dev.drop(held)
        assert int(np.count_nonzero(got != i + 1)) == 0, f"round {i}"


def test_no_device_buffer_of_kpair_holds_an_answer_or_a_key_in_plain(kit, evidence):
    """y = a*x + y in place, checked in this process through every stage (setup, discovery,
    ref on mutated inputs, opt, differential runs, timing windows, timed blocks on fresh
    inputs): none of kpair's cuMemAlloc buffers holds 64 bytes of ref's answers or a key in
    plain, so a kernel that found them reads noise; the held copies still give the answers
    back."""
    from kpair.policy import Policy
    from kpair.replay import Replay
    from kpair.snapshot import Launch, Snapshot
    from kpair.trust.audit import Audit

    n = 1 << 20
    rng = np.random.default_rng(7)
    x, y = rng.standard_normal(n, np.float32), rng.standard_normal(n, np.float32)
    snap = Snapshot.open(kit.record("elementwise", "axpy", [x, y, np.float32(0.5), np.int32(n)],
                                    Launch((n // 256, 1, 1), (256, 1, 1)), ["x", "y", "a", "n"]))
    with open_device("cuda") as dev:
        replay = Replay(dev, snap, relocate=True)
        audit = Audit(replay, Policy(), {"x": "float32", "y": "float32"}, seed=11)
        kernel = dev.load(snap.code_object(), "axpy")
        launch = snap.manifest.launch
        audit.baseline(kernel, launch)
        audit.discover(kernel, launch)
        audit.mutate(kernel, launch)
        assert audit.run_opt(kernel, launch).passed
        audit.differential(kernel, launch)
        audit.timing(kernel, launch, kernel, launch)
        for role in ("ref", "opt", "opt", "ref") * 2:
            audit.time_one(kernel, launch, role)
        assert not audit.failure(), audit.failure()
        assert audit.timed["windows"] == 5 and audit.timed["checked"] == 4
        found = plain_answers_left(dev, dev.read, audit, "y")
        held = replay.known.find("y", replay.expected["y"])
        evidence("checks[no-plain-answers]", {"variants": len(audit.variants),
                                             "buffers": len(dev._allocs),
                                             "scanned_bytes": sum(dev._allocs.values()),
                                             "found": found})
        assert len(audit.variants) > 2 and not found, found
        assert dev.read(held.ptr, held.size) != replay.expected["y"]
        assert dev.fetch(held) == replay.expected["y"] and dev.intact(held)
