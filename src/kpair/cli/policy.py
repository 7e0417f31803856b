"""``kpair policy suggest``: a tolerance policy from the observed spread of repeated ref runs.

When the baseline is nondeterministic (atomics, unordered reductions), a byte-exact verdict
cannot apply and ``kpair run`` fails with "baseline nondeterministic". This command replays
ref ``--runs`` times on the harness's captured dispatch and declares, for every region whose
bytes vary, one range covering them with a criterion ``--margin`` times wider than the
observed spread (``allclose``; ``scalar_rtol`` for a single element). It also proposes
mutations (differential runs) for float regions ref only reads, unless some are declared.
The harness itself is sealed by its manifest: pair again with ``--policy``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .. import progress
from ..errors import UsageError
from ..policy import FLOAT_DTYPES, Policy, Tolerance, decode, dtype_size, save_policy
from .base import Command


def suggest_policy(policy: Policy, runs: Sequence[dict[str, bytes]], *,
                   hints: dict[str, str], pre: dict[str, bytes], margin: float = 4.0
                   ) -> tuple[Policy, list[str]]:
    """A policy whose tolerances cover what ``runs`` of ref (identical inputs) disagree on,
    ``margin`` times wider than observed; mutations for float regions ref only reads.

    Tolerances of other regions and declared mutations are kept. Returns (policy, notes)."""
    from ..dtypes import EPS
    from ..policy import Mutation

    notes, new = [], []
    for name in runs[0]:
        x = np.stack([np.frombuffer(r[name], np.uint8) for r in runs])
        differ = np.flatnonzero((x != x[0]).any(axis=0))
        if not differ.size:
            continue
        dtype = hints.get(name)
        if dtype not in FLOAT_DTYPES:
            dtype = "float32" if len(runs[0][name]) % 4 == 0 else "float16"
            notes.append(f"region {name}: element type unknown, read as {dtype}: check it")
        size = dtype_size(dtype)
        start = int(differ[0]) // size * size
        end = min(-(-(int(differ[-1]) + 1) // size) * size, len(runs[0][name]) // size * size)
        vals = np.stack([decode(np.frombuffer(r[name], np.uint8)[start:end], dtype)
                         for r in runs])
        ref0, dev = vals[0], np.abs(vals - vals[0]).max(axis=0)
        scale = float(np.abs(ref0[np.isfinite(ref0)]).max(initial=0.0))
        small = np.abs(ref0) < 1e-3 * scale
        with np.errstate(all="ignore"):
            rtol = float(np.nan_to_num(dev[~small] / np.abs(ref0[~small])).max(initial=0.0))
        atol = float(np.nan_to_num(dev[small]).max(initial=0.0))
        rtol, atol = max(margin * rtol, 4 * EPS[dtype]), margin * atol
        if end - start == size:
            tol = Tolerance(name, start, end, dtype, "scalar_rtol", rtol=rtol,
                            **({"atol": atol} if atol else {}))
        else:
            tol = Tolerance(name, start, end, dtype, "allclose", atol=atol, rtol=rtol)
        new.append(tol)
        notes.append(f"region {name}: {int(differ.size)} byte(s) vary over {len(runs)} ref runs; "
                     f"{tol.describe()}")
    touched = {t.region for t in new}
    tols = tuple(t for t in policy.tolerances if t.region not in touched) + tuple(new)
    mutations = policy.mutations
    if not mutations:
        inputs = [n for n in pre if hints.get(n) in FLOAT_DTYPES
                  and all(r[n] == pre[n] for r in runs)]
        mutations = tuple(Mutation(n, hints[n], "permute", 2) for n in inputs)
        if inputs:
            notes.append("mutations: permute " + ", ".join(inputs) + " (float regions ref "
                         "only reads) in 2 differential runs")
    note = policy.note or "written by kpair policy suggest from the spread of repeated ref runs"
    return Policy(tols, note, mutations, policy.max_bias), notes


def ref_runs(harness: Path, runs: int, device_options: dict | None = None
             ) -> tuple[list[dict[str, bytes]], dict[str, bytes], dict[str, str], Policy]:
    """Replay the harness's ref ``runs`` times in this process: (posts, pre, hints, policy)."""
    from ..backends import open_device
    from ..harness import Harness
    from ..replay import Replay

    h = Harness.open(harness)
    with open_device(h.backend, **(device_options or {})) as device:
        replay = Replay(device, h.snapshot)
        ref = device.load(h.binary(h.ref), h.ref.kernel, fmt=h.ref.format)
        replay.check_abi(ref, "ref")
        posts = []
        for i in range(runs):
            progress.stage(f"ref run {i + 1}/{runs}")
            posts.append(replay.run(ref, h.launch(h.ref)))
        pre = dict(replay.pre)
    hints = {r.name: r.dtype for r in h.snapshot.manifest.regions if r.dtype}
    return posts, pre, hints, h.policy


class PolicyCmd(Command):
    """Validation-policy tools. ``suggest``: a tolerance policy from the observed spread of
    repeated ref runs (for a nondeterministic baseline), to pair again with."""

    name = "policy"
    help = "suggest a validation policy from repeated ref runs"

    @classmethod
    def add_arguments(cls, p: argparse.ArgumentParser) -> None:
        sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
        s = sub.add_parser("suggest", help="write a tolerance policy from the spread of "
                           "repeated ref runs", description=__doc__)
        s.add_argument("harness", type=Path, help="pair harness directory")
        s.add_argument("-o", "--out", type=Path, help="policy file (default: print it); an "
                       "existing file is not replaced without --force")
        s.add_argument("--force", action="store_true", help="replace an existing --out file")
        s.add_argument("--json", action="store_true",
                       help="print one JSON document: the policy and the notes")
        s.add_argument("--runs", type=int, default=8, help="ref runs (default 8)")
        s.add_argument("--margin", type=float, default=4.0,
                       help="tolerance = margin x observed spread (default 4)")

    def run(self, args: argparse.Namespace) -> int:
        from .._util import check_output
        from .run import check_harness_dir

        if args.runs < 2 or not args.margin >= 1:
            raise UsageError("need --runs >= 2 and --margin >= 1")
        check_harness_dir(args.harness)
        if args.out:  # refused before ref runs, not after
            check_output(args.out, replace=args.force)
        posts, pre, hints, current = ref_runs(args.harness, args.runs)
        policy, notes = suggest_policy(current, posts, hints=hints, pre=pre,
                                       margin=args.margin)
        notes = notes or ["ref is deterministic over these runs: no tolerance needed"]
        for line in notes:
            print(f"kpair policy: {line}", file=sys.stderr)
        if args.out:
            save_policy(policy, args.out, replace=args.force)
            print(f"policy written to {args.out}; pair again with --policy {args.out}",
                  file=sys.stderr)
        if args.json:
            print(json.dumps({"policy": policy.to_json(), "notes": notes,
                              "out": str(args.out) if args.out else None}, indent=1))
        elif not args.out:
            print(json.dumps(policy.to_json(), indent=1))
        return 0
