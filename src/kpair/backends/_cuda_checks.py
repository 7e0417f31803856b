"""The cuda backend's check kernels: ``kernels/checks.cu`` and the PTX built from it.

``kp_diff`` compares two byte ranges (or one against a repeated 32-bit word) and digests one
of them in a single pass: bytes that differ, the first differing offset, and ``digest64``
(``kpair.backends.base``) under a key, for a table of such rows in one launch. ``kp_fill``
fills a table of ranges with a repeated 32-bit word (guard canaries, poison) in one launch,
and ``kp_copy`` runs a table of device-to-device copies in one launch (the batched restore).
A table is uploaded on the replay stream right before every launch that reads it (a
candidate kernel launched in between could have rewritten it), and a table that names a
key is zeroed on the stream right after it (the next kernel finds no key).

Held copies are masked. Every ``CudaHeld`` is stored xored with ``mask_bytes`` under a key
of its own, drawn at random and kept on the host: a candidate kernel that finds kpair's
buffers (cuMemAlloc addresses repeat from run to run) reads noise, not ref's answers or the
captured expected outputs, and knowing some of a copy's bytes tells it nothing of the rest.
``kp_copy`` masks as it keeps, unmasks as it puts back; ``kp_diff`` compares against the
unmasked bytes and digests the stored ones (an overwritten copy is still noticed); a fetch
unmasks in place, reads, and masks again before anything else runs on the stream.

The driver JIT-compiles the PTX for the device at load (``cuModuleLoadData``), so no compiler
is needed at run time.
``kernels/checks.ptx`` targets compute_75; its first line names the sha256 of the source it
was built from, and ``python -m kpair.backends._cuda_checks`` (needs nvcc) rebuilds it.
"""

from __future__ import annotations

import hashlib
import secrets
import struct
from collections.abc import Sequence
from importlib import resources

from ..errors import DriverError, UsageError
from ..snapshot import Param
from ._cuda_driver import ParamArray
from .base import Held, byte_diff, digest64, fill_bytes, mask_bytes

#: nvcc command that produces the PTX from the source.
NVCC = ("nvcc", "-arch=compute_75", "-ptx")
_KERNELS = resources.files("kpair.backends") / "kernels"


def source() -> str:
    return (_KERNELS / "checks.cu").read_text()


def ptx() -> str:
    return (_KERNELS / "checks.ptx").read_text()


def ptx_source_sha256() -> str:
    """The sha256 of the source the shipped PTX says it was built from."""
    return ptx().split("sha256 ", 1)[1].split(")", 1)[0]


#: Threads per block, and the most blocks, of a check kernel (it strides over the rest).
_CHECK_BLOCK, _CHECK_BLOCKS_PER_SM = 256, 8
#: Rows checked by one kp_diff launch (its table of 48-byte rows and 24-byte counters fill
#: one 4.5 KiB buffer, which a kp_copy table of up to 144 rows also uses).
_CHECK_BATCH = 64
_CHECK_BYTES = 72 * _CHECK_BATCH
_NONE = 2**64 - 1
#: Rows filled by one kp_fill launch (grid y is at most 65535).
_FILL_BATCH = 4096
#: kp_diff(rows, out), kp_fill(rows, word) and kp_copy(table) parameter layouts.
_DIFF_PARAMS = [Param(0, 8), Param(8, 8)]
_FILL_PARAMS = [Param(0, 8), Param(8, 4)]
_COPY_PARAMS = [Param(0, 8)]


class CudaHeld(Held):
    """A held copy in a ``cuMemAlloc`` buffer (``ptr``), masked under ``mask`` (never 0),
    and the digest of its stored bytes at keep time, under ``digest_key``: the process's key
    xor the mask, a key of its own (one copy's bytes and digest tell nothing of another's)."""

    def __init__(self, size: int, ptr: int, mask: int, digest_key: int, digest: int = 0):
        super().__init__(size)
        self.ptr, self.mask, self.digest_key, self.digest = ptr, mask, digest_key, digest


def _mask_key() -> int:
    return secrets.randbits(64) | 1



class DeviceChecks:
    """The device-side checks of ``CudaDevice`` (a mixin: it uses the device's driver,
    stream and allocator): held copies, compare, fill checks and digests run by the check
    kernels, each falling back to ``Device``'s read-based default when the kernels are not
    loaded."""

    @property
    def compares_in_place(self) -> bool:  # type: ignore[override]
        if self._checks is None and self._checks_status == "not loaded":
            self._load_checks()
        return self._checks is not None

    def _load_checks(self) -> None:
        """Load the check kernels and prove them on known bytes; on any failure, say why and
        leave the read-back defaults in charge."""
        from ._cuda_checks import ptx  # this module's own, also when run as __main__

        try:
            module = self.drv("cuModuleLoadData", ptx().encode() + b"\0")
            self._modules.append(module)
            self._checks = (self.drv("cuModuleGetFunction", module, b"kp_diff"),
                            self.drv("cuModuleGetFunction", module, b"kp_copy"),
                            self.drv("cuModuleGetFunction", module, b"kp_fill"))
            self._counters = self._alloc(_CHECK_BYTES)   # rows, then counters
            self._fill_rows = self._alloc(16 * _FILL_BATCH)
            problem = self._self_test()
        except DriverError as e:
            problem = f"cannot load them: {e}"
        if problem:
            self._checks = None
            self._checks_status = f"read back to the host (check kernels {problem})"
        else:
            self._checks_status = "kernels (kp_diff, kp_fill, kp_copy)"

    def _self_test(self) -> str | None:
        """Compare, fill check, digest, batched fill and batched copy on bytes whose answers
        are known."""
        import numpy as np

        rng = np.random.default_rng(secrets.randbits(64))   # nothing of the keys
        n = 4096 + 37
        a = bytearray(rng.integers(0, 256, n, np.uint8).tobytes())
        b = bytearray(a)
        for at in (5, 2048, n - 1):
            b[at] ^= 0x5A
        pa, pb = self._alloc(n + 16), self._alloc(n + 16)
        try:
            for off in (0, 3):   # aligned, then an address 3 bytes past 16-byte alignment
                self.write(pa + off, bytes(a))
                self.write(pb, bytes(b))
                mask = _mask_key()
                held = CudaHeld(n, pb, mask, self._key ^ mask)
                self._copy([(pb, pb, n, held.mask)])         # masked in place
                if self.read(pb, n) != bytes(x ^ y for x, y in zip(b, mask_bytes(held.mask, n),
                                                                   strict=True)):
                    return "failed their self-test (mask)"
                held.digest = self._diff([(pb, pb, 0, n, 0)], held.digest_key)[0][2]
                if held.digest != digest64(self.read(pb, n), self._key ^ held.mask):
                    return "failed their self-test (digest)"
                if self.compare(pa + off, n, held) != byte_diff(bytes(a), bytes(b)) or \
                        self.fetch(held) != bytes(b):
                    return "failed their self-test (compare)"
                self.write(pa + off, (0xA1B2C3D4).to_bytes(4, "little") * (n // 4))
                if self.check_fills([(pa + off, n // 4 * 4), (pa + off, n)], 0xA1B2C3D4) != \
                        [(0, None), byte_diff(bytes(self.read(pa + off, n)),
                                              ((0xA1B2C3D4).to_bytes(4, "little") * 1100)[:n])]:
                    return "failed their self-test (fill check)"
                self.write(pa + off, bytes(a))
                self.fill_many([(pa + off, n - 40), (pa + off + n - 33, 30)], 0x0BADF00D)
                want = bytearray(a)
                want[:n - 40] = fill_bytes(0x0BADF00D, n - 40)
                want[n - 33:n - 3] = fill_bytes(0x0BADF00D, 30)
                if self.read(pa + off, n) != bytes(want):
                    return "failed their self-test (batched fill)"
                self.put(pa + off, held)
                if self.read(pa + off, n) != bytes(b):
                    return "failed their self-test (unmasked copy)"
                self.write(pa + off, bytes(a))
                staged = self._staged
                self._staged, self._table_stale = [(pb + off, pa + off, n - off),
                                                   (pb, pa, 0)], True
                try:
                    self._restore_batched()
                finally:
                    self._staged, self._table_stale = staged, True
                if self.read(pb + off, n - off) != bytes(a[:n - off]):
                    return "failed their self-test (batched copy)"
        finally:
            for p in (pa, pb):   # cleared first (quietly: a failed test may have left an error)
                self.drv.quiet("cuMemsetD8Async", p, 0, n + 16, self.stream)
                self.drv.quiet("cuStreamSynchronize", self.stream)
                self._free(p)
        return None

    def _blocks(self, size: int) -> int:
        return max(1, min(-(-size // (16 * _CHECK_BLOCK)), self.sm_count * _CHECK_BLOCKS_PER_SM))

    def _run_check(self, function, blocks: int, rows: int, args: bytes,
                   layout: list[Param] = _COPY_PARAMS) -> None:
        pa = ParamArray(args, layout)
        self.drv("cuLaunchKernel", function, blocks, rows, 1, _CHECK_BLOCK, 1, 1, 0,
                 self.stream, pa.address, 0, context=" (a check kernel)")

    def _diff(self, items: Sequence[tuple[int, ...]], key: int | None = None
              ) -> list[tuple[int, int | None, int]]:
        """kp_diff over (a, b or 0, word, size, b's mask or 0[, the row's digest key]) items:
        (differing bytes, first, digest) each. Per batch of rows: one upload (the rows and
        their zeroed counters), one launch, one read of the counters, then rows and counters
        zeroed (keys, digests)."""
        out: list[tuple[int, int | None, int]] = []
        k = self._key if key is None else key % 2**64
        for at in range(0, len(items), _CHECK_BATCH):
            batch = items[at:at + _CHECK_BATCH]
            rows = b"".join(struct.pack("<QQQQQQ", it[0], it[1], it[2] & 0xFFFFFFFF, it[3],
                                        it[5] % 2**64 if len(it) > 5 else k, it[4])
                            for it in batch)
            counters = self._counters + len(rows)   # right after the rows
            self.patch(((self._counters, rows + struct.pack("<QQQ", 0, _NONE, 0) *
                         len(batch)),))
            self._run_check(self._checks[0], self._blocks(max(it[3] for it in batch)),
                            len(batch), struct.pack("<QQ", self._counters, counters),
                            _DIFF_PARAMS)
            raw = self.read(counters, 24 * len(batch))
            self.drv("cuMemsetD8Async", self._counters, 0, len(rows) + len(raw), self.stream)
            for i in range(len(batch)):
                count, first, h = struct.unpack_from("<QQQ", raw, 24 * i)
                out.append((count, first if count else None, h))
        return out

    def _copy(self, rows: Sequence[tuple[int, int, int, int]]) -> None:
        """kp_copy over (dst, src, size, mask or 0) rows, in one launch per batch; the table
        (it holds the masks) is zeroed on the stream right after."""
        for at in range(0, len(rows), 2 * _CHECK_BATCH):
            batch = rows[at:at + 2 * _CHECK_BATCH]
            table = b"".join(struct.pack("<QQQQ", *row) for row in batch)
            self.patch(((self._counters, table),))
            self._run_check(self._checks[1], self._blocks(max(n for _, _, n, _ in batch)),
                            len(batch), struct.pack("<Q", self._counters))
            self.drv("cuMemsetD8Async", self._counters, 0, len(table), self.stream)

    def _held(self, ptr: int, src: int, size: int, data: bytes | None = None) -> CudaHeld:
        """``size`` bytes at ``src`` (``data`` written there first, where given) masked into
        ``ptr`` (in place where they are the same) under a fresh key, with the digest of what
        is stored. On an error the buffer is cleared (it may hold plain bytes) and not used
        again."""
        mask = _mask_key()
        held = CudaHeld(size, ptr, mask, self._key ^ mask)
        try:
            if data is not None:   # plain only until masked: no candidate runs in between
                self.write(src, data)
            if size:
                self._copy([(ptr, src, size, held.mask)])
            held.digest = self._diff([(ptr, ptr, 0, size, 0)], held.digest_key)[0][2]
        except BaseException:
            self.drv.quiet("cuMemsetD8Async", ptr, 0, max(size, 16), self.stream)
            raise
        return held

    def fill_many(self, spans: Sequence[tuple[int, int]], word: int) -> None:
        """Every (address, size) filled with ``word`` in one kp_fill launch per batch (rows
        uploaded just before it)."""
        if len(spans) < 2 or not self.compares_in_place:
            return super().fill_many(spans, word)
        spans = [(a, n) for a, n in spans if n]
        for at in range(0, len(spans), _FILL_BATCH):
            batch = spans[at:at + _FILL_BATCH]
            self.patch(((self._fill_rows, struct.pack(f"<{2 * len(batch)}Q",
                                                      *(v for span in batch for v in span))),))
            self._run_check(self._checks[2], self._blocks(max(n for _, n in batch)),
                            len(batch), struct.pack("<QI4x", self._fill_rows,
                                                    word & 0xFFFFFFFF), _FILL_PARAMS)

    def _take(self, size: int) -> int | None:
        spare = self._spare.get(size)
        if spare:
            return spare.pop()
        try:
            return self._alloc(max(size, 16))
        except DriverError as e:
            if e.code == "CUDA_ERROR_OUT_OF_MEMORY":
                return None
            raise

    def keep(self, address: int, size: int) -> Held | None:
        if not self.compares_in_place:
            return super().keep(address, size)
        ptr = self._take(size)
        return None if ptr is None else self._held(ptr, address, size)

    def hold(self, data: bytes) -> Held | None:
        if not self.compares_in_place:
            return super().hold(data)
        ptr = self._take(len(data))
        if ptr is None:
            return None
        return self._held(ptr, ptr, len(data), data)

    def fetch(self, held: Held) -> bytes:
        if not isinstance(held, CudaHeld):
            return super().fetch(held)
        if not held.size:
            return b""
        try:
            self._copy([(held.ptr, held.ptr, held.size, held.mask)])
            return self.read(held.ptr, held.size)
        finally:
            self._copy([(held.ptr, held.ptr, held.size, held.mask)])

    def put(self, address: int, held: Held) -> None:
        if not isinstance(held, CudaHeld):
            super().put(address, held)
        elif held.size:
            self._copy([(address, held.ptr, held.size, held.mask)])

    def drop(self, held: Held) -> None:
        if isinstance(held, CudaHeld):
            self._spare.setdefault(held.size, []).append(held.ptr)

    def intact(self, held: Held) -> bool:
        if not isinstance(held, CudaHeld):
            return super().intact(held)
        return self._diff([(held.ptr, held.ptr, 0, held.size, 0)],
                          held.digest_key)[0][2] == held.digest

    def compare(self, address: int, size: int, held: Held) -> tuple[int, int | None] | None:
        if not isinstance(held, CudaHeld):
            return super().compare(address, size, held)
        if size != held.size:
            raise UsageError(f"compare of {size} bytes against a held copy of {held.size}")
        count, first, h = self._diff([(address, held.ptr, 0, size, held.mask)],
                                     held.digest_key)[0]
        return None if h != held.digest else (count, first)

    def check_fills(self, spans: Sequence[tuple[int, int]], word: int
                    ) -> list[tuple[int, int | None]]:
        if not self.compares_in_place:
            return super().check_fills(spans, word)
        return [(c, f) for c, f, _ in self._diff([(a, 0, word, n, 0) for a, n in spans])]

    def check_many(self, spans: Sequence[tuple[int, int]], word: int,
                   compares: Sequence[tuple[int, int, Held]] = ()
                   ) -> tuple[list[tuple[int, int | None]], list[tuple[int, int | None] | None]]:
        """The fill checks and the compares in one kp_diff batch (each compare's row under
        its copy's own digest key): one launch and one read of the counters for all."""
        if not self.compares_in_place or not all(isinstance(h, CudaHeld) for _, _, h in compares):
            return super().check_many(spans, word, compares)
        for _, size, held in compares:
            if size != held.size:
                raise UsageError(f"compare of {size} bytes against a held copy of {held.size}")
        found = self._diff([(a, 0, word, n, 0) for a, n in spans] +
                           [(a, h.ptr, 0, n, h.mask, h.digest_key) for a, n, h in compares])
        fills = [(c, f) for c, f, _ in found[:len(spans)]]
        return fills, [None if d != h.digest else (c, f)
                       for (c, f, d), (_, _, h) in zip(found[len(spans):], compares, strict=True)]

    def digest(self, address: int, size: int, key: int = 0) -> int:
        if not self.compares_in_place:
            return super().digest(address, size, key)
        return self._diff([(address, address, 0, size, 0)], key)[0][2]



def _regenerate() -> None:  # pragma: no cover - a maintainer's tool, needs nvcc
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        cu, out = Path(tmp) / "checks.cu", Path(tmp) / "checks.ptx"
        cu.write_text(source())
        subprocess.run([*NVCC, str(cu), "-o", str(out)], check=True)
        digest = hashlib.sha256(source().encode()).hexdigest()
        target = Path(str(_KERNELS / "checks.ptx"))
        target.write_text(f"// kpair: built from checks.cu (sha256 {digest}) by "
                          f"{' '.join(NVCC)}\n" + out.read_text())
    sys.stdout.write(f"regenerated PTX from source {digest[:12]}\n")


if __name__ == "__main__":  # pragma: no cover
    _regenerate()
