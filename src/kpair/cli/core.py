"""``kpair pair`` and ``kpair inspect``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .base import Command, integer, number, parse_launch


class Pair(Command):
    """Create a pair harness from a snapshot, a baseline (ref) and an optimized (opt) binary."""

    name = "pair"
    help = "create a pair harness"

    @classmethod
    def add_arguments(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("snapshot", type=Path, help="snapshot directory")
        p.add_argument("--opt", type=Path, help="optimized code object (same layout as ref)")
        p.add_argument("--plan", type=Path,
                       help="launch plan (opt.plan.json; its code objects beside it) instead "
                       "of --opt: launches with their own signatures, checked against the "
                       "range before anything is written")
        p.add_argument("--opt-capture", type=Path, metavar="SNAP2",
                       help="instead of --opt/--plan: another range captured in the same "
                       "process over the same memory (e.g. the torch.compile forward), bound "
                       "to this one region by region into a plan (unbound regions: exit 4)")
        p.add_argument("--ref", type=Path,
                       help="baseline code object (default: the captured one)")
        p.add_argument("--ref-kernel", help="kernel name in ref (default: the captured name)")
        p.add_argument("--opt-kernel", help="kernel name in opt (default: ref's)")
        p.add_argument("--policy", type=Path,
                       help="validation_policy.json (default: byte-exact)")
        p.add_argument("--propose-policy", action="store_true",
                       help="instead of --policy's tolerances: run ref and opt on the captured "
                       "input and on mutated inputs, and write the tightest allclose policy "
                       "every run passes with a margin of 4 (regions that never differ stay "
                       "byte-exact); refused (exit 4) over the ceiling, naming the region")
        p.add_argument("--max-atol", type=number(0, 1e6, low_open=False),
                       metavar="A", help="--propose-policy's ceiling on atol (default 1e-2, "
                       "KernelBench's)")
        p.add_argument("--max-rtol", type=number(0, 1e6, low_open=False),
                       metavar="R", help="--propose-policy's ceiling on rtol (default 1e-2)")
        p.add_argument("--propose-runs", type=integer(1, 64), metavar="N",
                       help="--propose-policy's mutated inputs, 1 to 64 (default 8)")
        p.add_argument("--opt-launch", help='JSON launch override for opt, e.g. '
                       '\'{"grid": [64, 1, 1], "block": [256, 1, 1]}\'')
        p.add_argument("-o", "--out", type=Path, required=True,
                       help="harness directory (new or empty)")
        p.add_argument("--json", action="store_true",
                       help="print one JSON document (the harness, its kernels, the "
                       "planned differential runs; with --propose-policy the proposal: "
                       "policy, notes, measured errors per region) instead of lines")

    def run(self, args: argparse.Namespace) -> int:
        from ..errors import UsageError
        from ..harness import create_harness

        tuning = (args.max_atol, args.max_rtol, args.propose_runs)
        if not args.propose_policy and any(x is not None for x in tuning):
            raise UsageError("--max-atol/--max-rtol/--propose-runs go with --propose-policy")
        launch = None
        if args.opt_launch:
            launch = parse_launch(args.opt_launch, _snapshot_backend(args.snapshot))
        if args.ref_kernel and not args.ref and args.snapshot.exists():
            _check_captured_kernel(args.snapshot, args.ref_kernel)
        pair = {"ref": args.ref, "opt": args.opt, "ref_kernel": args.ref_kernel,
                "opt_kernel": args.opt_kernel, "policy": args.policy, "opt_launch": launch,
                "plan": args.plan, "opt_capture": args.opt_capture}
        proposal = None
        if args.propose_policy:
            from ..policy.propose import CEILING
            from ..propose import pair_with_proposal

            atol, rtol, runs = (d if x is None else x for x, d in zip(
                tuning, (*CEILING, 8), strict=True))
            h, proposal = pair_with_proposal(args.snapshot, args.out, runs=runs,
                                             ceiling=(atol, rtol), **pair)
        else:
            h = create_harness(args.snapshot, args.out, **pair)
        mutations, source = h.planned_mutations()
        if args.json:
            extra = {"proposal": proposal.to_json()} if proposal is not None else {}
            print(json.dumps({"harness": str(h.root), "backend": h.backend, **extra,
                              "policy": h.policy.mode, "ref": h.spec.ref.to_json(),
                              "opt": h.spec.opt.to_json(), **h.kind, "differential": {
                                  "source": source,
                                  "mutations": [m.describe() for m in mutations]}},
                             indent=1))
            return 0
        ref_what = (f"range of {len(h.snapshot.manifest.operations)} operations"
                    if h.snapshot.manifest.is_range else h.ref.kernel)
        opt_what = (f"plan of {len(h.plan.launches)} launch(es)" if h.plan is not None
                    else h.opt.kernel)
        print(f"harness written to {h.root} ({h.policy.mode}; ref {ref_what}, "
              f"opt {opt_what})")
        if args.opt_capture is not None:   # the note lists every binding
            print(h.plan.note)
        if proposal is not None:
            for line in proposal.notes or (h.policy.note,):
                print(f"proposed policy: {line}")
        if mutations:
            print(f"differential runs ({source}): " + "; ".join(m.describe() for m in mutations))
        else:
            print("differential runs: none (" + (
                "turned off by the policy" if source == "off" else
                "no region the captured launch leaves unchanged; the run adds those ref "
                "updates in place") + ")")
        print(f"run it: kpair run {h.root}   or   cd {h.root} && python run_harness.py")
        return 0


def _snapshot_backend(snapshot: Path) -> str:
    """The backend a snapshot names (host when snapshot.json cannot say: the pair's own
    checks then report what is wrong with it)."""
    try:
        manifest = json.loads((snapshot / "snapshot.json").read_text())
    except (OSError, ValueError):
        return "host"
    backend = manifest.get("backend") if isinstance(manifest, dict) else None
    return backend if isinstance(backend, str) else "host"


def _check_captured_kernel(snapshot: Path, kernel: str) -> None:
    """``--ref-kernel`` without ``--ref`` names a kernel of the captured code object: it must
    be there (refused as "ref kernel ...", before opt is looked at)."""
    from ..codecheck import check_kernel
    from ..snapshot import Snapshot

    src = Snapshot.open(snapshot)
    m = src.manifest
    if kernel != m.code.kernel_name:
        check_kernel(src.code_object(), m.code.format, kernel, m, "ref")


class Inspect(Command):
    """Summarise a snapshot or a harness for people (or as JSON with --json)."""

    name = "inspect"
    help = "describe a snapshot or a harness"

    @classmethod
    def add_arguments(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("path", type=Path, help="snapshot or harness directory")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.add_argument("--no-verify", action="store_true", help="skip blob and hash checks")

    def run(self, args: argparse.Namespace) -> int:
        from ..describe import describe

        info, text = describe(args.path, verify=not args.no_verify)
        print(json.dumps(info, indent=1) if args.json else text)
        return 0
