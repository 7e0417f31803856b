"""Pair harnesses: a snapshot, a ref and an opt binary, a policy, and a manifest of hashes.

Layout (``docs/format.md``)::

    <harness>/harness.json                 what to run: backend, binaries, kernel names, options
    <harness>/capture/                     the snapshot (snapshot.json + blobs/)
    <harness>/capture/validation_policy.json
    <harness>/ref.<ext>, <harness>/opt.<ext>   code objects (.so, .cubin, .fatbin, .ptx, .co)
    <harness>/MANIFEST.sha256              sha256 of every input file above (sha256sum format)
    <harness>/run_harness.py               ``python run_harness.py`` writes result.json

``create_harness`` builds one from a snapshot directory; ``Harness.open`` reads one back and
verifies every listed file against the manifest before anything runs.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from . import __version__
from ._util import read_versioned_json
from .errors import HarnessError, UsageError
from .policy import Policy, load_policy, save_policy
from .snapshot import Launch, Snapshot, detect_format, sha256, write_json_atomic

SCHEMA = "kpair.harness"
SCHEMA_VERSION = 1
MANIFEST = "MANIFEST.sha256"
EXTENSIONS = {"elf-so": ".so", "cubin": ".cubin", "fatbin": ".fatbin", "ptx": ".ptx",
              "hsaco": ".co"}
OUTPUTS = ("result.json", "samples.npz", "worker.log")

@dataclass(frozen=True)
class Side:
    """One of the two kernels of a pair: its binary file, kernel name, launch override."""

    binary: str
    kernel: str
    format: str
    launch_override: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        out = {"binary": self.binary, "kernel": self.kernel, "format": self.format}
        if self.launch_override:
            out["launch_override"] = self.launch_override
        return out


@dataclass(frozen=True)
class Harness:
    root: Path
    backend: str
    ref: Side
    opt: Side
    snapshot: Snapshot
    policy: Policy
    info: dict

    @classmethod
    def open(cls, root: str | os.PathLike, *, verify: bool = True) -> Harness:
        root = Path(root)
        spec_path = root / "harness.json"
        if not spec_path.is_file():
            raise HarnessError("no harness.json here: not a kpair harness", path=root)
        if verify:
            verify_manifest(root)
        spec = read_versioned_json(spec_path, SCHEMA, SCHEMA_VERSION, HarnessError)
        sides = {}
        for role in ("ref", "opt"):
            s = spec.get(role)
            if not isinstance(s, dict) or not all(isinstance(s.get(k), str)
                                                  for k in ("binary", "kernel", "format")):
                raise HarnessError("expected {binary, kernel, format} strings", path=spec_path,
                                   field=role)
            _inside(root, s["binary"], spec_path, f"{role}.binary")
            sides[role] = Side(s["binary"], s["kernel"], s["format"],
                               s.get("launch_override") or {})
        for key in ("snapshot", "policy"):
            if not isinstance(spec.get(key), str):
                raise HarnessError("missing", path=spec_path, field=key)
            _inside(root, spec[key], spec_path, key)
        snapshot = Snapshot.open(root / spec["snapshot"])
        policy = load_policy(root / spec["policy"])
        policy.validate_against({r.name: r.size for r in snapshot.manifest.regions})
        try:
            snapshot.manifest.launch.override(sides["opt"].launch_override)
        except Exception as e:  # noqa: BLE001 - re-raised with the harness file named
            raise HarnessError(str(e), path=spec_path, field="opt.launch_override") from None
        return cls(root, spec.get("backend", snapshot.manifest.backend), sides["ref"],
                   sides["opt"], snapshot, policy, spec)

    def binary(self, side: Side) -> bytes:
        return (self.root / side.binary).read_bytes()

    def launch(self, side: Side) -> Launch:
        return self.snapshot.manifest.launch.override(side.launch_override)

    def inputs_digest(self) -> str:
        return sha256((self.root / MANIFEST).read_bytes())


def _inside(root: Path, rel: str, where: Path, field_name: str) -> Path:
    path = (root / rel).resolve()
    if rel.startswith("/") or ".." in Path(rel).parts or root.resolve() not in path.parents:
        raise HarnessError(f"path {rel!r} leaves the harness directory", path=where,
                           field=field_name)
    return path


def _input_files(root: Path) -> list[Path]:
    skip = set(OUTPUTS) | {MANIFEST}
    return sorted(p for p in root.rglob("*")
                  if p.is_file() and p.name not in skip and "__pycache__" not in p.parts
                  and not p.name.startswith("."))


def write_manifest(root: Path) -> None:
    lines = [f"{sha256(p.read_bytes())}  {p.relative_to(root).as_posix()}\n"
             for p in _input_files(root)]
    tmp = root / f".{MANIFEST}.tmp"
    tmp.write_text("".join(lines))
    os.replace(tmp, root / MANIFEST)


def verify_manifest(root: Path) -> int:
    """Check every file listed in MANIFEST.sha256; name the first one that is off."""
    path = root / MANIFEST
    if not path.is_file():
        raise HarnessError(f"{MANIFEST} is missing: the inputs cannot be verified", path=root)
    listed = set()
    for n, line in enumerate(path.read_text().splitlines(), 1):
        digest, _, rel = line.partition("  ")
        if len(digest) != 64 or not rel:
            raise HarnessError(f"line {n} is not '<sha256>  <path>'", path=path)
        target = _inside(root, rel, path, f"line {n}")
        if not target.is_file():
            raise HarnessError(f"{rel} is listed but missing", path=path, field=f"line {n}")
        if sha256(target.read_bytes()) != digest:
            raise HarnessError(f"{rel} does not match its sha256 (modified or corrupt)",
                               path=path, field=f"line {n}")
        listed.add(rel)
    for p in _input_files(root):
        rel = p.relative_to(root).as_posix()
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


def create_harness(snapshot_dir: str | os.PathLike, out: str | os.PathLike, *,
                   ref: str | os.PathLike | None = None, opt: str | os.PathLike,
                   ref_kernel: str | None = None, opt_kernel: str | None = None,
                   policy: Policy | str | os.PathLike | None = None,
                   opt_launch: dict | None = None, measure: dict | None = None) -> Harness:
    """Pair ``opt`` (and ``ref``, by default the snapshot's own code object) with a snapshot."""
    src = Snapshot.open(snapshot_dir)
    src.verify()
    m = src.manifest
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out} exists and is not empty; refusing to overwrite it")

    ref_image = Path(ref).read_bytes() if ref else src.code_object()
    opt_image = Path(opt).read_bytes()
    ref_fmt = detect_format(ref_image) if ref else m.code.format
    opt_fmt = detect_format(opt_image)
    if not isinstance(policy, Policy):
        policy = load_policy(policy) if policy else Policy.byte_exact()
    policy.validate_against({r.name: r.size for r in m.regions})
    if opt_launch:
        m.launch.override(opt_launch)  # validates before anything is written

    out.mkdir(parents=True, exist_ok=True)
    try:
        shutil.copytree(src.root, out / "capture")
        save_policy(policy, out / "capture" / "validation_policy.json")
        ref_side = Side("ref" + EXTENSIONS[ref_fmt], ref_kernel or m.code.kernel_name, ref_fmt)
        opt_side = Side("opt" + EXTENSIONS[opt_fmt], opt_kernel or ref_side.kernel, opt_fmt,
                        opt_launch or {})
        (out / ref_side.binary).write_bytes(ref_image)
        (out / opt_side.binary).write_bytes(opt_image)
        spec = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "backend": m.backend,
                "arch": m.arch, "snapshot": "capture",
                "policy": "capture/validation_policy.json",
                "ref": ref_side.to_json(), "opt": opt_side.to_json(),
                "measure": measure or {}, "created_by": f"kpair {__version__}"}
        write_json_atomic(out / "harness.json", spec)
        install = "'kpair[cuda]'" if m.backend == "cuda" else "kpair"
        (out / "run_harness.py").write_text(RUN_HARNESS.format(
            ref_kernel=ref_side.kernel, opt_kernel=opt_side.kernel, backend=m.backend,
            version=__version__, install=install))
        write_manifest(out)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    return Harness.open(out)
