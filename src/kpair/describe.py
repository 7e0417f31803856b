"""Human and JSON summaries of snapshots and harnesses (``kpair inspect``).

``describe(path)`` returns both forms for a snapshot or a harness directory; a harness's last
result.json, if any, is read through ``kpair.result.Result`` and shown as its one-line verdict.
"""

from __future__ import annotations

from pathlib import Path

from ._util import human_bytes
from .amd.asm import SOURCE, disassemble
from .errors import FormatError, KpairError
from .formats import convert
from .harness import Harness
from .ptx import ref_ptx, sass
from .result import read_result
from .snapshot import Snapshot, describe_left_out, left_out
from .sol import SpeedOfLight, snapshot_traffic


def describe_snapshot(snap, verify: bool = True) -> tuple[dict, list[str]]:
    m = snap.manifest
    verified = snap.verify() if verify else None
    info = {"kind": "snapshot", "path": str(snap.root), **m.to_json(),
            "region_bytes": snap.region_bytes(), "stored_bytes": snap.stored_bytes(),
            "verified_bytes": verified}
    if not m.complete:
        info["omitted_regions"] = [o.to_json() for o in left_out(m)]
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
        f"  regions  {len(m.regions)}, {human_bytes(info['region_bytes'])} "
        f"(stored {human_bytes(info['stored_bytes'])} on disk: compressed or raw, "
        "deduplicated)",
    ]
    if m.is_range:   # the first operation is shown above; the range's whole sequence here
        lines.insert(2, f"  range    {len(m.operations)} operations: " + " ; ".join(
            op.label for op in m.operations) + "".join(
            f"; scratch {s.name} {human_bytes(s.size)}" for s in m.scratch_regions))
    for r in m.regions:
        changed = "written" if r.pre.sha256 != r.post.sha256 else "unchanged"
        changed += f" ({r.role})" if r.role else ""
        if r.regen is not None:   # stored as the operations that made it, not as bytes
            changed += ", made by " + " ; ".join(op.label for op in r.regen.ops)
        if r.post_digest is not None:   # no bytes: replay compares it by digest
            changed += ", post-state kept as a digest"
        lines.append(f"    {r.name:<16} {hex(r.address)}  {human_bytes(r.size):>10}  "
                     f"{r.dtype or '':<8} {changed}")
    missing = describe_left_out(m)
    if missing:
        lines.append(f"  INCOMPLETE: {missing[0]}")
        lines += [f"    {line}" for line in missing[1:]]
        lines.append("  replay, pair and run refuse it")
    if verify:
        lines.append(f"  verified {human_bytes(verified)} of blobs: sizes and sha256 match")
    return info, lines


def describe(path: Path, verify: bool = True) -> tuple[dict, str]:
    if (path / "harness.json").is_file():
        h = Harness.open(path, verify=verify, complete=False)
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


def _clip(text: str | None, limit: int) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return text[:limit] + f"\n... [{len(text) - limit} more characters]"


def operator_code(h, *, max_chars: int, work: Path | None = None) -> dict:
    """ref's code as text, at every level kpair can reach: the Triton source kept at capture,
    PTX, SASS (cuobjdump/nvdisasm), AMDGPU assembly (``kpair asm``); each with where it came
    from or why it is absent."""

    m = h.snapshot.manifest
    image, fmt = h.binary(h.ref), h.ref.format
    code: dict = {"kernel": h.ref.kernel, "format": fmt, "arch": m.arch,
                  "code_object_bytes": len(image)}
    triton = (m.provenance or {}).get("triton") or {}
    if isinstance(triton.get("source"), str):
        code["triton_source"] = _clip(triton["source"], max_chars)
        code["triton_config"] = {k: v for k, v in (triton.get("metadata") or {}).items()
                                 if k in ("num_warps", "num_stages", "maxnreg", "shared")}
        code["triton_constants"] = triton.get("constants")
    if h.backend == "cuda":
        text, how = ref_ptx(image, fmt, m.provenance)
        code["ptx"], code["ptx_from"] = _clip(text, max_chars), how
        text, how = sass(image, fmt)
        code["sass"], code["sass_from"] = _clip(text, max_chars), how
    elif h.backend == "hip" and work is not None:
        try:
            ref = work / "ref-asm" / "ref.co"
            ref.parent.mkdir(parents=True, exist_ok=True)
            ref.write_bytes(image)
            disassemble(ref, work / "ref-asm")
            text = (work / "ref-asm" / SOURCE).read_text()
            code["amdgpu_asm"], code["amdgpu_asm_from"] = _clip(text, max_chars), "kpair asm"
        except KpairError as e:
            code["amdgpu_asm"], code["amdgpu_asm_from"] = None, str(e)
    elif h.backend == "host":
        src = (m.provenance or {}).get("source")
        if isinstance(src, dict) and isinstance(src.get("text"), str):
            code["c_source"] = _clip(src["text"], max_chars)
    return code


def describe_operator(h, *, code: bool = True, max_chars: int = 200_000,
                      ref_s: float | None = None, sol: dict | None = None,
                      work: Path | None = None) -> dict:
    """One operator (a harness) for an agent: launch, kernarg layout, regions with sizes and
    what ref reads and writes, policy, ref's code, ref's measured time, speed of light."""

    m = h.snapshot.manifest
    t = snapshot_traffic(h.snapshot)
    roles = {r.name: r for r in t.regions}
    out = {
        "backend": h.backend, "arch": m.arch, "complete": m.complete,
        "kernel": h.ref.kernel,
        "launch": {"grid": list(m.launch.grid), "block": list(m.launch.block),
                   "dynamic_shared_bytes": m.launch.dynamic_shared_bytes,
                   "attributes": [a.name for a in m.launch.attributes]},
        "kernarg": {"bytes": m.kernarg.blob.size,
                    "params": [{"name": p.name, "offset": p.offset, "size": p.size,
                                "kind": p.kind} for p in m.kernarg.params]},
        "regions": [{"name": r.name, "address": hex(r.address), "size": r.size,
                     "dtype": r.dtype, "ref": "reads" if roles[r.name].role == "read"
                     else "writes", "bytes_written": roles[r.name].bytes
                     if roles[r.name].role == "written" else 0} for r in m.regions],
        "must_move_bytes": {"read": t.read_bytes, "written": t.written_bytes,
                            "total": t.total},
        "policy": h.policy.to_json(),
        "policy_text": [h.policy.mode] + [tol.describe() for tol in h.policy.tolerances],
        "ref_time_us": round(ref_s * 1e6, 3) if ref_s else None,
        "ref_time_note": "median of ref's timed launches in the session's measurement; "
                         "absolute times drift: compare ratios",
        "sol": sol,
    }
    if sol:
        out["sol_text"] = convert(sol, SpeedOfLight).summary()
    if code:
        out["code"] = operator_code(h, max_chars=max_chars, work=work)
    return out
