"""``digest64``, the keyed 64-bit digest a device computes where its memory is
(``Device.digest``; the cuda backend's ``kp_diff``), and what a snapshot records beside a
sha256 (key 0) so that a device can check a region without reading it back.

The sum mod 2**64 of splitmix64's finalizer over every 8-byte little-endian word ``w[i]`` xor
``key + i * golden``, the bytes zero-padded to a multiple of 16. Order-free, so a GPU computes
it in one pass over the region, and so does this module on the host, over pieces of ``CHUNK``
bytes on several threads, each word keeping its index: a region of several GiB costs a few
pieces of host memory, never a second copy of it. Not cryptographic: it tells a held copy that
something overwrote it, under a key the writer does not know, and stands for the bytes against
a replay that diverged (a chain, a kernel), not against someone choosing bytes to match it; the
sha256 beside it is the snapshot's identity of the bytes.
"""

from __future__ import annotations

import numpy as np

from .._util import threaded_map

__all__ = ["CHUNK", "digest64", "hex64"]

#: Bytes digested at a time (a multiple of 16).
CHUNK = 8 << 20
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _words(raw: np.ndarray, first: int, key: int) -> int:
    """The digest's sum over ``raw`` (uint64 words), the first of them word ``first``: in
    place over one array and one temporary (numpy releases the GIL, so pieces run on
    several threads)."""
    with np.errstate(over="ignore"):
        x = np.arange(raw.size, dtype=np.uint64)
        x *= _GOLDEN
        x += np.uint64((key + first * int(_GOLDEN)) % 2**64)
        x ^= raw
        t = np.empty_like(x)
        for shift, mul in ((30, _M1), (27, _M2)):
            np.right_shift(x, np.uint64(shift), out=t)
            x ^= t
            x *= mul
        np.right_shift(x, np.uint64(31), out=t)
        x ^= t
        return int(x.sum(dtype=np.uint64))


def digest64(data: bytes | bytearray | memoryview, key: int = 0, *, chunk: int = CHUNK) -> int:
    """The digest of ``data`` under ``key``, computed ``chunk`` bytes at a time, the pieces on
    several threads (``kpair._util.threaded_map``)."""
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
    if chunk <= 0 or chunk % 16:
        raise ValueError(f"chunk must be a positive multiple of 16, not {chunk}")

    def piece(at: int) -> int:
        part = view[at:at + chunk]
        if len(part) % 16:   # the last piece, zero-padded as the digest pads the whole
            part = bytes(part) + bytes(-len(part) % 16)
        return _words(np.frombuffer(part, np.uint64), at // 8, key)

    return sum(threaded_map(piece, range(0, len(view), chunk))) % 2**64


def hex64(value: int) -> str:
    """A 64-bit digest as the snapshot spells it: 16 lowercase hex digits."""
    return f"{value % 2**64:016x}"
