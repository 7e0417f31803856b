"""Pair harnesses: a snapshot, a ref and an opt binary, a policy, and a manifest of hashes.

Layout (``docs/format.md``)::

    <harness>/harness.json                 what to run: backend, binaries, kernel names, options
    <harness>/capture/                     the snapshot (snapshot.json + blobs/)
    <harness>/capture/validation_policy.json
    <harness>/ref.<ext>, <harness>/opt.<ext>   code objects (.so, .cubin, .fatbin, .ptx, .co)
    <harness>/MANIFEST.sha256              sha256 of every input file above (sha256sum format)
    <harness>/run_harness.py               ``python run_harness.py`` writes result.json

``create_harness`` builds one from a snapshot directory; ``Harness.open`` reads one back and
verifies every listed file against the manifest before anything runs. ``HarnessSpec`` is
harness.json (strictly read: unknown fields refused, backend and architecture must be the
snapshot's); the manifest lists every regular input file once, and nothing else may be there.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from . import __version__
from ._util import check_output_dir, make_dirs, threaded_map, write_bytes_atomic, write_text_atomic
from .backends import BACKENDS, arch_accepted
from .errors import HarnessError, InputError, KpairError, UsageError, WriteFailed
from .formats import Record, read, write
from .placement import holds_pointers, span_of
from .plan import Plan, PlanError, Target, TargetRegion, check_plan
from .policy import Mutation, Policy, load_policy, save_policy
from .policy.lint import lint
from .policy.mutation import completed, derive
from .policy.suggest import Spread
from .snapshot import CODE_FORMATS, Launch, Snapshot, detect_format, require_complete, sha256

SCHEMA = "kpair.harness"
SCHEMA_VERSION = 1
MANIFEST = "MANIFEST.sha256"
EXTENSIONS = {"elf-so": ".so", "cubin": ".cubin", "fatbin": ".fatbin", "ptx": ".ptx",
              "hsaco": ".co"}
OUTPUTS = ("result.json", "samples.npz", "worker.log")
#: Where a plan harness keeps the plan and its code objects.
PLAN_DIR = "plan"

class SideSpec(Record, omit_defaults=True):
    """One of the two kernels of a pair: its binary file, kernel name, launch override."""

    binary: str
    kernel: str
    format: Literal[CODE_FORMATS]  # type: ignore[valid-type]
    launch_override: dict[str, Any] = {}


class HarnessSpec(Record, omit_defaults=True):
    """``harness.json`` (schema ``kpair.harness`` v1): what to run."""

    schema: Literal["kpair.harness"]
    schema_version: Literal[1]
    backend: Literal[tuple(BACKENDS)]  # type: ignore[valid-type]
    arch: str
    snapshot: str
    policy: str
    ref: SideSpec
    opt: SideSpec
    measure: dict[str, Any] = {}
    created_by: str = ""
    #: A launch plan (``opt.plan.json``, its code objects beside it) that replaces ``opt``'s
    #: same-layout kernel; ``opt`` then names the plan's first launch.
    plan: str = ""


@dataclass(frozen=True)
class Harness:
    root: Path
    backend: str
    ref: SideSpec
    opt: SideSpec
    snapshot: Snapshot
    policy: Policy
    spec: HarnessSpec
    plan: Any = None   # kpair.plan.Plan of a plan harness
    plan_code: tuple = ()   # per launch: (code bytes, format)
    plan_layouts: tuple = ()   # per launch: its parameter layout (from the code object)

    @property
    def kind(self) -> dict:
        """What kind of pair this is, for result.json: a range's operations, a plan's
        launches (absent: one dispatch against a same-layout opt)."""
        out = {}
        if self.snapshot.manifest.is_range:
            out["range_ops"] = len(self.snapshot.manifest.operations)
        if self.plan is not None:
            out["plan_launches"] = len(self.plan.launches)
        return out

    @property
    def range_name(self) -> str | None:
        """A range's name: its provenance's ``range`` (what the capture or the recorder was
        told), else its kernels in order; None for a single dispatch."""
        m = self.snapshot.manifest
        if not m.is_range:
            return None
        name = m.provenance.get("range") if isinstance(m.provenance, dict) else None
        if isinstance(name, str) and name:
            return name
        return " ; ".join(dict.fromkeys(op.label for op in m.operations))

    @property
    def opt_name(self) -> str:
        """The opt as people read it: its kernel, or a plan's kernels in order."""
        if self.plan is None:
            return self.opt.kernel
        return " ; ".join(dict.fromkeys(launch.label for launch in self.plan.launches))

    @property
    def info(self) -> dict:
        """harness.json as JSON (what older callers read ``measure`` from)."""
        return self.spec.to_json()

    @classmethod
    def open(cls, root: str | os.PathLike, *, verify: bool = True,
             complete: bool = True) -> Harness:
        """Read and check a harness; ``complete=False`` (``kpair inspect``) also opens one
        whose snapshot capture left memory out, which every run refuses."""
        root = Path(root)
        spec_path = root / "harness.json"
        if not spec_path.is_file():
            raise HarnessError("no harness.json here: not a kpair harness", path=root)
        if verify:
            verify_manifest(root)
        spec = read(spec_path, HarnessSpec, error=HarnessError, schema=SCHEMA,
                    version=SCHEMA_VERSION)
        for key, rel in (("ref.binary", spec.ref.binary), ("opt.binary", spec.opt.binary),
                         ("snapshot", spec.snapshot), ("policy", spec.policy)):
            _inside(root, rel, spec_path, key)
        if not arch_accepted(spec.backend, spec.arch):
            raise HarnessError(f"{spec.arch!r} is not an architecture of backend "
                               f"{spec.backend!r}", path=spec_path, field="arch")
        snapshot = Snapshot.open(root / spec.snapshot)
        m = snapshot.manifest
        if complete:
            require_complete(m, snapshot.root)
        for key, mine, theirs in (("backend", spec.backend, m.backend),
                                  ("arch", spec.arch, m.arch)):
            if mine != theirs:
                raise HarnessError(f"{mine!r} differs from the snapshot's {theirs!r}",
                                   path=spec_path, field=key)
        policy = load_policy(root / spec.policy)
        policy.validate_against({r.name: r.size for r in m.regions})
        try:
            m.launch.override(spec.opt.launch_override)
        except KpairError as e:
            raise HarnessError(str(e), path=spec_path, field="opt.launch_override") from None
        plan = None
        code: tuple = ()
        layouts: tuple = ()
        if spec.plan:
            plan_path = _inside(root, spec.plan, spec_path, "plan")
            plan, code, layouts = load_plan(plan_path, m)
        if complete and verify:  # a run's open, before any launch: what a host object
            check_declared(root, spec, m.kernarg.params)   # declares (DWARF)
        return cls(root, spec.backend, spec.ref, spec.opt, snapshot, policy, spec, plan,
                   code, layouts)

    def planned_mutations(self) -> tuple[tuple[Mutation, ...], str]:
        """The differential runs' mutations and their source ("declared", "off", "derived").
        Derived ones are read off the snapshot (regions the captured launch left unchanged);
        the run derives them again from ref's own runs, which normally agree, and adds the
        regions ref updates in place (poison discovery shows them read). Declared ones are
        followed by the derived ones of the regions they leave out, unless the policy says
        ``mutations_exact``."""
        declared = self.policy.mutations
        if declared is not None and (not declared or self.policy.mutations_exact):
            return declared, "declared" if declared else "off"
        m, snap = self.snapshot.manifest, self.snapshot
        ranges = [(r.address, r.end) for r in m.regions]
        lo, hi = span_of(ranges) if ranges else (0, 0)
        # A region stored as a chain (regenerable) has no bytes before a device makes them:
        # its digests say whether it is read-only; a generator's output holds no pointers.
        pre = {r.name: snap.known_pre(i) for i, r in enumerate(m.regions)}
        read_only = [r.name for r in m.regions if r.pre.sha256 == r.post.sha256]
        pointers = [r.name for r in m.regions if pre[r.name] is not None
                    and holds_pointers(pre[r.name], r.address, lo, hi)]
        if declared is not None:   # completed with the regions they leave out
            named = {d.region for d in declared}
            return completed(declared, derive([(r.name, r.size, r.dtype) for r in m.regions],
                                              [n for n in read_only if n not in named],
                                              pointers))[0], "declared"
        return derive([(r.name, r.size, r.dtype) for r in m.regions], read_only,
                      pointers), "derived"

    def binary(self, side: SideSpec) -> bytes:
        return (self.root / side.binary).read_bytes()

    def launch(self, side: SideSpec) -> Launch:
        return self.snapshot.manifest.launch.override(side.launch_override)

    def inputs_digest(self) -> str:
        return sha256((self.root / MANIFEST).read_bytes())


def ref_spread(root: str | os.PathLike, runs: int, device_options: dict | None = None
               ) -> tuple[Spread, Policy]:
    """Replay the harness's ref ``runs`` times in this process, on its captured dispatch,
    and reduce the runs as they come (``Spread``: memory of one run, whatever ``runs``):
    (the spread, the harness's current policy). ``kpair policy suggest`` reads it."""
    from . import progress
    from .backends import open_device
    from .replay import Replay

    h = Harness.open(root)
    hints = {r.name: r.dtype for r in h.snapshot.manifest.regions if r.dtype}
    with open_device(h.backend, **(device_options or {})) as device:
        replay = Replay(device, h.snapshot)
        if h.snapshot.manifest.is_range:   # every captured operation, as one program
            ref = replay.load_range("ref")
        else:
            ref = device.load(h.binary(h.ref), h.ref.kernel, fmt=h.ref.format)
            replay.check_abi(ref, "ref")
        spread = Spread(hints, replay.pre)
        for i in range(runs):
            progress.stage(f"ref run {i + 1}/{runs}")
            spread.add(replay.run(ref, h.launch(h.ref)))
    return spread, h.policy


def check_declared(root: Path, spec: HarnessSpec, params) -> None:
    """Refuse (``AbiMismatch``) a host side whose shared object declares (DWARF, ``-g``)
    other parameters than the snapshot's kernarg passes; a stripped object passes unchecked
    (``kpair.elfabi``). Other formats were checked at pair time and by the driver at load."""
    from .elfabi import check_params

    for role, side in (("ref", spec.ref), ("opt", spec.opt)):
        if role == "opt" and spec.plan:
            continue   # a plan's launches have their own layouts (checked by load_plan)
        if side.format == "elf-so":
            check_params((root / side.binary).read_bytes(), side.kernel, params, role)


def plan_target(manifest):
    """The regions a plan must produce on ``manifest``'s range: each region's recorded role,
    or (a snapshot without roles) the one-dispatch rule of ``Target.of_dispatch``."""
    target = Target.of_dispatch(manifest)
    return Target({r.name: TargetRegion(r.size, r.role or target.regions[r.name].role)
                   for r in manifest.regions})


def plan_layout(image: bytes, fmt: str, kernel: str, arch: str | None = None):
    """The parameter layout a plan launch is checked against and packed by: a host shared
    object's DWARF (``kpair.program.host_layout``: kinds from the C types); a cubin's
    ``.nv.info`` KPARAM records, a PTX ``.entry``'s parameter list, a fatbin's cubin for
    ``arch`` (else its PTX), or an hsaco's metadata (offsets and sizes: kind ``bytes``,
    checked by size). None where the code object records none (a stripped host object, a
    fatbin whose members are compressed or lack the kernel)."""
    from .snapshot import Param

    if fmt == "elf-so":
        from .program import host_layout

        return host_layout(image, kernel)
    pairs = None
    if fmt == "cubin":
        pairs = _cubin_pairs(image, kernel)
    elif fmt == "ptx":
        pairs = _ptx_pairs(image, kernel)
    elif fmt == "fatbin":
        for kind, sm, member in fatbin_members(image):
            if kind == "elf" and (arch is None or f"sm_{sm}" == arch.removesuffix("a")):
                pairs = _cubin_pairs(member, kernel)
            elif kind == "ptx":
                pairs = _ptx_pairs(member, kernel)
            if pairs is not None:
                break
    elif fmt == "hsaco":
        from .amd.codeobject import read_code_object

        pairs = read_code_object(image).kernel(kernel).param_layout()
    if pairs is None:
        return None
    return [Param(offset, size, "bytes") for offset, size in pairs]


def _cubin_pairs(image: bytes, kernel: str) -> list[tuple[int, int]] | None:
    from .codecheck import _elf, _kparams

    info = _elf(image, "plan").get_section_by_name(f".nv.info.{kernel}")
    return _kparams(info.data()) if info is not None else None


def _ptx_pairs(image: bytes, kernel: str) -> list[tuple[int, int]] | None:
    from .ptx import entry_params

    try:
        return [(q.offset, q.size) for q in
                entry_params(image.decode("utf-8", errors="replace").rstrip("\0"), kernel)]
    except KpairError:
        return None   # no such .entry (the symbol check names it) or an unread declaration


#: A fatbin member's header flags for a compressed payload: LZ4 (older toolkits), zstd.
_FATBIN_LZ4, _FATBIN_ZSTD = 0x2000, 0x8000


def fatbin_members(image: bytes) -> Iterator[tuple[str, int, bytes]]:
    """The members of a CUDA fatbin kpair can read, in order, each decompressed only when
    reached: (``"elf"`` or ``"ptx"``, the SM number they are for, their bytes). The
    container: a 16-byte header (magic 0xBA55ED50, version, header size, payload size), then
    members, each a header (kind 1 PTX / 2 ELF, header size, payload size, compressed size,
    SM number, flags, uncompressed size) and its payload, stored as is or zstd-compressed.
    LZ4-compressed members (older toolkits) and anything unreadable are left out: their
    layout is left to the driver at load."""
    import struct

    import zstandard

    try:
        magic, _, header, size = struct.unpack_from("<IHHQ", image, 0)
        if magic != 0xBA55ED50:
            return
        at, end = header, min(len(image), header + size)
        while at + 64 <= end:
            kind, _, hsize, psize, packed = struct.unpack_from("<HHIQI", image, at)
            sm = struct.unpack_from("<I", image, at + 28)[0]
            flags = struct.unpack_from("<Q", image, at + 40)[0]
            full = struct.unpack_from("<Q", image, at + 56)[0]
            if hsize < 64 or psize == 0:
                break
            payload = image[at + hsize:at + hsize + psize]
            if flags & _FATBIN_ZSTD and 0 < packed <= psize and 0 < full <= 1 << 30:
                payload = zstandard.ZstdDecompressor().decompress(
                    payload[:packed], max_output_size=full)
            elif flags & _FATBIN_LZ4:
                payload = b""
            if payload and kind in (1, 2):
                yield "ptx" if kind == 1 else "elf", sm, payload
            at += hsize + psize
    except (struct.error, zstandard.ZstdError):
        return


def load_plan(path: Path, manifest, *, what: str = "plan") -> tuple:
    """Read the plan at ``path`` and its code objects (beside it), and check it against the
    range of ``manifest`` (``check_plan``): (plan, ((bytes, format), ...), (layout, ...)),
    the layout a launch's kernarg is packed by (a raw kernarg's: its own ``params``). A
    launch binding ``args`` whose code object records no layout cannot be packed: refused
    (PlanError); a raw kernarg is checked against the code object's layout where it has
    one."""
    from .codecheck import FORMATS, _check_host, _defined_functions, _elf, _near
    from .errors import ArchitectureMismatch, SymbolNotFound

    plan = Plan.read(path)
    code, layouts, packed = [], [], []
    images: dict[str, tuple[bytes, str]] = {}
    for i, launch in enumerate(plan.launches):
        if launch.data:   # a memset or a copy: no code object (check_plan checks it)
            code.append((b"", ""))
            layouts.append(None)
            packed.append(())
            continue
        if launch.code not in images:
            file = path.parent / launch.code
            image = _read_binary(file, f"{what} launch {i} code object")
            fmt = _format_of(image, f"{what} launch {i} code object", file)
            if launch.format is not None and launch.format != fmt:
                raise PlanError(f"launch {i} ({launch.kernel}): {launch.code} is {fmt}, the "
                                f"plan says {launch.format}", path=path)
            images[launch.code] = (image, fmt)
        image, fmt = images[launch.code]
        if fmt not in FORMATS.get(manifest.backend, (fmt,)):
            raise ArchitectureMismatch(f"{what} launch {i}: the {manifest.backend} backend "
                                       f"loads {' / '.join(FORMATS[manifest.backend])} code "
                                       f"objects, not {fmt}")
        if fmt == "elf-so":   # architecture and exported symbol (its layout: below)
            _check_host(image, launch.kernel, manifest.arch, f"{what} launch {i}")
        elif fmt == "cubin":   # the symbol (its layout: below)
            names = _defined_functions(_elf(image, what), ".symtab")
            if names is not None and launch.kernel not in names:
                raise SymbolNotFound(f"{what} launch {i} kernel {launch.kernel!r} is not in "
                                     f"the cubin" + _near(launch.kernel, names))
        elif fmt == "ptx":
            from .ptx import entries

            names = set(entries(image.decode("utf-8", errors="replace")))
            if names and launch.kernel not in names:
                raise SymbolNotFound(f"{what} launch {i} kernel {launch.kernel!r} is not an "
                                     ".entry of the PTX" + _near(launch.kernel, names))
        layout = plan_layout(image, fmt, launch.kernel, manifest.arch)
        if layout is None and not launch.raw:
            raise PlanError(f"launch {i} ({launch.kernel}): {launch.code} records no "
                            "parameter layout (a host object needs -g; a fatbin's members "
                            "may be compressed): the plan cannot be checked or packed",
                            path=path)
        code.append((image, fmt))
        layouts.append(layout)
        packed.append(tuple(launch.params) if launch.raw else layout)
    check_plan(plan, plan_target(manifest), layouts)
    return plan, tuple(code), tuple(packed)


def _inside(root: Path, rel: str, where: Path, field_name: str) -> Path:
    path = (root / rel).resolve()
    if rel.startswith("/") or ".." in Path(rel).parts or root.resolve() not in path.parents:
        raise HarnessError(f"path {rel!r} leaves the harness directory", path=where,
                           field=field_name)
    return path


#: Files a run writes beside the inputs (top level only); they are not inputs.
_LINE = re.compile(r"^([0-9a-f]{64})  (\S(?:.*\S)?)$")


def _entries(root: Path) -> tuple[list[str], list[str]]:
    """(regular files, everything else) under ``root``, as relative POSIX paths, outputs and
    the manifest left out. "Everything else": FIFOs, sockets, devices, symbolic links,
    empty directories — none belongs in a harness."""
    files, other = [], []
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        if d != root and not dirnames and not filenames:
            other.append(d.relative_to(root).as_posix() + "/")
        for name in filenames + [n for n in dirnames if (d / n).is_symlink()]:
            p = d / name
            rel = p.relative_to(root).as_posix()
            if d == root and (name in (*OUTPUTS, MANIFEST) or _transient(name)):
                continue
            mode = os.lstat(p).st_mode
            (files if stat.S_ISREG(mode) else other).append(rel)
    return sorted(files), sorted(other)


def _transient(name: str) -> bool:
    """A file a writer of the outputs holds for a moment (``_util``'s probe of the folder, or
    the temporary file an output is renamed from): not an input, whoever sees it."""
    return name.startswith(".kpair-probe-") or (
        name.endswith(".tmp") and any(name.startswith(f".{o}.") for o in OUTPUTS))


def write_manifest(root: Path) -> None:
    files, other = _entries(root)
    if other:
        raise HarnessError(f"{other[0]} is not a regular file; a harness holds only files",
                           path=root)
    lines = [f"{sha256((root / rel).read_bytes())}  {rel}\n" for rel in files]
    write_text_atomic(root / MANIFEST, "".join(lines))


def verify_manifest(root: Path) -> int:
    """Check MANIFEST.sha256 against the directory: every listed file present, regular and
    matching its sha256, listed once; nothing else there (besides a run's outputs). The error
    names the first entry that is off."""
    path = root / MANIFEST
    if not path.is_file():
        raise HarnessError(f"{MANIFEST} is missing: the inputs cannot be verified", path=root)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise HarnessError(f"cannot read ({e})", path=path) from None
    listed: dict[str, int] = {}
    targets: list[tuple[int, str, str, Path]] = []
    for n, line in enumerate(text.splitlines(), 1):
        m = _LINE.match(line)
        if not m:
            raise HarnessError(f"line {n} is not '<sha256>  <path>'", path=path)
        digest, rel = m.groups()
        if rel in listed:
            raise HarnessError(f"{rel} is listed twice (lines {listed[rel]} and {n})",
                               path=path, field=f"line {n}")
        listed[rel] = n
        target = _inside(root, rel, path, f"line {n}")
        if not target.exists() or not stat.S_ISREG(os.lstat(target).st_mode):
            raise HarnessError(f"{rel} is listed but is not a regular file here", path=path,
                               field=f"line {n}")
        targets.append((n, rel, digest, target))
    # Hashed on several threads (sha256 leaves the GIL); the first mismatch in order is named.
    got = threaded_map(lambda t: sha256(t[3].read_bytes()), targets)
    for (n, rel, digest, _), actual in zip(targets, got, strict=True):
        if actual != digest:
            raise HarnessError(f"{rel} does not match its sha256 (modified or corrupt)",
                               path=path, field=f"line {n}")
    files, other = _entries(root)
    for rel in other:
        raise HarnessError(f"{rel} is not a regular file; a harness holds only the files its "
                           "manifest lists", path=path)
    for rel in files:
        if rel not in listed:
            raise HarnessError(f"{rel} is not listed in the manifest (added after pairing?)",
                               path=path)
    return len(listed)


RUN_HARNESS = '''#!/usr/bin/env python3
"""Pair harness: {ref_kernel} (ref) vs {opt_kernel} (opt) on backend {backend}.

Generated by kpair {version}. `python run_harness.py` verifies every input against
MANIFEST.sha256, replays both kernels on the captured dispatch, judges opt under
capture/validation_policy.json, times both with the ABBA design and writes result.json.
`python run_harness.py --help` lists the options.
"""
import sys
from pathlib import Path

try:
    from kpair.cli.run import harness_main
except ImportError:
    sys.exit("kpair is not installed: pip install {install}")

sys.exit(harness_main(Path(__file__).resolve().parent, sys.argv[1:]))
'''


def _read_binary(path: str | os.PathLike, what: str) -> bytes:
    """A code object named by the caller; a missing, unreadable or empty one is a bad input
    (``InputError``, exit 3) naming the path."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{what} {p}: no such file")
    if not p.is_file():
        raise InputError(f"{what} {p}: not a regular file (a code object is one file)")
    try:
        image = p.read_bytes()
    except OSError as e:
        raise InputError(f"{what} {p}: cannot read ({e.strerror or e})") from None
    if not image:
        raise InputError(f"{what} {p}: the file is empty")
    return image


def _format_of(image: bytes, what: str, path: str | os.PathLike) -> str:
    try:
        return detect_format(image)
    except KpairError as e:
        raise InputError(f"{what} {path}: {e}") from None


def create_harness(snapshot_dir: str | os.PathLike, out: str | os.PathLike, *,
                   ref: str | os.PathLike | None = None, opt: str | os.PathLike | None = None,
                   ref_kernel: str | None = None, opt_kernel: str | None = None,
                   policy: Policy | str | os.PathLike | None = None,
                   opt_launch: dict | None = None, measure: dict | None = None,
                   plan: str | os.PathLike | None = None,
                   opt_capture: str | os.PathLike | None = None) -> Harness:
    """Pair ``opt`` (and ``ref``, by default the snapshot's own code object) with a snapshot.

    ``opt`` is a same-layout code object, a launch ``plan``, or ``opt_capture``: another
    range captured in the same process over the same memory, bound to this one
    (``kpair.bind``) into a plan that the harness stores with its code objects.

    Everything is checked before anything is written: the snapshot (every blob), the
    policy, the output directory (new or empty), and each code object against the snapshot
    (``codecheck``: format and architecture, the kernel symbol, the parameter layout where
    the binary records one) — a pair that cannot run is refused here, not at ``kpair run``.
    """
    snapshot_dir = Path(snapshot_dir)
    if not snapshot_dir.exists():
        raise InputError("no such snapshot directory", path=snapshot_dir)
    src = Snapshot.open(snapshot_dir)
    require_complete(src.manifest, snapshot_dir)  # before the (long) blob checks
    src.verify()
    out = Path(out)
    check_output_dir(out, empty=True)

    if sum(x is not None for x in (opt, plan, opt_capture)) != 1:
        raise UsageError("pair an opt code object, a launch plan (--plan) or a captured "
                         "candidate (--opt-capture), one of them")
    if opt_capture is not None:   # bound to a plan in a folder of its own, then as --plan
        if opt_kernel or opt_launch:
            raise UsageError("--opt-kernel/--opt-launch do not apply to a captured "
                             "candidate: its operations name their kernels and geometry")
        with tempfile.TemporaryDirectory(prefix="kpair-bind-") as tmp:
            return _create(src, out, ref=ref, ref_kernel=ref_kernel, policy=policy,
                           measure=measure, plan=bind_snapshot(src, opt_capture, Path(tmp)))
    return _create(src, out, ref=ref, opt=opt, ref_kernel=ref_kernel, opt_kernel=opt_kernel,
                   policy=policy, opt_launch=opt_launch, measure=measure, plan=plan)


def _create(src: Snapshot, out: Path, *, ref=None, opt=None, ref_kernel=None,
            opt_kernel=None, policy=None, opt_launch=None, measure=None,
            plan=None) -> Harness:
    """``create_harness`` on the opened, verified snapshot ``src``."""
    from .codecheck import check_kernel

    m = src.manifest
    if m.is_range and (ref or ref_kernel):
        raise UsageError("a range's ref is its captured operations: --ref/--ref-kernel pair "
                         "one dispatch only")
    if m.is_range and opt is not None:
        raise UsageError(f"a range of {len(m.operations)} operations is judged against a "
                         "launch plan (--plan opt.plan.json), not one same-layout --opt")
    if plan is not None and (opt_kernel or opt_launch):
        raise UsageError("--opt-kernel/--opt-launch do not apply to a plan: its launches "
                         "name their kernels and geometry")
    ref_image = _read_binary(ref, "--ref") if ref else src.code_object()
    ref_fmt = _format_of(ref_image, "--ref", ref) if ref else m.code.format
    ref_name = ref_kernel or m.code.kernel_name
    if ref:  # the captured code object ran this dispatch: only a given one is checked
        check_kernel(ref_image, ref_fmt, ref_name, m, "ref")
    plan_obj = None
    if plan is not None:   # checked against the range before anything is written
        plan_path = Path(plan)
        if not plan_path.is_file():
            raise InputError(f"--plan {plan_path}: no such file")
        plan_obj, plan_code, _ = load_plan(plan_path, m)
        k = next((i for i, x in enumerate(plan_obj.launches) if not x.data), None)
        if k is None:
            raise PlanError("a plan launches at least one kernel", path=plan_path)
        first = plan_obj.launches[k]
        opt_image, opt_fmt, opt_name = plan_code[k][0], plan_code[k][1], first.kernel
    else:
        opt_image = _read_binary(opt, "--opt")
        opt_fmt = _format_of(opt_image, "--opt", opt)
        opt_name = opt_kernel or ref_name
        check_kernel(opt_image, opt_fmt, opt_name, m, "opt")
    if not isinstance(policy, Policy):
        policy = load_policy(policy) if policy else Policy.byte_exact()
    policy.validate_against({r.name: r.size for r in m.regions})
    lint(policy, {r.name: src.post(i) for i, r in enumerate(m.regions)
                  if policy.for_region(r.name) and r.post_digest is None})   # else: at run
    if opt_launch:
        m.launch.override(opt_launch)  # validates before anything is written

    existed = out.exists()
    make_dirs(out)
    try:
        shutil.copytree(src.root, out / "capture")
        save_policy(policy, out / "capture" / "validation_policy.json")
        ref_side = SideSpec("ref" + EXTENSIONS[ref_fmt], ref_name, ref_fmt)
        write_bytes_atomic(out / ref_side.binary, ref_image, replace=False)
        if plan_obj is not None:   # the plan and its code objects, as laid out beside it
            rel = f"{PLAN_DIR}/{plan_path.name}"
            make_dirs(out / PLAN_DIR)
            write_bytes_atomic(out / rel, plan_path.read_bytes(), replace=False)
            for launch in plan_obj.launches:
                if launch.data:
                    continue
                dest = out / PLAN_DIR / launch.code
                if not dest.exists():
                    make_dirs(dest.parent)
                    write_bytes_atomic(dest, (plan_path.parent / launch.code).read_bytes(),
                                       replace=False)
            opt_side = SideSpec(f"{PLAN_DIR}/{first.code}", opt_name, opt_fmt)
        else:
            rel = ""
            opt_side = SideSpec("opt" + EXTENSIONS[opt_fmt], opt_name, opt_fmt, opt_launch or {})
            write_bytes_atomic(out / opt_side.binary, opt_image, replace=False)
        write(out / "harness.json", HarnessSpec(
            schema=SCHEMA, schema_version=SCHEMA_VERSION, backend=m.backend, arch=m.arch,
            snapshot="capture", policy="capture/validation_policy.json", ref=ref_side,
            opt=opt_side, measure=measure or {}, created_by=f"kpair {__version__}",
            plan=rel))
        install = "'kpair[cuda]'" if m.backend == "cuda" else "kpair"
        write_text_atomic(out / "run_harness.py", RUN_HARNESS.format(
            ref_kernel=ref_side.kernel, opt_kernel=opt_side.kernel, backend=m.backend,
            version=__version__, install=install), replace=False)
        write_manifest(out)
    except BaseException as e:
        # What this call made goes; an empty directory the caller had stays (empty).
        shutil.rmtree(out, ignore_errors=True)
        if existed:
            with contextlib.suppress(OSError):
                out.mkdir()
        if isinstance(e, OSError):   # shutil.Error (copytree) is one too
            raise write_failure(e, out) from None
        raise
    return Harness.open(out)


def bind_snapshot(src: Snapshot, capture: str | os.PathLike, directory: Path) -> Path:
    """Bind the captured candidate at ``capture`` to the range of ``src``
    (``kpair.bind.bind_capture``) and write its plan and code objects into ``directory``;
    the plan's path. The plan's note lists every binding."""
    from .bind import bind_capture

    capture = Path(capture)
    if not capture.exists():
        raise InputError("--opt-capture: no such snapshot directory", path=capture)
    cand = Snapshot.open(capture)
    require_complete(cand.manifest, capture)
    cand.verify()
    bound = bind_capture(src, cand)
    note = f"{bound.plan.note}: " + "; ".join(b.describe() for b in bound.bindings)
    return bound.__class__(bound.plan.replace(note=note), bound.code,
                           bound.bindings).write(directory)


def write_failure(e: OSError, out: Path) -> WriteFailed:
    """A failed write while making ``out`` as one line (exit 5): "no space left on device
    writing <path>" for a full disk, else the system's reason; ``copytree``'s list of
    failures (``shutil.Error``) is read for its first."""
    path, why, code = e.filename or out, e.strerror or str(e), e.errno
    if isinstance(e, shutil.Error) and e.args and isinstance(e.args[0], list) and e.args[0]:
        _, path, why = e.args[0][0]
        m = re.match(r"\[Errno (\d+)\] ([^:]*)", str(why))
        code, why = (int(m.group(1)), m.group(2)) if m else (None, str(why))
    if code in (errno.ENOSPC, errno.EDQUOT):
        return WriteFailed(f"no space left on device writing {path}; nothing was written")
    return WriteFailed(f"cannot write {path} ({why}); nothing was written")
