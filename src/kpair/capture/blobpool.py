"""Content-addressed blobs shared by every snapshot of one capture directory.

Dispatches of one program share a lot: the same code object, the same weights, an input that
one kernel left unchanged for the next. Each blob is compressed and written once, into
``<capture>/blobs/``, and hard-linked into every snapshot that holds it, so each snapshot
directory stays complete on its own (the format's paths never leave it) while the disk holds
one copy. Where hard links are refused, the blob is copied. Blobs are hashed where they lie
and compressed as a stream (``kpair.snapshot.store.write_blob``): a multi-GiB region costs one
piece of host memory beyond the caller's own buffer.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..snapshot import BlobRef, SnapshotWriter
from ..snapshot.store import BLOBS, CHUNK, Compressors, _bytes_view, store_blob


class BlobPool:
    """The shared store. Counters: raw bytes offered, compressed bytes written, raw bytes
    that were already present (deduplicated)."""

    def __init__(self, root: str | os.PathLike, *, level: int = 1, chunk: int = CHUNK):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.level, self.chunk = level, chunk
        self.compressors = Compressors(level)
        self.raw_bytes = self.stored_bytes = self.deduped_bytes = 0

    def add(self, data: bytes | bytearray | memoryview) -> tuple[str, Path, int]:
        """Store ``data`` unless present; (sha256, pooled path, compressed bytes written)."""
        view = _bytes_view(data)
        blob = store_blob(self.root, view, self.compressors, chunk=self.chunk)
        self.raw_bytes += len(view)
        if not blob.written:
            self.deduped_bytes += len(view)
        self.stored_bytes += blob.written
        return blob.digest, blob.path, blob.written

    def writer(self, snapshot_dir: str | os.PathLike) -> PooledWriter:
        return PooledWriter(snapshot_dir, self)


class PooledWriter(SnapshotWriter):
    """A SnapshotWriter whose blobs come from (and go to) a BlobPool."""

    def __init__(self, root: str | os.PathLike, pool: BlobPool):
        super().__init__(root, level=pool.level, chunk=pool.chunk)
        self.pool = pool
        self.new_bytes = 0      # compressed bytes this snapshot added to the pool
        self.deduped_bytes = 0  # raw bytes this snapshot found already in the pool

    def put(self, data: bytes | bytearray | memoryview) -> BlobRef:
        view = _bytes_view(data)
        before = self.pool.deduped_bytes
        digest, pooled, written = self.pool.add(view)
        self.new_bytes += written
        self.deduped_bytes += self.pool.deduped_bytes - before
        self.bytes_raw += len(view)
        self.bytes_stored += written
        rel = f"{BLOBS}/{pooled.name}"  # <sha256>.zst, or .raw where stored raw
        target = self.root / rel
        if not target.exists():
            try:
                os.link(pooled, target)
            except OSError:
                shutil.copyfile(pooled, target)
        return BlobRef(rel, len(view), digest, "none" if pooled.suffix == ".raw" else "zstd")
