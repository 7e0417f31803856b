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
from pathlib import Path

from .._util import check_output
from ..errors import UsageError
from ..harness import ref_spread
from ..policy import save_policy
from ..policy.suggest import DETERMINISTIC, suggest_policy
from .base import MAX_RUNS, Command, integer, number
from .run import check_harness_dir


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
        s.add_argument("--runs", type=integer(2, MAX_RUNS), default=8, metavar="N",
                       help=f"ref runs, 2 to {MAX_RUNS} (default 8)")
        s.add_argument("--margin", type=number(1, 1e6, low_open=False), default=4.0,
                       help="tolerance = margin x observed spread (default 4)")

    def run(self, args: argparse.Namespace) -> int:
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
