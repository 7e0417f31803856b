"""Reading and writing snapshot directories.

Layout::

    <snapshot>/snapshot.json          the Manifest (JSON, schema kpair.snapshot v1)
    <snapshot>/blobs/<sha256>.zst      zstd-compressed, named by the sha256 of the raw bytes
    <snapshot>/blobs/<sha256>.raw      the raw bytes themselves (zstd would save under 10%)

Blobs are content-addressed, so identical bytes (an unchanged input's pre- and post-state,
the same buffer seen by several dispatches written into one directory) are stored once.
``Snapshot`` verifies every blob it hands out (size and sha256 of the raw bytes) and
refuses paths that leave the directory. ``SnapshotWriter`` never writes into a directory that
already holds a snapshot, and writes ``snapshot.json`` last and atomically, so a directory with
a manifest is always complete.

Regions run to several GiB, so no path holds a region in host memory twice, and the work
runs at what the disk and the CPUs allow. ``store_blob`` first compresses a few 64 KiB
samples of the caller's buffer at zstd's fastest level: data they show to be incompressible
(random bits, most float tensors) is written raw; the rest is compressed as a stream of
``CHUNK``-sized pieces (on every CPU from ``THREADED_BYTES`` on). The sha256 is computed on
its own thread while the blob is written into a temporary file, which is renamed to the
digest's name (or dropped once the digest shows the blob already stored). ``read_blob``
decompresses a blob whose frame records its size in one call into the one ``bytes`` object it
returns (the compressed file is memory-mapped, not read into memory); ``read_into`` reads or
decompresses straight into a buffer the caller owns (a pinned staging buffer, say), a piece at
a time, hashing each piece on another thread while the next is read; ``stream_blob`` does
the same through two staging buffers the caller owns (pinned memory for copies to a device),
handing each piece on; ``verify`` checks every distinct blob through two piece-sized buffers
and keeps none of it. Blobs from
``PROGRESS_BYTES`` on say how far they are on the progress line.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import threading
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from .. import progress
from .._util import human_bytes, threaded_map, write_text_atomic
from ..errors import SnapshotFormatError, UsageError
from .digest import digest64, hex64
from .model import BlobRef, CodeObject, Kernarg, Launch, Manifest, Op, Param, Regen, StateDigest

MANIFEST = "snapshot.json"
BLOBS = "blobs"


def _zstd():
    import zstandard  # a core dependency; imported here to keep `import kpair` light

    return zstandard


def sha256(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def _identity(ref: BlobRef) -> tuple:
    """What makes two blob references the same stored bytes."""
    return ref.path, ref.size, ref.sha256, ref.compression


def write_json_atomic(path: Path, obj: object) -> None:
    """Write JSON to ``path`` through a temporary file and a rename: never a half file."""
    write_text_atomic(path, json.dumps(obj, indent=1, allow_nan=False) + "\n")


#: Raw bytes per piece when a blob is compressed, checked or read into a caller's buffer as a
#: stream: what a large blob costs in host memory beyond the region's own bytes.
CHUNK = 8 << 20
#: From this many raw bytes a blob is compressed by zstd's worker threads on every CPU
#: (still one frame; blobs are named by the raw bytes' sha256, so the output may differ).
THREADED_BYTES = 64 << 20
#: From this many raw bytes, storing, loading and checking a blob show how far they are.
PROGRESS_BYTES = 256 << 20
# A zstd block decodes to at most 128 KiB and is stored in at least 4 bytes (an RLE block: a
# 3-byte header and the byte), so no stream holds more raw bytes than this per stored byte.
_MAX_RATIO = (128 << 10) // 4
# Decompressed bytes of a blob whose frame does not record its size are gathered in pieces of
# this size, so memory follows what the blob really holds, not what a (possibly hostile)
# manifest claims.
_PIECE = 1 << 20
# The longest zstd frame header (magic number included): enough to read the content size.
_FRAME_HEADER_MAX = 18


class _Shown:
    """How far one large blob is, said on the progress line about every 5% (a blob below
    ``PROGRESS_BYTES`` says nothing)."""

    def __init__(self, what: str, total: int):
        self.what, self.total = what, total
        self.next = 0 if total >= PROGRESS_BYTES else None

    def at(self, done: int) -> None:
        if self.next is None or done < self.next:
            return
        progress.stage(f"{self.what}: {human_bytes(min(done, self.total))} of "
                       f"{human_bytes(self.total)}")
        self.next = done + max(self.total // 20, CHUNK)


def _bytes_view(data: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(data)
    if not view.c_contiguous:
        raise ValueError("a blob must be one contiguous buffer")
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


#: A blob whose samples zstd compresses to more than this fraction of their size is stored
#: raw: saving under a tenth of the bytes is not worth compressing at a few hundred MB/s.
RAW_RATIO = 0.9
#: Samples of this many bytes, ``SAMPLES`` of them spread over the blob, decide a large
#: blob's compression; a blob below ``SAMPLES * SAMPLE`` bytes is compressed whole to decide.
SAMPLE = 64 << 10
SAMPLES = 8
# The zstd level the samples are compressed at (capture writes at 1 too): fast, ~1 GB/s a CPU.
_SAMPLE_LEVEL = 1


class Compressors:
    """A zstd compressor for small blobs, one on every CPU for large ones and a fast one for
    samples, each made on first use. Compressors are not shared between threads: one set per
    writer."""

    def __init__(self, level: int):
        self.level = level
        self._made: dict[tuple[int, int], object] = {}

    def _get(self, level: int, threads: int):
        if (level, threads) not in self._made:
            self._made[level, threads] = _zstd().ZstdCompressor(level=level, threads=threads)
        return self._made[level, threads]

    def for_size(self, size: int):
        return self._get(self.level, -1 if size >= THREADED_BYTES else 0)

    def choose(self, data: bytes | bytearray | memoryview) -> str:
        """``"zstd"`` or ``"none"`` for ``data``: ``"none"`` where its samples (spread over
        it, first and last bytes included) compress to more than ``RAW_RATIO`` of their size
        at zstd level 1. Costs one ``SAMPLES * SAMPLE`` compression whatever the size."""
        view = _bytes_view(data)
        n = len(view)
        if n == 0:
            return "zstd"
        cctx = self._get(_SAMPLE_LEVEL, 0)
        if n <= SAMPLES * SAMPLE:
            starts = [0]
            width = n
        else:
            width = SAMPLE
            starts = [(n - width) * k // (SAMPLES - 1) for k in range(SAMPLES)]
        packed = sum(len(cctx.compress(view[a:a + width])) for a in starts)
        return "none" if packed > RAW_RATIO * width * len(starts) else "zstd"


def blob_name(digest: str, compression: str) -> str:
    """The file name of a blob in ``blobs/``: its raw bytes' sha256 and what it is stored as."""
    return f"{digest}.zst" if compression == "zstd" else f"{digest}.raw"


def find_blob(directory: Path, digest: str) -> tuple[Path, str] | None:
    """The blob of ``digest`` already in ``directory`` (path, compression), if any."""
    for compression in ("zstd", "none"):
        path = directory / blob_name(digest, compression)
        if path.exists():
            return path, compression
    return None


class StoredBlob(NamedTuple):
    """What ``store_blob`` did: the blob's sha256, its file, how it is stored, and the bytes
    it wrote (0: the directory held it already)."""

    digest: str
    path: Path
    compression: str
    written: int


class _Hasher(threading.Thread):
    """The sha256 of a buffer, computed piece by piece on its own thread (hashlib releases
    the GIL), so that writing the same buffer runs beside it."""

    def __init__(self, view: memoryview, chunk: int):
        super().__init__(daemon=True, name="kpair-blob-sha256")
        self.view, self.chunk = view, chunk
        self.digest: str | None = None
        self.error: BaseException | None = None
        self.stop = False

    def run(self) -> None:
        try:
            h = hashlib.sha256()
            for at in range(0, len(self.view), self.chunk):
                if self.stop:
                    return
                h.update(self.view[at:at + self.chunk])
            self.digest = h.hexdigest()
        except BaseException as e:  # handed to the caller by result()
            self.error = e

    def result(self) -> str:
        self.join()
        if self.error is not None:
            raise self.error
        assert self.digest is not None
        return self.digest


def store_blob(directory: Path, data: bytes | bytearray | memoryview, compressors: Compressors,
               *, chunk: int = CHUNK, what: str = "store blob") -> StoredBlob:
    """Store ``data`` in ``directory`` under its sha256 unless a blob of that digest is there
    already; raw where ``Compressors.choose`` says so, else zstd-compressed. Nothing is copied:
    the sha256 is computed on another thread while the blob is written from the caller's
    buffer into a temporary file, which is renamed into place at the end (or removed, as soon
    as the digest shows the blob present)."""
    view = _bytes_view(data)
    if len(view) <= chunk:  # small: hashing first costs nothing worth saving
        digest = sha256(view)
        present = find_blob(directory, digest)
        if present is not None:
            return StoredBlob(digest, present[0], present[1], 0)
        compression = compressors.choose(view)
        path = directory / blob_name(digest, compression)
        return StoredBlob(digest, path, compression,
                          write_blob(path, view, compressors, chunk=chunk, what=what,
                                     compression=compression))
    compression = compressors.choose(view)
    hasher = _Hasher(view, chunk)
    hasher.start()
    seen: dict[str, object] = {}  # "present": the lookup, once the digest is known

    def stored_already() -> bool:
        if "present" not in seen and hasher.digest is not None:
            seen["present"] = find_blob(directory, hasher.digest)
        return seen.get("present") is not None

    tmp = directory / f".blob.tmp{os.getpid()}.{threading.get_ident()}"
    try:
        written = _write(tmp, view, compressors, chunk, what, compression, stored_already)
        digest = hasher.result()
        present = find_blob(directory, digest)
        if present is not None:
            tmp.unlink(missing_ok=True)
            return StoredBlob(digest, present[0], present[1], 0)
        path = directory / blob_name(digest, compression)
        os.replace(tmp, path)
    except BaseException:
        hasher.stop = True
        hasher.join()
        tmp.unlink(missing_ok=True)
        raise
    return StoredBlob(digest, path, compression, written)


def _write(tmp: Path, view: memoryview, compressors: Compressors, chunk: int, what: str,
           compression: str, stop=lambda: False) -> int:
    """Write ``view`` into ``tmp`` (raw or as one zstd frame recording its size), in pieces
    of ``chunk`` bytes above that size; stops early where ``stop()`` turns true (the file
    is then incomplete and the caller discards it). Returns the bytes written."""
    shown = _Shown(what, len(view))
    with open(tmp, "wb") as f:
        if compression == "none":
            for at in range(0, len(view), chunk):
                if stop():
                    break
                shown.at(at)
                f.write(view[at:at + chunk])
        elif len(view) <= chunk:
            f.write(compressors.for_size(len(view)).compress(view))
        else:
            cctx, abandoned = compressors.for_size(len(view)), False
            try:
                with cctx.stream_writer(f, size=len(view), closefd=False) as w:
                    for at in range(0, len(view), chunk):
                        if stop():
                            abandoned = True
                            break
                        shown.at(at)
                        w.write(view[at:at + chunk])
            except _zstd().ZstdError:
                if not abandoned:  # else: the short frame's own complaint, expected
                    raise
        return f.tell()


def write_blob(path: Path, data: bytes | bytearray | memoryview, compressors: Compressors, *,
               chunk: int = CHUNK, what: str = "store blob", compression: str = "zstd") -> int:
    """Write ``data`` into ``path`` (zstd-compressed, or raw for ``compression="none"``)
    through a temporary file beside it and a rename, and return the bytes written. Above
    ``chunk`` bytes it goes as a stream of pieces of that size: memory does not grow with the
    blob. A zstd frame records the raw size either way (``read_blob`` relies on it)."""
    view = _bytes_view(data)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.{threading.get_ident()}")
    try:
        stored = _write(tmp, view, compressors, chunk, what, compression)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return stored


def _frame_size(f, ref: BlobRef, fail) -> int:
    """The raw size the blob's zstd frame header records (-1: none), checked against the
    manifest and against what a stream of this many stored bytes can hold at all."""
    zstd = _zstd()
    header = f.read(_FRAME_HEADER_MAX)
    f.seek(0)
    try:
        claimed = zstd.frame_content_size(header)
    except zstd.ZstdError as e:
        raise fail(f"is corrupt or truncated ({e})") from None
    if claimed != -1 and claimed != ref.size:  # -1: the frame does not say
        raise fail(f"holds {claimed} bytes by its zstd frame header, manifest says "
                   f"{ref.size} (truncated or replaced)")
    stored = os.fstat(f.fileno()).st_size
    if ref.size > _MAX_RATIO * stored:
        raise fail(f"is {stored} bytes: no zstd stream that short holds the {ref.size} bytes "
                   "the manifest declares (truncated or replaced)")
    return claimed


def _read_bounded(path: Path, ref: BlobRef, fail) -> bytes:
    """The raw bytes of the blob file at ``path``, never more than ``ref.size`` of them.

    A blob is untrusted input: its frame header may claim any size, or none, and the manifest
    may declare a huge size to make a reader allocate it up front. Every size is checked before
    bytes are produced. A frame that records the declared size (every blob kpair writes) is
    decompressed in one call into the ``bytes`` returned, from a memory map of the file; one
    that does not is gathered piece by piece and stops one byte past the declared size.
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
        claimed = _frame_size(f, ref, fail)
        if claimed == ref.size:
            try:
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as packed:
                    return zstd.ZstdDecompressor().decompress(packed)
            except (zstd.ZstdError, ValueError) as e:
                raise fail(f"is corrupt or truncated ({e})") from None
        out = bytearray()
        try:
            with zstd.ZstdDecompressor().stream_reader(f, closefd=False) as reader:
                while len(out) <= ref.size:
                    piece = reader.read(min(_PIECE, ref.size + 1 - len(out)))
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


def _fill(reader, view: memoryview) -> int:
    """Read from ``reader`` into ``view`` until it is full or the stream ends; bytes read."""
    got = 0
    while got < len(view):
        n = reader.readinto(view[got:])
        if not n:
            break
        got += n
    return got


def _stream(path: Path, ref: BlobRef, fail, target: memoryview | None, *, chunk: int,
            what: str, spare: list[memoryview] | None = None, sink=None) -> None:
    """Read the blob at ``path`` into ``target`` (``ref.size`` writable bytes) a piece of at
    most ``chunk`` bytes at a time, or, with ``target`` None, through the two buffers
    ``spare`` in turn (piece-sized ones made here when None: a check that keeps nothing).
    A raw blob is read straight into place (``readinto``), a zstd one decompressed into
    place; each piece is hashed on another thread while the next is read, and handed to
    ``sink(offset, piece)`` if given, which may return a callable to wait on before that
    piece's buffer is refilled (an asynchronous copy's synchronize). Refuses the blob when it
    holds more or fewer than ``ref.size`` bytes (reading stops one byte past) or its sha256
    differs."""
    zstd = _zstd()
    digest, done, shown = hashlib.sha256(), 0, _Shown(what, ref.size)
    if target is None:
        if spare is None:
            spare = [memoryview(bytearray(min(chunk, ref.size))) for _ in range(2)]
        chunk = min(chunk, *(len(b) for b in spare))
        if ref.size and not chunk:
            raise ValueError("staging buffers must not be empty")
    busy: list[list] = [[], []]  # per buffer: what to wait on before it is refilled

    def settle(waits: list) -> None:
        while waits:
            waits.pop(0)()

    with ThreadPoolExecutor(max_workers=1) as hasher, open(path, "rb", buffering=0) as f:
        try:
            if ref.compression == "none":
                stored = os.fstat(f.fileno()).st_size
                if stored != ref.size:
                    raise fail(f"holds {stored} bytes, manifest says {ref.size} "
                               "(truncated or replaced)")
                reader = f
            else:
                _frame_size(f, ref, fail)
                reader = zstd.ZstdDecompressor().stream_reader(f, closefd=False)
            turn = 0
            while done < ref.size:
                shown.at(done)
                n = min(chunk, ref.size - done)
                if target is not None:
                    piece = target[done:done + n]
                else:
                    settle(busy[turn])  # hashed and handed on: free to refill
                    piece = spare[turn][:n]
                got = _fill(reader, piece)
                piece = piece[:got]
                busy[turn].append(hasher.submit(digest.update, piece).result)  # in order
                if sink is not None and got:
                    wait = sink(done, piece)
                    if callable(wait):
                        busy[turn].append(wait)
                turn ^= 1
                done += got
                if got < n:
                    break
            if done == ref.size and reader.read(1):
                raise fail(f"decompresses to more than the {ref.size} bytes the manifest "
                           "declares (refused before reading further)")
        except zstd.ZstdError as e:
            raise fail(f"is corrupt or truncated ({e})") from None
        finally:
            for waits in busy:
                settle(waits)
    if done < ref.size:
        raise fail(f"holds {done} bytes, manifest says {ref.size} (truncated or replaced)")
    if digest.hexdigest() != ref.sha256:
        raise fail(f"does not match its sha256 {ref.sha256} (corrupt or replaced)")


class ChainOp(NamedTuple):
    """One operation of a regeneration chain as capture saw it (``SnapshotWriter.chain``)."""

    image: bytes
    format: str
    kernel_name: str
    launch: Launch
    kernarg: bytes
    params: tuple[Param, ...] = ()


class SnapshotWriter:
    """Collects blobs into ``root/blobs`` and finally writes ``root/snapshot.json``."""

    def __init__(self, root: str | os.PathLike, *, level: int = 3, chunk: int = CHUNK):
        self.root = Path(root)
        if (self.root / MANIFEST).exists():
            raise UsageError(f"{self.root} already holds a snapshot; choose another directory")
        if self.root.exists() and any(p.name != BLOBS for p in self.root.iterdir()):
            raise UsageError(f"{self.root} exists and is not empty; refusing to write into it")
        (self.root / BLOBS).mkdir(parents=True, exist_ok=True)
        self.compressors = Compressors(level)
        self.chunk = chunk
        self.bytes_raw = 0
        self.bytes_stored = 0

    def put(self, data: bytes | bytearray | memoryview) -> BlobRef:
        """Store ``data`` (any contiguous buffer; neither copied nor kept) unless present."""
        view = _bytes_view(data)
        blob = store_blob(self.root / BLOBS, view, self.compressors, chunk=self.chunk)
        self.bytes_raw += len(view)
        self.bytes_stored += blob.written
        return BlobRef(f"{BLOBS}/{blob.path.name}", len(view), blob.digest, blob.compression)

    def chain(self, ops: Sequence[ChainOp | Op], sha256: str, size: int, *,
              reads: Sequence[str] = (), digests: Sequence[str] = (),
              digest64: str | None = None, digests64: Sequence[str] = ()) -> Regen:
        """A region's pre-state as the chain ``ops`` (each a ``ChainOp``: code object image
        and format, kernel name, launch, kernarg bytes as launched, parameter layout, whose
        code object and kernarg are stored here as blobs; or an ``Op`` already built, such as
        a memset); ``sha256`` and ``size`` are the region's, ``reads`` the other regions the
        chain reads, ``digests`` the region's sha256 after each op; ``digest64`` and
        ``digests64`` the same as ``digest64`` (``hex64``; a replay checks by them on the
        device). Put it in ``Region(..., regen=...)`` in place of a pre blob."""
        records = []
        for op in ops:
            if isinstance(op, Op):
                records.append(op)
                continue
            records.append(Op(CodeObject(self.put(op.image), op.format, op.kernel_name),
                              op.launch, Kernarg(self.put(op.kernarg), tuple(op.params))))
        return Regen(tuple(records), sha256, size, tuple(reads), tuple(digests), digest64,
                     tuple(digests64))

    def digest(self, data: bytes | bytearray | memoryview) -> StateDigest:
        """``data`` kept as digests only (``Region(..., post_digest=...)``): its size, sha256
        and digest64, computed side by side a piece at a time; nothing is stored."""
        return state_digest(data)

    def finish(self, manifest: Manifest) -> Snapshot:
        write_json_atomic(self.root / MANIFEST, manifest.to_json())
        return Snapshot.open(self.root)


def state_digest(data: bytes | bytearray | memoryview) -> StateDigest:
    """The ``StateDigest`` of ``data``: its sha256 (on its own thread) and digest64 (here),
    side by side over the one buffer."""
    view = _bytes_view(data)
    hasher = _Hasher(view, CHUNK)
    hasher.start()
    try:
        d64 = hex64(digest64(view))
    except BaseException:
        hasher.stop = True
        hasher.join()
        raise
    return StateDigest(len(view), hasher.result(), d64)


class Snapshot:
    """A snapshot directory opened for reading. Every blob read is verified."""

    def __init__(self, root: Path, manifest: Manifest):
        self.root = root
        self.manifest = manifest
        #: Regenerable regions' bytes once made on a device and checked against their
        #: sha256 (``kpair.regen.regenerate`` fills it): region name -> bytes.
        self.regenerated: dict[str, bytes] = {}

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

    def _fail(self, ref: BlobRef, field: str):
        return lambda message: SnapshotFormatError(f"blob {ref.path} {message}",
                                                   path=self.root / MANIFEST, field=field)

    def read_blob(self, ref: BlobRef, field: str = "blob") -> bytes:
        """The verified raw bytes of ``ref``; ``field`` names it in errors."""
        if ref.size >= PROGRESS_BYTES:  # one call: the progress line's heartbeat times it
            progress.stage(f"load {field} ({human_bytes(ref.size)})")
        return self._verified(ref, field)

    def _verified(self, ref: BlobRef, field: str) -> bytes:
        path = self._blob_path(ref, field)
        data = _read_bounded(path, ref, self._fail(ref, field))
        if sha256(data) != ref.sha256:
            raise SnapshotFormatError(f"blob {ref.path} does not match its sha256 {ref.sha256} "
                                      "(corrupt or replaced)",
                                      path=self.root / MANIFEST, field=field)
        return data

    def read_into(self, ref: BlobRef, buffer, field: str = "blob", *,
                  chunk: int = CHUNK) -> None:
        """Read ``ref`` into ``buffer`` (writable, exactly ``ref.size`` bytes, owned by the
        caller: a pinned staging buffer, a mapped file), ``chunk`` bytes at a time: a raw
        blob straight from the file, a zstd one decompressed into place, each piece hashed
        while the next is read; no other copy of the blob is made. On an error the buffer
        holds part of the blob and must not be used."""
        view = _bytes_view(buffer)
        if view.readonly or len(view) != ref.size:
            raise ValueError(f"read_into needs a writable buffer of {ref.size} bytes, got "
                             f"{len(view)}{' (read-only)' if view.readonly else ''}")
        _stream(self._blob_path(ref, field), ref, self._fail(ref, field), view, chunk=chunk,
                what=f"load {field}")

    def stream_blob(self, ref: BlobRef, sink, field: str = "blob", *,
                    buffers: tuple | list | None = None, chunk: int = CHUNK) -> None:
        """Read ``ref`` a piece at a time through two staging ``buffers`` in turn (the
        caller's, e.g. pinned host memory for copies to a device; two of ``chunk`` bytes are
        made here when None), calling ``sink(offset, piece)`` for each piece as it is read.
        ``sink`` may start an asynchronous copy and return a callable (its synchronize):
        it is called before that buffer is refilled, and before this returns. Each piece is
        hashed while the next is read; the blob is verified only when this returns without
        error, so whatever ``sink`` copied must not be used before then."""
        spare = None
        if buffers is not None:
            spare = [_bytes_view(b) for b in buffers]
            if len(spare) != 2 or any(v.readonly for v in spare):
                raise ValueError("stream_blob needs two writable staging buffers")
        _stream(self._blob_path(ref, field), ref, self._fail(ref, field), None, chunk=chunk,
                what=f"load {field}", spare=spare, sink=sink)

    def check_blob(self, ref: BlobRef, field: str = "blob", *, chunk: int = CHUNK) -> int:
        """Check ``ref`` (size and sha256) as a stream, holding at most ``chunk`` raw bytes of
        it at a time; return its raw size."""
        _stream(self._blob_path(ref, field), ref, self._fail(ref, field), None, chunk=chunk,
                what=f"check {field}")
        return ref.size

    # Convenience accessors, each naming its field for errors.
    def code_object(self) -> bytes:
        return self.read_blob(self.manifest.code.blob, "code_object.blob")

    def kernarg(self) -> bytes:
        return self.read_blob(self.manifest.kernarg.blob, "kernarg.blob")

    def _made(self, index: int) -> bytes:
        r = self.manifest.regions[index]
        if r.name not in self.regenerated:
            raise SnapshotFormatError(
                f"region {r.name!r} is stored as a chain of {len(r.regen.ops)} operation(s), "
                "not as bytes: its pre-state is made on a device (kpair.regen.regenerate, "
                "which a replay runs first)", path=self.root / MANIFEST,
                field=f"regions[{index}].regen")
        return self.regenerated[r.name]

    def pre(self, index: int) -> bytes:
        r = self.manifest.regions[index]
        if r.regen is not None:
            return self._made(index)
        return self.read_blob(r.pre_blob, f"regions[{index}].pre")

    def digest_post_error(self, index: int) -> SnapshotFormatError:
        """What a reader that needs the bytes of a post-state kept as digests says."""
        r = self.manifest.regions[index]
        return SnapshotFormatError(
            f"region {r.name!r}'s post-state was kept as a digest (sha256 "
            f"{r.post_digest.sha256[:16]}..., no bytes: capture's --post-digest-over): a "
            "replay makes them by running the captured operations and checks their sha256 "
            "(kpair.replay.Replay); the snapshot alone does not hold them (--store-bytes "
            "keeps them)", path=self.root / MANIFEST, field=f"regions[{index}].post_digest")

    def post(self, index: int) -> bytes:
        """The post-state's bytes; refused (``digest_post_error``) for one kept as digests."""
        r = self.manifest.regions[index]
        if r.post_digest is not None:
            raise self.digest_post_error(index)
        if r.post_blob is None:
            return self.pre(index)
        return self.read_blob(r.post_blob, f"regions[{index}].post")

    def known_pre(self, index: int) -> bytes | None:
        """``pre(index)``, or None for a regenerable region not regenerated yet."""
        r = self.manifest.regions[index]
        if r.regen is not None and r.name not in self.regenerated:
            return None
        return self.pre(index)

    def regions_data(self, on_device: Collection[str] = ()
                     ) -> list[tuple[bytes | None, bytes | None]]:
        """Every region's (pre, post) bytes, verified as ``pre`` and ``post`` verify them,
        the blobs decompressed and hashed on several threads (``threaded_map``). A blob named
        twice (an input's unchanged pre- and post-state) is read once: both get one object.
        A post-state kept as digests (``Region.post_digest``) is None, and so are the pre-
        (and unchanged post-) state of the regenerable regions named in ``on_device`` (made
        and checked on a device, their bytes kept there)."""
        m = self.manifest
        blobs: dict[tuple, tuple[BlobRef, str]] = {}
        for i, r in enumerate(m.regions):
            for ref, side in ((r.pre_blob, "pre"), (r.post_blob, "post")):
                if ref is not None:
                    blobs.setdefault(_identity(ref), (ref, f"regions[{i}].{side}"))
        size = sum(ref.size for ref, _ in blobs.values())
        if size >= PROGRESS_BYTES:
            progress.stage(f"load {len(blobs)} region blobs ({human_bytes(size)})")
        data = dict(zip(blobs, threaded_map(lambda b: self._verified(*b), blobs.values()),
                        strict=True))

        def state(i: int, ref: BlobRef | None) -> bytes | None:
            if ref is None:
                return None if m.regions[i].name in on_device else self._made(i)
            return data[_identity(ref)]

        return [(state(i, r.pre_blob), None if r.post_digest is not None else
                 state(i, r.post_blob if r.post_blob is not None else r.pre_blob))
                for i, r in enumerate(m.regions)]

    def blob_fields(self) -> list[tuple[BlobRef, str]]:
        """Every blob the manifest names, with the field that names it."""
        m = self.manifest
        refs = [(m.code.blob, "code_object.blob"), (m.kernarg.blob, "kernarg.blob")]
        for i, op in enumerate(m.operations[1:], 1):   # a range's later operations
            if op.kind != "kernel":   # a memset or a copy names no blob
                continue
            refs += [(op.code.blob, f"ops[{i}].code_object.blob"),
                     (op.kernarg.blob, f"ops[{i}].kernarg.blob")]
        for i, r in enumerate(m.regions):
            if r.pre_blob is not None:
                refs.append((r.pre_blob, f"regions[{i}].pre"))
            if r.post_blob is not None:
                refs.append((r.post_blob, f"regions[{i}].post"))
            if r.regen is not None:
                for j, op in enumerate(r.regen.ops):
                    if op.kind != "kernel":   # a memset or a copy
                        continue
                    at = f"regions[{i}].regen.ops[{j}]"
                    refs += [(op.code.blob, f"{at}.code_object.blob"),
                             (op.kernarg.blob, f"{at}.kernarg.blob")]
        return refs

    def verify(self, *, chunk: int = CHUNK) -> int:
        """Check every blob; return the raw bytes the manifest names (a blob named twice,
        such as an input's unchanged pre- and post-state, counts twice but is read once).
        Streams: at most ``chunk`` raw bytes are held at a time, whatever the regions' size."""
        total, checked = 0, set()
        for ref, field in self.blob_fields():
            key = _identity(ref)
            if key not in checked:
                self.check_blob(ref, field, chunk=chunk)
                checked.add(key)
            total += ref.size
        return total

    def stored_bytes(self) -> int:
        """Bytes of the blob files in ``blobs/`` (compressed or raw, each file once)."""
        return sum(p.stat().st_size for p in (self.root / BLOBS).iterdir()
                   if p.is_file() and not p.name.startswith("."))

    def region_bytes(self) -> int:
        """Bytes of the regions the manifest holds (each region once: its size), stored as
        blobs or as chains."""
        return sum(r.size for r in self.manifest.regions)

    def regenerable_bytes(self) -> int:
        """Bytes of the regions whose pre-state is stored as a chain."""
        return sum(r.size for r in self.manifest.regions if r.regen is not None)
