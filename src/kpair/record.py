"""Record a real call of a kernel on numpy inputs into a snapshot, without a capture tool.

``record_call(lib, "saxpy", [np.int32(n), np.float32(2.0), x, y], out)`` (for
``void saxpy(int n, float a, const float *x, float *y)``) copies every numpy array argument
into one freshly mapped arena on the device (so the captured regions form one compact span,
with gaps between them for guard bands), launches the kernel there, stores the arena's pre-
and post-state per array as regions and the scalars in the kernarg, and copies the results
back into the caller's arrays — the call really happens. Any backend works: a C function in a
shared object on ``host``, an nvcc-built cubin on ``cuda``, a clang-built hsaco on ``hip``
(its layout must match the code object's metadata: AbiMismatch otherwise). Used by tests,
examples and ``kpair demo``; real programs are captured with ``kpair capture`` instead.

One buffer passed twice (the same array, or overlapping views of one buffer) is one region,
spanning every view of it, each argument pointing at its own place in it: the kernel sees
the aliasing the caller's call had. Every region has guard bands on both sides (a fixed byte
pattern): a kernel that writes outside its arrays is refused (``DriverError``) naming the
argument whose guard it wrote and by how many bytes. On ``host``, a shared object built
with ``-g`` is checked against the arguments before the launch (``kpair.elfabi``).

Scalars are typed: a numpy scalar (``np.int32(3)``, ``np.float32(1.5)``, ...) or a ctypes
one (``ctypes.c_int(3)``) says how many bytes the kernel's parameter has. A bare Python int or
float is refused: C has no single size for it, and a guess packs ``int n`` as 8 bytes.

The kernel is a stranger's code, so the call runs in a child process (``isolate``, the
default) that writes the snapshot into a staging directory beside ``out``; a kernel that
crashes or hangs there becomes a ``KpairError`` in the caller (``WorkerFailed`` for a dead or
timed-out child). ``out`` appears only complete: the staging directory is renamed onto it at
the end and removed on any error.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import pickle
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from . import __version__, errors
from ._util import check_output_dir, child_command, kill_group, utc_now
from .backends import open_device
from .capture.chains import stored_region
from .capture.writers import LaunchRecord, WriterLog
from .elfabi import check_params
from .errors import (
    AbiMismatch,
    DriverError,
    FormatError,
    KpairError,
    UsageError,
    WorkerFailed,
)
from .snapshot import (
    DTYPE_HINTS,
    SCALAR_FORMATS,
    ChainOp,
    CodeObject,
    Kernarg,
    Launch,
    Manifest,
    Op,
    OutputSpan,
    Param,
    ScratchRegion,
    Snapshot,
    SnapshotWriter,
    detect_format,
)
from .snapshot.digest import digest64, hex64

#: numpy dtype → kernarg kind for scalar arguments.
_SCALAR_KINDS = {
    np.dtype(np.int8): "i8", np.dtype(np.uint8): "u8", np.dtype(np.int16): "i16",
    np.dtype(np.uint16): "u16", np.dtype(np.int32): "i32", np.dtype(np.uint32): "u32",
    np.dtype(np.int64): "i64", np.dtype(np.uint64): "u64", np.dtype(np.float32): "f32",
    np.dtype(np.float64): "f64",
}

#: ctypes scalar type → numpy dtype (c_int is c_int32 on every platform kpair runs on).
_CTYPES = {ctypes.c_int8: np.int8, ctypes.c_uint8: np.uint8, ctypes.c_int16: np.int16,
           ctypes.c_uint16: np.uint16, ctypes.c_int32: np.int32, ctypes.c_uint32: np.uint32,
           ctypes.c_int64: np.int64, ctypes.c_uint64: np.uint64, ctypes.c_float: np.float32,
           ctypes.c_double: np.float64}

#: Arena layout: regions start on this alignment, with a guard band of at least GAP bytes
#: on each side of each (two between neighbours).
ALIGN = 256
GAP = 256
#: The guard bands' bytes (a fixed pseudo-random pattern, so that a stray write of any
#: usual value shows).
_GUARD_SEED = 0x6B70_6169


def _guard(size: int) -> bytes:
    return np.random.default_rng(_GUARD_SEED).bytes(size)

#: Default limit for the isolated call, seconds (build, map, launch, read back).
TIMEOUT_S = 600.0
#: This process, as a range's provenance names it (``process``): ranges recorded with the
#: same value were recorded in one process, over memory that ``process_regions`` locates.
PROCESS = uuid.uuid4().hex


def _scalar(value: object, index: int, name: str) -> tuple[str, object]:
    what = f"argument {index} ({name})"
    if isinstance(value, ctypes._SimpleCData) and type(value) in _CTYPES:
        value = np.dtype(_CTYPES[type(value)]).type(value.value)
    if isinstance(value, np.generic):
        kind = _SCALAR_KINDS.get(value.dtype)
        if kind is None:
            raise UsageError(f"{what}: unsupported scalar dtype {value.dtype}; use one of "
                             "int8..int64, uint8..uint64, float32, float64")
        return kind, value.item()
    if isinstance(value, bool):
        raise UsageError(f"{what}: pass a boolean as np.int32 or np.uint8 (the size of the "
                         "C parameter)")
    if isinstance(value, int):
        raise UsageError(f"{what}: a bare Python int ({value}) does not say how many bytes the "
                         f"kernel's parameter has; pass np.int32({value}) for a C int, "
                         f"np.int64({value}) for int64_t / long / size_t (or ctypes.c_int...)")
    if isinstance(value, float):
        raise UsageError(f"{what}: a bare Python float ({value}) does not say float or "
                         f"double; pass np.float32({value}) for a C float, "
                         f"np.float64({value}) for a double")
    raise UsageError(f"{what}: expected a numpy array or a typed scalar (np.int32(3), "
                     f"np.float32(1.5), ...), got {type(value).__name__}")


def _regions(args: list, names: list[str]) -> tuple[list[dict], dict[int, tuple[int, int]]]:
    """One region per buffer: arrays whose memory overlaps (one array passed twice, views
    of one buffer) share a region spanning them. Returns the regions (name, bytes, dtype
    hint, the arguments in it) and, per array argument, (region index, offset in it)."""
    spans = sorted((a.__array_interface__["data"][0], i) for i, a in enumerate(args)
                   if isinstance(a, np.ndarray))
    groups: list[list[int]] = []
    hi = -1
    for lo, i in spans:
        end = lo + args[i].nbytes
        if groups and lo < hi:   # overlaps the group so far: one buffer
            groups[-1].append(i)
            hi = max(hi, end)
        else:
            groups.append([i])
            hi = end
    regions, where = [], {}
    for members in sorted(groups, key=min):
        members.sort()
        lo = min(args[i].__array_interface__["data"][0] for i in members)
        end = max(args[i].__array_interface__["data"][0] + args[i].nbytes for i in members)
        # Every byte of [lo, end) belongs to one of the (contiguous) arrays: safe to read.
        data = args[members[0]].tobytes() if len(members) == 1 else ctypes.string_at(lo, end - lo)
        dtypes = {str(args[i].dtype) for i in members}
        hint = dtypes.pop() if len(dtypes) == 1 else None
        for i in members:
            where[i] = (len(regions), args[i].__array_interface__["data"][0] - lo)
        regions.append({"name": names[members[0]], "data": data, "members": members,
                        "dtype": hint if hint in DTYPE_HINTS else None})
    return regions, where


def _check_out(out: Path) -> None:
    """A new or empty snapshot directory in a folder that exists (``check_output_dir``)."""
    check_output_dir(out, empty=True)
    if not out.parent.is_dir():
        raise UsageError(f"{out.parent} is not a directory; create it first")


def record_call(library: str | os.PathLike, symbol: str, args: Sequence[object],
                out: str | os.PathLike, *, names: Sequence[str] | None = None,
                backend: str = "host", launch: Launch | None = None,
                provenance: dict | None = None, device_options: dict | None = None,
                isolate: bool = True, timeout_s: float = TIMEOUT_S) -> Snapshot:
    """Launch ``symbol`` from the code object ``library`` on ``args`` and snapshot the call
    into the new directory ``out``; the arrays of ``args`` receive the kernel's results.

    ``args`` are numpy arrays (C-contiguous; each becomes a pointer and a captured region)
    and typed scalars (numpy or ctypes), in the kernel's parameter order. ``isolate=False``
    runs the call in this process (a host kernel still runs in its sandboxed executor)."""
    library, out = Path(library), Path(out)
    try:
        image = library.read_bytes()
    except OSError as e:
        raise FormatError(f"cannot read the code object ({e.strerror or e})",
                          path=library) from None
    if names is not None and len(names) != len(args):
        raise UsageError(f"{len(names)} names for {len(args)} arguments")
    names = list(names) if names is not None else [f"arg{i}" for i in range(len(args))]
    typed = []
    for i, a in enumerate(args):
        if isinstance(a, np.ndarray):
            if not a.flags.c_contiguous or a.nbytes == 0:
                raise UsageError(f"argument {i} ({names[i]}): arrays must be C-contiguous "
                                 "and non-empty")
            typed.append(a)
        else:
            typed.append(_scalar(a, i, names[i]))
    if timeout_s <= 0:
        raise UsageError(f"timeout_s must be positive, not {timeout_s}")
    _check_out(out)
    regions, where = _regions(typed, names)
    # What the child gets: each array as (region, offset), each scalar as (kind, value).
    passed = [("region", *where[i], i) if isinstance(a, np.ndarray) else (*a, i)
              for i, a in enumerate(typed)]
    request = {"ops": [{"image": image, "library": str(library), "symbol": symbol,
                        "args": passed, "launch": launch or Launch()}],
               "regions": regions, "labels": [f"argument {i} ({n})" for i, n in
                                              enumerate(names)],
               "names": names, "backend": backend, "range": None,
               "provenance": {"recorded_by": f"kpair {__version__} record_call",
                              "library": str(library), "command": list(sys.argv),
                              "time": utc_now(), **(provenance or {})},
               "device_options": device_options or {}}
    _run_request(request, out, isolate, timeout_s, typed, regions, where)
    return Snapshot.open(out)


def _run_request(request: dict, out: Path, isolate: bool, timeout_s: float, typed: list,
                 regions: list[dict], where: dict[int, tuple[int, int]]) -> None:
    """Record ``request`` into ``out`` (staged beside it, renamed on success) and copy each
    stored region's post-state back into the caller's arrays."""
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.record-", dir=out.parent))
    except OSError as e:
        raise UsageError(f"cannot write in {out.parent} ({e.strerror or e}); nothing was "
                         "written") from None
    try:
        if isolate:
            made, clobbered = _record_in_child(request, staging, timeout_s)
        else:
            made, clobbered = _record(request, staging)
        snap = Snapshot.open(staging)
        snap.regenerated.update(made)   # the chains' regions, as the recording made them
        stored = {r.name: k for k, r in enumerate(snap.manifest.regions)}
        posts = [clobbered[reg["name"]] if reg["name"] in clobbered else
                 snap.post(stored[reg["name"]]) if reg["name"] in stored else None
                 for reg in regions]
        with contextlib.suppress(FileNotFoundError):
            out.rmdir()  # an empty directory the caller made: the snapshot takes its place
        try:
            os.rename(staging, out)
        except OSError as e:
            raise UsageError(f"cannot create {out} ({e.strerror or e}); nothing was "
                             "written") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for region, post in zip(regions, posts, strict=True):
        if post is None:   # scratch: no bytes stored (a written one comes back all the same)
            continue
        for i in region["members"]:
            a, at = typed[i], where[i][1]
            np.copyto(a, np.frombuffer(post[at:at + a.nbytes], dtype=a.dtype).reshape(a.shape))


def _build_ops(calls: Sequence[tuple], what: str, flat: list, labels: list[str],
               images: dict[str, bytes]) -> list[dict]:
    """The child's records of ``calls`` (``(library, symbol, args[, launch])``), their
    arguments appended to ``flat`` (arrays, or (kind, value) scalars) and ``labels``."""
    ops = []
    for c, call in enumerate(calls):
        if not isinstance(call, tuple | list) or len(call) not in (3, 4):
            raise UsageError(f"{what} {c}: expected (library, symbol, args[, launch])")
        library, symbol, args = Path(call[0]), call[1], list(call[2])
        if str(library) not in images:
            try:
                images[str(library)] = library.read_bytes()
            except OSError as e:
                raise FormatError(f"cannot read the code object ({e.strerror or e})",
                                  path=library) from None
        passed = []
        for j, a in enumerate(args):
            label = f"{what} {c} ({symbol}) argument {j}"
            i = len(flat)
            if isinstance(a, np.ndarray):
                if not a.flags.c_contiguous or a.nbytes == 0:
                    raise UsageError(f"{label}: arrays must be C-contiguous and non-empty")
                flat.append(a)
            else:
                flat.append(_scalar(a, j, label))
            labels.append(label)
            passed.append(i)
        ops.append({"image": images[str(library)], "library": str(library), "symbol": symbol,
                    "args": passed, "launch": (call[3] if len(call) == 4 else None)
                    or Launch()})
    return ops


def record_range(calls: Sequence[tuple], out: str | os.PathLike, *,
                 names: dict[str, np.ndarray] | None = None,
                 scratch: Sequence[np.ndarray] = (), outputs: Sequence[np.ndarray] = (),
                 setup: Sequence[tuple] = (), store_bytes: bool = False,
                 post_digest_over: int | None = None, backend: str = "host",
                 provenance: dict | None = None,
                 device_options: dict | None = None, isolate: bool = True,
                 timeout_s: float = TIMEOUT_S) -> Snapshot:
    """Run ``calls`` in order and snapshot them into ``out`` as ONE range.

    Each call is ``(library, symbol, args)`` or ``(library, symbol, args, launch)``, ``args``
    as for ``record_call``. Every array is one region across all calls (the same array, or
    overlapping views of one buffer, is one region wherever it is passed); its pre-state is
    taken before the first call, its post-state after the last. A region no call changes is
    live-in (role "in"); a changed one is live-out: "out" when it holds an array of
    ``outputs``, else "inout". Arrays of ``scratch`` are scratch (size only, no bytes stored,
    not copied back). ``names`` names regions ({name: array}); others are ``buf<k>``.
    A single call is the one-operation range (``record_call`` writes no range fields).

    ``setup`` calls (same form) run first, in the same arena, and are not part of the range:
    they make the range's inputs. Per array, capture follows which setup calls wrote it (a
    call writes the arrays whose bytes it changed and reads the others it is passed). A
    region whose writers form a chain rooted only in calls that read no region, through calls
    whose inputs are themselves regenerable regions of the range, each call writing that
    region alone, is stored as that chain plus its sha256 (``Region.regen``, schema v2) once
    the chain, run again on the zero-filled region, is seen to make exactly its bytes (the
    sha256 after each call is recorded too); every other region (host data: an array filled
    from Python) is stored as bytes. ``store_bytes`` stores every region as bytes.
    ``post_digest_over``: a written region larger than this many bytes keeps its post-state
    as digests only (``Region.post_digest``: size, sha256, digest64; no blob; the caller's
    arrays still get the results); None (the default) or ``store_bytes``: as bytes.
    Arrays passed only to setup calls are placed for them but are no region of the range."""
    out = Path(out)
    if not calls:
        raise UsageError("a range has at least one call")
    flat: list = []
    labels: list[str] = []
    images: dict[str, bytes] = {}
    before = _build_ops(setup, "setup call", flat, labels, images)
    in_range = len(flat)
    ops = _build_ops(calls, "call", flat, labels, images)
    if timeout_s <= 0:
        raise UsageError(f"timeout_s must be positive, not {timeout_s}")
    named = {id(a): n for n, a in (names or {}).items()}
    for n, a in (names or {}).items():
        if not isinstance(a, np.ndarray):
            raise UsageError(f"names[{n!r}] is not a numpy array")
    arg_names = [named.get(id(a), "") if isinstance(a, np.ndarray) else "" for a in flat]
    _check_out(out)
    regions, where = _regions(flat, arg_names)
    used = {where[i][0] for i in range(in_range, len(flat)) if i in where}
    ids = {"scratch": {id(a) for a in scratch}, "outputs": {id(a) for a in outputs}}
    taken: set[str] = set()
    spare, outs, out_spans = [], [], {}
    for k, reg in enumerate(regions):
        members = [flat[i] for i in reg["members"]]
        given = [arg_names[i] for i in reg["members"] if arg_names[i]]
        reg["name"] = given[0] if given else f"buf{k}"
        if reg["name"] in taken:
            raise UsageError(f"region name {reg['name']!r} is given twice")
        taken.add(reg["name"])
        is_scratch = [id(a) in ids["scratch"] for a in members]
        if any(is_scratch) and not all(is_scratch):
            raise UsageError(f"region {reg['name']}: a scratch array shares its memory with "
                             "an array that is not scratch")
        if all(is_scratch):
            spare.append(k)
        if any(id(a) in ids["outputs"] for a in members):
            outs.append(k)
            # each declared array's own bytes inside the region (several views: each)
            out_spans[str(k)] = sorted({(where[i][1], flat[i].nbytes)
                                        for i in reg["members"]
                                        if id(flat[i]) in ids["outputs"] and flat[i].nbytes})
    seen = {id(a) for a in flat if isinstance(a, np.ndarray)}
    for what in ("scratch", "outputs"):
        if ids[what] - seen:
            raise UsageError(f"an array of {what}= is passed to no call")
    for op in (*before, *ops):
        op["args"] = [("region", *where[i], i) if isinstance(flat[i], np.ndarray)
                      else (*flat[i], i) for i in op["args"]]
    # Where each region's buffer lives in this process: two ranges recorded here over the
    # same arrays name the same memory (``kpair.bind`` identifies regions by it).
    origins = {reg["name"]: [min(flat[i].__array_interface__["data"][0]
                                 for i in reg["members"]), len(reg["data"])]
               for reg in regions}
    if post_digest_over is not None and (isinstance(post_digest_over, bool) or
                                         not isinstance(post_digest_over, int | np.integer)
                                         or post_digest_over < 0):
        raise UsageError(f"post_digest_over must be a number of bytes (0 or more) or None, "
                         f"not {post_digest_over!r}")
    request = {"ops": ops, "setup": before, "store_bytes": bool(store_bytes),
               "post_digest_over": None if store_bytes or post_digest_over is None
               else int(post_digest_over),
               "setup_only": sorted(set(range(len(regions))) - used),
               "regions": regions, "labels": labels,
               "names": [arg_names[i] or f"arg{labels[i].rsplit(' ', 1)[1]}"
                         for i in range(len(flat))],
               "backend": backend, "range": {"scratch": spare, "outputs": outs,
                                             "output_spans": out_spans},
               "provenance": {"recorded_by": f"kpair {__version__} record_range",
                              "libraries": list(images), "command": list(sys.argv),
                              "time": utc_now(), "process": PROCESS,
                              "process_regions": origins, **(provenance or {})},
               "device_options": device_options or {}}
    _run_request(request, out, isolate, timeout_s, flat, regions, where)
    return Snapshot.open(out)


class Recorder:
    """``with Recorder(out) as r: r.call(lib, "kp_matmul", [a, b, c, np.int32(n)]); ...``:
    the calls are run and recorded as one range (``record_range``) when the block ends
    without an error. Arrays are held, not copied: they must stay alive and unchanged
    until then. Keyword arguments are ``record_range``'s (``store_bytes=True``: no chains).

    Calls made before the range is marked are setup: they make its inputs, and a region they
    make from nothing (a seeded generator, a fill) is stored as the calls that make it::

        with Recorder(out) as r:
            r.call(gen, "kp_fill_seeded", [a, np.int64(n), np.uint64(seed)])   # setup
            with r.range("forward"):                                             # the range
                r.call(lib, "kp_rowsum", [a, out, np.int32(rows), np.int32(cols)])

    ``range_start()`` marks it without a block. With no mark, every call is the range."""

    def __init__(self, out: str | os.PathLike, **options):
        self.out, self.options, self.calls = out, options, []
        self.setup: list[tuple] = []
        self.marked: str | None = None
        self.closed = False
        self.snapshot: Snapshot | None = None

    def call(self, library: str | os.PathLike, symbol: str, args: Sequence[object],
             launch: Launch | None = None) -> None:
        if self.closed:
            raise UsageError(f"call {symbol!r} after the range ended: a range is the last "
                             "thing a Recorder records")
        self.calls.append((library, symbol, list(args), launch or Launch()))

    def range_start(self, name: str = "range") -> None:
        """The calls so far are setup; the calls from here on are the range."""
        if self.marked is not None:
            raise UsageError(f"the range was marked already ({self.marked!r})")
        self.marked, self.setup, self.calls = name, self.calls, []

    @contextlib.contextmanager
    def range(self, name: str = "range"):
        """``with r.range("forward"): ...``: the calls inside are the range, those before
        it setup; no call may follow the block."""
        self.range_start(name)
        yield self
        self.closed = True

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, kind, *exc) -> None:
        if kind is None:
            extra: dict = {"setup": self.setup} if self.setup else {}
            if self.marked is not None:
                extra["provenance"] = {**(self.options.get("provenance") or {}),
                                       "range": self.marked}
            self.snapshot = record_range(self.calls, self.out,
                                         **{**self.options, **extra})


def _record(request: dict, root: Path) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """Map, launch and snapshot one call, or a range of calls, into ``root`` (in whichever
    process runs this). Returns the pre-state of each region stored as a chain (the caller
    copies results back, and an unchanged one has no post blob to read them from), and the
    post-state of each written region that became scratch or whose post-state is kept as
    digests only (no blob holds it either)."""
    names, backend, ops = request["names"], request["backend"], request["ops"]
    regions, labels, ranged = request["regions"], request["labels"], request["range"]
    scratch = set(ranged["scratch"]) if ranged else set()
    # Region k at starts[k], GAP-byte guards (at least) on both sides of it.
    starts, cursor = [], GAP
    for reg in regions:
        starts.append(cursor)
        cursor = -(-(cursor + len(reg["data"]) + 2 * GAP) // ALIGN) * ALIGN
    cursor -= GAP
    writer = SnapshotWriter(root)
    with open_device(backend, **request["device_options"]) as dev:
        # Relocating the range [0, cursor) maps a fresh arena anywhere: delta is its base.
        base = dev.map([(0, cursor)], relocate=True).delta
        loaded: dict[tuple[bytes, str], object] = {}
        steps = []
        setup = request.get("setup") or []
        for op in (*setup, *ops):
            image, symbol, fmt = op["image"], op["symbol"], detect_format(op["image"])
            key = (image, symbol)
            if key not in loaded:
                loaded[key] = dev.load(image, symbol, fmt=fmt)
            kernel = loaded[key]
            params, kernarg, offset = [], bytearray(), 0
            for a in op["args"]:
                i = a[-1]
                if a[0] == "region":
                    kind, value = "pointer", base + starts[a[1]] + a[2]
                else:
                    kind, value = a[0], a[1]
                size = struct.calcsize(SCALAR_FORMATS[kind])
                offset = -(-offset // size) * size
                kernarg += bytes(offset - len(kernarg)) + struct.pack(SCALAR_FORMATS[kind],
                                                                      value)
                params.append(Param(offset, size, kind, names[i]))
                offset += size
            kernarg = bytes(kernarg)
            layout = kernel.param_layout() if backend == "hip" else None
            if layout is not None and layout != [(p.offset, p.size) for p in params]:
                raise AbiMismatch(f"kernel {symbol!r} takes (offset, size) {layout}; the "
                                  f"arguments give {[(p.offset, p.size) for p in params]}")
            if fmt == "elf-so":
                check_params(image, symbol, params, "recorded")
            steps.append((op, fmt, kernel, kernarg, params))
        setup_steps, steps = steps[:len(setup)], steps[len(setup):]

        # The bands: before the first region, between each two, after the last.
        ends = [start + len(reg["data"]) for reg, start in zip(regions, starts, strict=True)]
        bands = list(zip([0, *ends], [*starts, cursor], strict=True))
        guard = _guard(max(hi - lo for lo, hi in bands))
        for lo, hi in bands:
            dev.write(base + lo, guard[:hi - lo])
        for reg, start in zip(regions, starts, strict=True):
            dev.write(base + start, reg["data"])
        pres = [reg["data"] for reg in regions]
        chains: dict[int, tuple[list[int], list[int], list[str], list[str]]] = {}
        if setup_steps:
            spans = [(base + start, len(reg["data"])) for reg, start in zip(regions, starts,
                                                                              strict=True)]
            effects = _run_setup(dev, setup_steps, spans)
            pres = [dev.read(a, n) for a, n in spans]
            if not request.get("store_bytes"):
                skip = scratch | set(request.get("setup_only") or ())
                chains = _verified_chains(dev, setup_steps, spans, pres, effects,
                                          _candidate_chains(effects, len(regions), skip))
        for op, _, kernel, kernarg, params in steps:   # in order, each after the last
            dev.launch(kernel, op["launch"], kernarg, params)
            dev.synchronize()   # a host kernel's leftover threads, too, before the guards
        written = [(lo, hi, np.flatnonzero(np.frombuffer(dev.read(base + lo, hi - lo), np.uint8)
                                           != np.frombuffer(guard[:hi - lo], np.uint8)))
                   for lo, hi in bands]
        _check_guards(written, regions, starts, labels,
                      " / ".join(dict.fromkeys(op["symbol"] for op in ops)))
        clobbered = _clobbered(dev, steps, regions, starts, base, pres, ranged,
                               scratch | set(request.get("setup_only") or ()))
        out, spare, clobbered_posts, spans_out = [], [], {}, []
        for k, (reg, start) in enumerate(zip(regions, starts, strict=True)):
            if k in clobbered:
                clobbered_posts[reg["name"]] = dev.read(base + start, len(reg["data"]))
            if k in scratch or k in clobbered:
                spare.append(ScratchRegion(reg["name"], base + start, len(reg["data"])))
                continue
            if k in set(request.get("setup_only") or ()):
                continue   # placed for the setup calls only: no region of the range
            post, pre = dev.read(base + start, len(reg["data"])), pres[k]
            role = None
            if ranged:
                # A declared output is written whatever its bytes (a call may write there
                # what the array already held).
                role = "out" if k in ranged["outputs"] else "in" if post == pre else "inout"
                if role == "out":
                    spans_out += [OutputSpan(reg["name"], o, n) for o, n in
                                  (ranged.get("output_spans") or {}).get(str(k), ())]
            if k in chains:
                calls, reads, digests, digests64 = chains[k]
                regen = writer.chain([_chain_op(setup_steps[c]) for c in calls],
                                     digests[-1], len(pre),
                                     reads=[regions[q]["name"] for q in reads],
                                     digests=digests, digest64=digests64[-1],
                                     digests64=digests64)
            else:
                regen = None
            out.append(stored_region(writer, reg["name"], base + start, pre, post, regen,
                                     role=role, dtype=reg["dtype"],
                                     post_digest_over=request.get("post_digest_over")))
            if out[-1].post_digest is not None:   # no blob holds it: copied back from here
                clobbered_posts[reg["name"]] = post
        env, dev_arch = dev.environment(), dev.arch()

    records = [Op(CodeObject(writer.put(op["image"]), fmt, op["symbol"]), op["launch"],
                  Kernarg(writer.put(kernarg), tuple(params)))
               for op, fmt, _, kernarg, params in steps]
    extra = {"ops": tuple(records), "scratch": tuple(spare)} if ranged else {}
    if spans_out:
        extra["outputs"] = tuple(spans_out)
    manifest = Manifest(
        backend=backend, arch=dev_arch, code=records[0].code, launch=records[0].launch,
        kernarg=records[0].kernarg, regions=tuple(out), environment=env,
        provenance=request["provenance"], **extra)
    writer.finish(manifest)
    return {regions[k]["name"]: pres[k] for k in chains}, clobbered_posts


def _clobbered(dev, steps, regions, starts, base, pres, ranged, skip: set[int]) -> set[int]:
    """Issue 47's rule: when a range declares outputs only they are live-out. A region the
    range writes that is no declared output is scratch when its pre-state is not read, as
    far as capture can tell: the range run again with that region's pre-state changed (every
    byte inverted) leaves every declared output and the region itself as the first run did.
    Others stay "inout" (judged as updated in place). Leaves the device as the first run
    left it."""
    if not ranged or not ranged["outputs"]:
        return set()
    spans = {k: (base + starts[k], len(reg["data"])) for k, reg in enumerate(regions)
             if k not in skip}
    posts = {k: dev.read(a, n) for k, (a, n) in spans.items()}
    every = {k: (base + starts[k], len(reg["data"])) for k, reg in enumerate(regions)}
    first = {k: dev.read(a, n) for k, (a, n) in every.items()}
    found, ran = set(), False
    for k in spans:
        if k in ranged["outputs"] or posts[k] == pres[k]:
            continue
        ran = True
        for q, (a, _) in every.items():
            dev.write(a, pres[q])
        a, n = spans[k]
        dev.write(a, (np.frombuffer(pres[k], np.uint8) ^ 0xFF).tobytes())
        for op, _, kernel, kernarg, params in steps:
            dev.launch(kernel, op["launch"], kernarg, params)
            dev.synchronize()
        if all(dev.read(*spans[q]) == posts[q] for q in (k, *ranged["outputs"])):
            found.add(k)
    if ran:
        for q, (a, _) in every.items():
            dev.write(a, first[q])
    return found


def _chain_op(step) -> ChainOp:
    op, fmt, _, kernarg, params = step
    return ChainOp(op["image"], fmt, op["symbol"], op["launch"], kernarg, tuple(params))


def _run_setup(dev, steps, spans: list[tuple[int, int]]) -> list[tuple[set[int], set[int]]]:
    """Run the setup calls in order; per call, the regions it wrote (their bytes changed)
    and those it read (passed to it, unchanged)."""
    effects = []
    for op, _, kernel, kernarg, params in steps:
        touched = sorted({a[1] for a in op["args"] if a[0] == "region"})
        before = {k: hashlib.sha256(dev.read(*spans[k])).digest() for k in touched}
        dev.launch(kernel, op["launch"], kernarg, params)
        dev.synchronize()
        wrote = {k for k in touched if hashlib.sha256(dev.read(*spans[k])).digest()
                 != before[k]}
        effects.append((wrote, set(touched) - wrote))
    return effects


def _candidate_chains(effects: list[tuple[set[int], set[int]]], count: int,
                      skip: set[int]) -> dict[int, tuple[list[int], list[int]]]:
    """Per region that may be regenerable: (its writers in order, the regions they read),
    by the rule the CUDA tracer's log applies (``kpair.capture.writers``): written by setup
    calls that each wrote it alone, reading only regions of the range that are themselves
    regenerable and unchanged since."""
    log = WriterLog()
    for c, (wrote, read) in enumerate(effects):
        log.launch(LaunchRecord(f"setup call {c}", kernel=c), hits=wrote | read, wrote=wrote)
    within = set(range(count)) - skip
    return {k: ([op.kernel for op in chain.ops], sorted(chain.reads))
            for k, chain in log.chains(within).items()}


def _verified_chains(dev, steps, spans, pres, effects, found
                     ) -> dict[int, tuple[list[int], list[int], list[str], list[str]]]:
    """The candidates whose chain, run again on the zero-filled region after the regions it
    reads (themselves verified first), makes exactly the region's bytes: (calls, reads, the
    region's sha256 after each call, its digest64 after each call). The others get their
    bytes back and are stored as bytes; a chain reading one of those is dropped too."""
    done: dict[int, tuple[list[int], list[int], list[str], list[str]]] = {}
    pending = dict(found)
    while pending:
        ready = [k for k, (_, reads) in pending.items() if all(q in done for q in reads)]
        if not ready:   # every one left reads a region that did not verify
            break
        for k in ready:
            calls, reads = pending.pop(k)
            address, size = spans[k]
            dev.fill(address, size, 0)
            digests, digests64 = [], []
            for c in calls:
                op, _, kernel, kernarg, params = steps[c]
                dev.launch(kernel, op["launch"], kernarg, params)
                dev.synchronize()
                data = dev.read(address, size)
                digests.append(hashlib.sha256(data).hexdigest())
                digests64.append(hex64(digest64(data)))
            if digests[-1] == hashlib.sha256(pres[k]).hexdigest():
                done[k] = (calls, reads, digests, digests64)
            else:
                dev.write(address, pres[k])
    return done


def _check_guards(written: list[tuple[int, int, np.ndarray]], regions: list[dict],
                  starts: list[int], labels: list[str], symbol: str) -> None:
    """Refuse the call when the kernel wrote into a guard band (``written``: per band, its
    [lo, hi) in the arena and the offsets in it that changed): name the argument whose band
    it was — past the end of the region before it, or before the start of the one after,
    whichever edge is nearer the first changed byte."""
    total = sum(int(changed.size) for _, _, changed in written)
    if not total:
        return
    k, (lo, hi, changed) = next((k, w) for k, w in enumerate(written) if w[2].size)
    first, last = lo + int(changed[0]), lo + int(changed[-1])
    after = k - 1 if k > 0 else None       # band k follows region k-1 ...
    before = k if k < len(regions) else None   # ... and precedes region k
    past_end = before is None or (after is not None and first - lo < hi - first)

    def who(r: int) -> str:
        return " / ".join(labels[i] for i in regions[r]["members"])

    if past_end:
        where = (f"{int(changed.size)} byte(s) past the end of {who(after)}, up to byte "
                 f"+{last - lo + 1} beyond it")
    else:
        where = (f"{int(changed.size)} byte(s) before the start of {who(before)}, from "
                 f"byte -{starts[before] - first}")
    raise DriverError(f"kernel {symbol!r}", "wrote outside its arrays",
                      f"{where}; {total} guard byte(s) changed in all; nothing was recorded")


def _record_in_child(request: dict, root: Path, timeout_s: float) -> dict[str, bytes]:
    with tempfile.TemporaryDirectory(prefix="kpair-record-") as tmp:
        ask, reply = Path(tmp) / "request.pkl", Path(tmp) / "reply.pkl"
        ask.write_bytes(pickle.dumps(request))
        cmd = child_command("kpair.record", "_child_main", str(ask), str(reply), str(root))
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            raise WorkerFailed(f"record_call: kernel {_symbols(request)!r} did not finish "
                               f"within {timeout_s:g} s; its process was killed (raise "
                               "timeout_s if the call is really that slow)") from None
        except BaseException:
            kill_group(proc)  # Ctrl-C in the caller: the child goes too
            raise
        if reply.is_file():
            outcome = pickle.loads(reply.read_bytes())
            if outcome is not None:
                raise _rebuild(*outcome)
            made = reply.with_name("made.pkl")
            return pickle.loads(made.read_bytes()) if made.is_file() else ({}, {})
        how = (f"signal {signal.Signals(-code).name}" if code < 0 and -code in
               signal.valid_signals() else f"exit status {code}")
        raise WorkerFailed(f"record_call: the process running kernel {_symbols(request)!r} "
                           f"from {_libraries(request)} died ({how}) before the snapshot was "
                           "written; nothing was written")


def _symbols(request: dict) -> str:
    return " / ".join(dict.fromkeys(op["symbol"] for op in request["ops"]))


def _libraries(request: dict) -> str:
    return ", ".join(dict.fromkeys(op["library"] for op in request["ops"]))


def _rebuild(names: list[str], message: str, fields: dict) -> KpairError:
    """The child's KpairError as the nearest class of kpair.errors, with its message and
    its fields (``path``, ``call``, ...)."""
    for name in names:
        cls = getattr(errors, name, None)
        if isinstance(cls, type) and issubclass(cls, KpairError):
            error = cls.__new__(cls)
            Exception.__init__(error, message)
            error.__dict__.update(fields)
            return error
    return KpairError(message)


def _child_main(argv: list[str]) -> int:
    ask, reply, root = (Path(a) for a in argv)
    try:
        made = _record(pickle.loads(ask.read_bytes()), root)
        reply.with_name("made.pkl").write_bytes(pickle.dumps(made))
        outcome = None
    except KpairError as e:
        fields = {k: v for k, v in vars(e).items()
                  if isinstance(v, (str, int, float, Path, type(None)))}
        outcome = ([c.__name__ for c in type(e).__mro__ if c.__module__ == errors.__name__],
                   str(e), fields)
    reply.write_bytes(pickle.dumps(outcome))
    return 0
