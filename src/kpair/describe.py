"""Human and JSON summaries of snapshots and harnesses (``kpair inspect``).

``describe(path)`` returns both forms for a snapshot or a harness directory; a harness's last
result.json, if any, is read through ``kpair.result.Result`` and shown as its one-line verdict.
"""

from __future__ import annotations

from pathlib import Path

from ._util import human_bytes
from .errors import FormatError


def describe_snapshot(snap, verify: bool = True) -> tuple[dict, list[str]]:
    m = snap.manifest
    verified = snap.verify() if verify else None
    info = {"kind": "snapshot", "path": str(snap.root), **m.to_json(),
            "stored_bytes": snap.stored_bytes(), "verified_bytes": verified}
    lines = [
        f"snapshot {snap.root}  (schema v{m.schema_version}, "
        f"{'complete' if m.complete else 'INCOMPLETE'})",
        f"  kernel   {m.code.kernel_name}  [{m.code.format}, {m.backend}/{m.arch}]",
        f"  launch   grid {tuple(m.launch.grid)} block {tuple(m.launch.block)} "
        f"dyn smem {m.launch.dynamic_shared_bytes} B"
        + (f", {len(m.launch.attributes)} attribute(s): "
           + ", ".join(a.name for a in m.launch.attributes) if m.launch.attributes else ""),
        f"  kernarg  {m.kernarg.blob.size} B, {len(m.kernarg.params)} params: "
        + ", ".join(f"{p.name or '?'}@{p.offset}:{p.kind}" for p in m.kernarg.params),
        f"  regions  {len(m.regions)}, {human_bytes(sum(r.size for r in m.regions))} "
        f"(stored {human_bytes(info['stored_bytes'])} compressed, deduplicated)",
    ]
    for r in m.regions:
        changed = "written" if r.pre.sha256 != r.post.sha256 else "unchanged"
        lines.append(f"    {r.name:<16} {hex(r.address)}  {human_bytes(r.size):>10}  "
                     f"{r.dtype or '':<8} {changed}")
    if verify:
        lines.append(f"  verified {human_bytes(verified)} of blobs: sizes and sha256 match")
    return info, lines


def describe(path: Path, verify: bool = True) -> tuple[dict, str]:
    from .harness import Harness
    from .snapshot import Snapshot

    if (path / "harness.json").is_file():
        h = Harness.open(path, verify=verify)
        snap_info, lines = describe_snapshot(h.snapshot, verify)
        info = {"kind": "harness", "path": str(path), "backend": h.backend,
                "ref": h.ref.to_json(), "opt": h.opt.to_json(), "policy": h.policy.to_json(),
                "snapshot": snap_info}
        head = [f"harness {path}",
                f"  ref      {h.ref.kernel} in {h.ref.binary}",
                f"  opt      {h.opt.kernel} in {h.opt.binary}"
                + (f" (launch override {h.opt.launch_override})"
                   if h.opt.launch_override else ""),
                f"  policy   {h.policy.mode}"]
        head += [f"    {t.describe()}" for t in h.policy.tolerances]
        if verify:
            head.append("  inputs   every file matches MANIFEST.sha256")
        from .result import read_result

        try:
            last = read_result(path / "result.json")
        except FormatError as e:  # an output, not an input: describe the harness anyway
            head.append(f"  last run unreadable: {e}")
        else:
            if last is not None:
                head.append(f"  last run {last.summary()}")
        return info, "\n".join(head + lines)
    if (path / "snapshot.json").is_file():
        info, lines = describe_snapshot(Snapshot.open(path), verify)
        return info, "\n".join(lines)
    raise FormatError("neither a snapshot (snapshot.json) nor a harness (harness.json)",
                      path=path)
