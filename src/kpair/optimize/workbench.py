"""The workbench ``kpair optimize`` and ``kpair mcp`` share: one implementation each of

- **operator discovery**: which snapshots and harnesses are operators to work on, their
  release-safe names and levels (``Operator``, ``operators_from_capture``,
  ``operator_from_snapshot``, ``operator_from_harness``, ``find_operators`` for a work
  directory);
- **the baseline harness** candidates are judged on: a given harness, or an A/A pair of the
  snapshot's own code object made once (``base_harness``), and the harness a chosen
  candidate is published with (``pair_harness``);
- **the quick measurement**: every trust check, few ABBA blocks, a short time cap, no
  identical-binary control (``quick_options``), the measurement the search prunes with and
  an agent's submissions are judged with by default;
- **candidate building**: a built code object as a ``kpair.candidate.Candidate`` (``built``;
  a Triton config compiled with its launch: ``strategies.triton.build_config``).

A candidate is the one ``Candidate`` type from proposal to attempt; both judge it with
``kpair.session.Session.judge``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from ..bind import identity_plan
from ..candidate import Candidate
from ..errors import KpairError
from ..harness import EXTENSIONS, Harness, create_harness
from ..options import RunOptions
from ..release import INDEX
from ..release.store import LOCK
from ..snapshot import Snapshot, detect_format

# --------------------------------------------------------------------------- operators


@dataclass(frozen=True)
class Operator:
    """One thing to optimize: a snapshot (or an existing harness) and its release key."""

    level: int
    name: str
    snapshot: Path | None = None
    harness: Path | None = None

    @property
    def key(self) -> str:
        return f"level{self.level}/{self.name}"

    @property
    def kind(self) -> str:
        return "harness" if self.harness is not None else "snapshot"

    @property
    def path(self) -> Path:
        return self.harness if self.harness is not None else self.snapshot


def operator_name(text: str) -> str:
    """A release-safe operator name from a snapshot, kernel or directory name."""
    name = re.sub(r"[^A-Za-z0-9_.+-]+", "_", text).strip("._-+") or "kernel"
    return name[:120]


def level_of(kernel: str) -> int:
    """Level 2 for fused kernels (Inductor's ``triton_*_fused_*``), level 1 otherwise."""
    return 2 if "fused" in kernel.lower() else 1


def operator_from_snapshot(path: str | os.PathLike, *, name: str | None = None) -> Operator:
    """The operator of a snapshot: level 2 for a range of several operations (a fused
    sequence, as KernelBench's Level 2) or a fused kernel, else level 1."""
    path = Path(path)
    m = Snapshot.open(path).manifest
    level = 2 if m.is_range and len(m.operations) > 1 else level_of(m.code.kernel_name)
    return Operator(level, name or operator_name(path.name), snapshot=path)


def captured_dispatches(capture: Path) -> list[dict]:
    """The rows of a ``kpair capture`` directory's capture.json that were captured (status
    ``captured``, a snapshot), in its order."""
    try:
        summary = json.loads((capture / "capture.json").read_text())
        rows = summary.get("dispatches", [])
    except (OSError, ValueError, AttributeError) as e:
        raise KpairError(f"{capture}: not a readable kpair capture ({e})") from None
    return [d for d in rows if isinstance(d, dict) and d.get("status") == "captured"
            and d.get("snapshot")]


def finished_capture(out: Path) -> bool:
    """Whether ``out`` holds a capture that ran to its end (capture.json with the program's
    exit status): a resumed run reuses it."""
    try:
        return json.loads((out / "capture.json").read_text()).get("exit_status") is not None
    except (OSError, ValueError, AttributeError):
        return False


def operators_from_capture(capture: Path) -> list[Operator]:
    """Every captured dispatch of a ``kpair capture`` directory (capture.json)."""
    return [operator_from_snapshot(capture / d["snapshot"])
            for d in captured_dispatches(capture)]


def operator_from_harness(path: str | os.PathLike, *, level: int | None = None,
                          name: str | None = None, verify: bool = True) -> Operator:
    """The operator of an existing harness (checked whole unless ``verify`` is False)."""
    path = Path(path)
    h = Harness.open(path, verify=verify)
    return Operator(level or level_of(h.ref.kernel), name or operator_name(path.name),
                    harness=path)


#: Directory names a work directory's walk never enters.
SKIP = {"mcp", "evaluations", ".git", "__pycache__", "blobs"}


def kpair_output(d: Path, dirnames: list[str], filenames: list[str]) -> bool:
    """Whether ``d`` is something kpair wrote whose harnesses are not operators: a release
    (its ``index.json`` or writer lock; its harnesses pair published winners) or one
    operator's work directory of ``kpair optimize`` (``captured.bin`` beside its A/A
    ``base/`` and the ``search/`` candidates)."""

    if LOCK in filenames:
        return True
    if INDEX in filenames:
        try:
            with open(d / INDEX, "rb") as f:
                head = f.read(4096)
        except OSError:
            return False
        if b"kpair.release_index" in head:
            return True
    return CAPTURED in filenames and "base" in dirnames


def find_operators(root: Path) -> dict[str, Operator]:
    """name -> Operator for every snapshot and harness under ``root`` that is an operator:
    not inside a release or another of kpair's outputs (``kpair_output``), whose harnesses
    only repeat operators (or candidates) found elsewhere; a harness's own ``capture/`` is
    part of it. Names come from the path under ``root``; an operator that cannot be read is
    level 1 here (reading it says why)."""
    found: dict[str, Operator] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        if d != root and kpair_output(d, dirnames, filenames):
            dirnames[:] = []
            continue
        dirnames[:] = sorted(n for n in dirnames if n not in SKIP and not n.startswith("."))
        rel = d.relative_to(root).as_posix()
        name = operator_name(rel if rel != "." else d.name)
        if "harness.json" in filenames:
            dirnames[:] = []  # its capture/ is part of it
            found[name] = _found(d, name, "harness")
        elif "snapshot.json" in filenames:
            found[name] = _found(d, name, "snapshot")
    return found


def _found(path: Path, name: str, kind: str) -> Operator:
    """The operator of a harness or snapshot found in a walk; one that cannot be read is
    level 1 here (opening it says why)."""
    try:
        if kind == "harness":
            return operator_from_harness(path, name=name, verify=False)
        return operator_from_snapshot(path, name=name)
    except (KpairError, OSError):
        return Operator(1, name, **{kind: path})


# --------------------------------------------------------------------------- harnesses

#: The snapshot's own code object, kept beside the A/A base harness made from it.
CAPTURED = "captured.bin"


def base_harness(op: Operator, work: Path, *, policy: Path | None = None) -> Harness:
    """The harness candidates are judged on: the operator's own, or an A/A pair of the
    snapshot's captured code object (a range: of its operations as a launch plan,
    ``kpair.bind.identity_plan``, kept in ``WORK/base-plan``) — ``WORK/base``, made once and
    reused; one that no longer opens is made again. A candidate plan's scratch buffers need
    not be declared here: the judging session places them (``kpair.pipeline``)."""
    if op.harness is not None:
        return Harness.open(op.harness)
    base = work / "base"
    if (base / "harness.json").is_file():
        try:
            return Harness.open(base)
        except KpairError:
            pass
    if base.exists():
        shutil.rmtree(base)
    work.mkdir(parents=True, exist_ok=True)
    snap = Snapshot.open(op.snapshot)
    if snap.manifest.is_range:   # A/A: ref's own operations as a plan on its regions
        aa = work / "base-plan"
        if aa.exists():
            shutil.rmtree(aa)
        return create_harness(op.snapshot, base, plan=identity_plan(snap).write(aa),
                              policy=policy)
    image = work / CAPTURED
    image.write_bytes(snap.code_object())
    return create_harness(op.snapshot, base, opt=image, policy=policy)


def pair_harness(base: Harness, winner: Candidate, out: Path) -> Harness:
    """``out``: the harness of base's ref and ``winner`` (its ``binary``, kernel and launch;
    or, format ``plan``, its opt.plan.json) on base's snapshot, policy and measure settings
    — what ``release add`` publishes."""
    if out.exists():
        shutil.rmtree(out)
    spec = base.spec
    # A range's ref is its captured operations; a launch plan names its own kernels.
    ref = {} if base.snapshot.manifest.is_range else \
        {"ref": base.root / spec.ref.binary, "ref_kernel": spec.ref.kernel}
    opt = {"plan": winner.binary} if winner.format == "plan" else \
        {"opt": winner.binary, "opt_kernel": winner.kernel,
         "opt_launch": winner.launch_override or None}
    return create_harness(base.root / spec.snapshot, out, policy=base.root / spec.policy,
                          measure=dict(spec.measure) or None, **ref, **opt)


# --------------------------------------------------------------------------- measuring


def quick_options(full: RunOptions, *, max_blocks: int, time_cap_s: float,
                  replicates: int = 1, min_blocks: int | None = None) -> RunOptions:
    """The quick measurement beside ``full``: the same checks, device, placement, cache,
    seed and timeout; at most ``max_blocks`` ABBA blocks (at least ``min_blocks``, by
    default 4), ``time_cap_s`` seconds, ``replicates`` replicates, no identical-binary
    control, no relative-width stop."""
    return replace(full, replicates=replicates,
                   min_blocks=min(4, max_blocks) if min_blocks is None else min_blocks,
                   max_blocks=max_blocks, time_cap_s=time_cap_s, rel_ci=None,
                   control=False, aa=False)


# --------------------------------------------------------------------------- building


def built(code: Path | bytes, kernel: str, *, label: str = "", **provenance) -> Candidate:
    """A built candidate: the code object (a file, or its bytes), its format, the kernel in
    it; ``provenance``: any other ``Candidate`` field (launch_override, strategy, source,
    build, params, reorders_fp)."""
    if isinstance(code, bytes):
        image, path = code, None
    else:
        image, path = Path(code).read_bytes(), Path(code)
    try:
        fmt = detect_format(image)
    except KpairError:
        fmt = ""  # not a code object kpair knows: judging it says so (stage load)
    return Candidate(image, kernel, fmt, label=label, binary=path, **provenance)


def suffix(candidate: Candidate) -> str:
    """The file suffix of the candidate's code object (``.cubin``, ``.so``, ...)."""
    return EXTENSIONS.get(candidate.format, ".bin")


__all__ = ["CAPTURED", "Operator", "SKIP", "base_harness", "built", "captured_dispatches",
           "find_operators", "finished_capture", "kpair_output", "level_of",
           "operator_from_harness", "operator_from_snapshot",
           "operator_name", "operators_from_capture", "pair_harness", "quick_options",
           "suffix"]
