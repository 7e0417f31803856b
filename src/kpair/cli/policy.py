"""``kpair policy suggest``: a tolerance policy from the observed spread of repeated ref runs.

When the baseline is nondeterministic (atomics, unordered reductions), a byte-exact verdict
cannot apply and ``kpair run`` fails with "baseline nondeterministic". This command replays
ref ``--runs`` times on the harness's captured dispatch and declares, for every region whose
bytes vary, one range covering them with a criterion ``--margin`` times wider than the
observed spread (``allclose``; ``scalar_rtol`` for a single element). It also proposes
mutations (differential runs) for float regions ref only reads, unless some are declared.
The harness itself is sealed by its manifest: pair again with ``--policy``.

``kpair policy propose HARNESS``: the policy ``kpair pair --propose-policy`` would give the
harness's opt, from ref-against-opt differences on the captured and mutated inputs (the
tightest allclose every run passes with a margin; exit 4 over the ceiling).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .._util import check_output
from ..errors import UsageError
from ..harness import ref_spread
from ..policy import save_policy
from ..policy.suggest import DETERMINISTIC, suggest_policy
from .base import MAX_RUNS, Command, integer, number
from .run import check_harness_dir


def _harness_and_out(p: argparse.ArgumentParser) -> None:
    """The harness and where the policy goes: every action's."""
    p.add_argument("harness", type=Path, help="pair harness directory")
    p.add_argument("-o", "--out", type=Path, help="policy file (default: print it); an "
                   "existing file is not replaced without --force")
    p.add_argument("--force", action="store_true", help="replace an existing --out file")


class PolicyCmd(Command):
    """Validation-policy tools. ``suggest``: a tolerance policy from the observed spread of
    repeated ref runs (for a nondeterministic baseline), to pair again with."""

    name = "policy"
    help = "suggest (from repeated ref runs) or propose (from ref against opt) a policy"

    @classmethod
    def add_arguments(cls, p: argparse.ArgumentParser) -> None:
        sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
        s = sub.add_parser("suggest", help="write a tolerance policy from the spread of "
                           "repeated ref runs", description=__doc__)
        _harness_and_out(s)
        s.add_argument("--json", action="store_true",
                       help="print one JSON document: the policy and the notes")
        s.add_argument("--runs", type=integer(2, MAX_RUNS), default=8, metavar="N",
                       help=f"ref runs, 2 to {MAX_RUNS} (default 8)")
        s.add_argument("--margin", type=number(1, 1e6, low_open=False), default=4.0,
                       help="tolerance = margin x observed spread (default 4)")

        pr = sub.add_parser("propose", help="write the tightest tolerance policy under which "
                            "the harness's opt passes against ref on captured and mutated "
                            "inputs", description=__doc__)
        _harness_and_out(pr)
        pr.add_argument("--json", action="store_true",
                        help="print one JSON document: the policy, the notes, the measured "
                        "errors per region")
        pr.add_argument("--runs", type=integer(1, 64), default=8, metavar="N",
                        help="mutated inputs, 1 to 64 (default 8)")
        pr.add_argument("--max-atol", type=number(0, 1e6, low_open=False), default=1e-2,
                        metavar="A", help="ceiling on atol (default 1e-2, KernelBench's)")
        pr.add_argument("--max-rtol", type=number(0, 1e6, low_open=False), default=1e-2,
                        metavar="R", help="ceiling on rtol (default 1e-2)")

    def run(self, args: argparse.Namespace) -> int:
        if args.action == "propose":
            return self._propose(args)
        if args.runs < 2 or not args.margin >= 1:
            raise UsageError("need --runs >= 2 and --margin >= 1")
        check_harness_dir(args.harness)
        if args.out:  # refused before ref runs, not after
            check_output(args.out, replace=args.force)
        # Runs are reduced as they come (``Spread``): memory does not grow with --runs.
        spread, current = ref_spread(args.harness, args.runs)
        policy, notes = suggest_policy(current, spread, margin=args.margin)
        notes = notes or [DETERMINISTIC]
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

    def _propose(self, args: argparse.Namespace) -> int:
        from ..propose import propose_policy

        check_harness_dir(args.harness)
        if args.out:
            check_output(args.out, replace=args.force)
        proposal = propose_policy(args.harness, runs=args.runs,
                                  ceiling=(args.max_atol, args.max_rtol))
        for line in proposal.notes or (proposal.policy.note,):
            print(f"kpair policy: {line}", file=sys.stderr)
        if args.out:
            save_policy(proposal.policy, args.out, replace=args.force)
            print(f"policy written to {args.out}; pair again with --policy {args.out}",
                  file=sys.stderr)
        if args.json:
            print(json.dumps({**proposal.to_json(),
                              "out": str(args.out) if args.out else None}, indent=1))
        elif not args.out:
            print(json.dumps(proposal.policy.to_json(), indent=1))
        return 0
