"""Reading and writing snapshot directories.

Layout::

    <snapshot>/snapshot.json          the Manifest (JSON, schema kpair.snapshot v1)
    <snapshot>/blobs/<sha256>.zst      zstd-compressed, named by the sha256 of the raw bytes

Blobs are content-addressed, so identical bytes (an unchanged input's pre- and post-state,
the same buffer seen by several dispatches written into one directory) are stored once.
``Snapshot`` verifies every blob it hands out (size and sha256 of the decompressed bytes) and
refuses paths that leave the directory. ``SnapshotWriter`` never writes into a directory that
already holds a snapshot, and writes ``snapshot.json`` last and atomically, so a directory with
a manifest is always complete.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .._util import write_text_atomic
from ..errors import SnapshotFormatError, UsageError
from .model import BlobRef, Manifest

MANIFEST = "snapshot.json"
BLOBS = "blobs"


def _zstd():
    import zstandard  # a core dependency; imported here to keep `import kpair` light

    return zstandard


def sha256(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def write_json_atomic(path: Path, obj: object) -> None:
    """Write JSON to ``path`` through a temporary file and a rename: never a half file."""
    write_text_atomic(path, json.dumps(obj, indent=1, allow_nan=False) + "\n")


# Decompressed bytes are gathered in pieces of this size, so memory follows what the blob
# really holds rather than what a (possibly hostile) manifest or frame header claims.
_CHUNK = 1 << 20
# The longest zstd frame header (magic number included): enough to read the content size.
_FRAME_HEADER_MAX = 18


def _read_bounded(path: Path, ref: BlobRef, fail) -> bytes:
    """The raw bytes of the blob file at ``path``, never more than ``ref.size`` of them.

    A blob is untrusted input: its frame header may claim any size, or none, and the manifest
    may declare a huge size to make a reader allocate it up front. Every size is checked before
    bytes are produced, and decompression stops one byte past the declared size.
    ``fail(message)`` builds the error (message starts after "blob <path> ").
    """
    zstd = _zstd()
    with open(path, "rb") as f:
        if ref.compression == "none":
            stored = os.fstat(f.fileno()).st_size
            if stored != ref.size:
                raise fail(f"holds {stored} bytes, manifest says {ref.size} "
                           "(truncated or replaced)")
            return f.read()
        header = f.read(_FRAME_HEADER_MAX)
        try:
            claimed = zstd.frame_content_size(header)
        except zstd.ZstdError as e:
            raise fail(f"is corrupt or truncated ({e})") from None
        if claimed != -1 and claimed != ref.size:  # -1: the frame does not say
            raise fail(f"holds {claimed} bytes by its zstd frame header, manifest says "
                       f"{ref.size} (truncated or replaced)")
        f.seek(0)
        out = bytearray()
        try:
            with zstd.ZstdDecompressor().stream_reader(f, closefd=False) as reader:
                while len(out) <= ref.size:
                    piece = reader.read(min(_CHUNK, ref.size + 1 - len(out)))
                    if not piece:
                        break
                    out += piece
        except zstd.ZstdError as e:
            raise fail(f"is corrupt or truncated ({e})") from None
        if len(out) > ref.size:
            raise fail(f"decompresses to more than the {ref.size} bytes the manifest declares "
                       "(refused before reading further)")
        if len(out) < ref.size:
            raise fail(f"holds {len(out)} bytes, manifest says {ref.size} "
                       "(truncated or replaced)")
        return bytes(out)


class SnapshotWriter:
    """Collects blobs into ``root/blobs`` and finally writes ``root/snapshot.json``."""

    def __init__(self, root: str | os.PathLike, *, level: int = 3):
        self.root = Path(root)
        if (self.root / MANIFEST).exists():
            raise UsageError(f"{self.root} already holds a snapshot; choose another directory")
        if self.root.exists() and any(p.name != BLOBS for p in self.root.iterdir()):
            raise UsageError(f"{self.root} exists and is not empty; refusing to write into it")
        (self.root / BLOBS).mkdir(parents=True, exist_ok=True)
        self._cctx = _zstd().ZstdCompressor(level=level)
        self.bytes_raw = 0
        self.bytes_stored = 0

    def put(self, data: bytes | bytearray | memoryview) -> BlobRef:
        data = bytes(data)
        digest = sha256(data)
        rel = f"{BLOBS}/{digest}.zst"
        path = self.root / rel
        self.bytes_raw += len(data)
        if not path.exists():
            packed = self._cctx.compress(data)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(packed)
            os.replace(tmp, path)
            self.bytes_stored += len(packed)
        return BlobRef(rel, len(data), digest)

    def finish(self, manifest: Manifest) -> Snapshot:
        write_json_atomic(self.root / MANIFEST, manifest.to_json())
        return Snapshot.open(self.root)


class Snapshot:
    """A snapshot directory opened for reading. Every blob read is verified."""

    def __init__(self, root: Path, manifest: Manifest):
        self.root = root
        self.manifest = manifest

    @classmethod
    def open(cls, root: str | os.PathLike) -> Snapshot:
        root = Path(root)
        path = root / MANIFEST
        if not path.is_file():
            raise SnapshotFormatError(f"no {MANIFEST} here: not a kpair snapshot", path=root)
        try:
            obj = json.loads(path.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SnapshotFormatError(f"not valid JSON ({e})", path=path) from None
        return cls(root, Manifest.from_json(obj, path=path))

    def _blob_path(self, ref: BlobRef, field: str) -> Path:
        base = self.root.resolve()
        path = (self.root / ref.path).resolve()
        if base != path and base not in path.parents:
            raise SnapshotFormatError(f"blob path {ref.path!r} leaves the snapshot directory",
                                      path=self.root / MANIFEST, field=field)
        if not path.is_file():
            raise SnapshotFormatError(f"blob {ref.path} is missing", path=self.root / MANIFEST,
                                      field=field)
        return path

    def read_blob(self, ref: BlobRef, field: str = "blob") -> bytes:
        """The verified raw bytes of ``ref``; ``field`` names it in errors."""
        path = self._blob_path(ref, field)
        data = _read_bounded(path, ref, lambda message: SnapshotFormatError(
            f"blob {ref.path} {message}", path=self.root / MANIFEST, field=field))
        if sha256(data) != ref.sha256:
            raise SnapshotFormatError(f"blob {ref.path} does not match its sha256",
                                      path=self.root / MANIFEST, field=field)
        return data

    # Convenience accessors, each naming its field for errors.
    def code_object(self) -> bytes:
        return self.read_blob(self.manifest.code.blob, "code_object.blob")

    def kernarg(self) -> bytes:
        return self.read_blob(self.manifest.kernarg.blob, "kernarg.blob")

    def pre(self, index: int) -> bytes:
        return self.read_blob(self.manifest.regions[index].pre, f"regions[{index}].pre")

    def post(self, index: int) -> bytes:
        return self.read_blob(self.manifest.regions[index].post, f"regions[{index}].post")

    def verify(self) -> int:
        """Read and check every blob; return the number of raw bytes verified."""
        total = len(self.code_object()) + len(self.kernarg())
        for i in range(len(self.manifest.regions)):
            total += len(self.pre(i)) + len(self.post(i))
        return total

    def stored_bytes(self) -> int:
        return sum(p.stat().st_size for p in (self.root / BLOBS).glob("*.zst"))
