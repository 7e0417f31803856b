"""``Device.check_many`` on a real GPU: the canary checks and compares after a timed launch in
one kp_diff batch give what ``check_fills`` and ``compare`` give alone (tests/test_trust_cost.py
runs the same on the fake driver).

    python -m pytest -q -m gpu tests/gpu/test_cuda_check_many.py
"""

from __future__ import annotations

import numpy as np
import pytest

from kpair.backends import open_device

pytestmark = pytest.mark.gpu

MIB = 1 << 20


def test_check_many_gives_each_check_s_own_answer(gpu_arch):
    with open_device("cuda") as dev:
        assert dev.compares_in_place
        lo = dev.map([(0, 48 * MIB)], relocate=True).delta
        rng = np.random.default_rng(7)
        a, b = lo + 4096 + 3, lo + 40 * MIB
        dev.write(a, rng.integers(0, 256, 32 * MIB, np.uint8).tobytes())
        dev.write(b, rng.integers(0, 256, MIB + 5, np.uint8).tobytes())
        ha, hb = dev.keep(a, 32 * MIB), dev.keep(b, MIB + 5)
        dev.write(a + 77, b"\x00\x01\x02")
        dev.write(a + 32 * MIB - 1, bytes([dev.read(a + 32 * MIB - 1, 1)[0] ^ 0x5A]))
        spans = [(lo, 4096), (a + 32 * MIB, 512)]
        dev.fill_many(spans, 0xC0FFEE11)
        dev.write(lo + 100, b"x")
        compares = [(a, 32 * MIB, ha), (b, MIB + 5, hb)]
        alone = (dev.check_fills(spans, 0xC0FFEE11),
                 [dev.compare(x, n, h) for x, n, h in compares])
        both = dev.check_many(spans, 0xC0FFEE11, compares)
        assert both == alone
        assert both[0] == [(1, 100), (0, None)]
        assert both[1][0][0] >= 2 and both[1][1] == (0, None)
        dev.write(hb.ptr + 12345, b"\x00\x01")           # a stray write into the held copy
        assert dev.check_many([], 0, compares)[1][1] is None
        dev.drop(ha)
        dev.drop(hb)
