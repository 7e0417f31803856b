"""``kpair replay SNAPSHOT [--runs N]``: does a captured dispatch replay to its post-state?"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import InputError, UsageError
from .base import MAX_RUNS, SECONDS, Command, integer

#: Exit status per outcome: reproduced, not reproduced, no verdict (a runtime failure; an
#: error the worker names, such as a bad snapshot, exits with its own code instead).
EXIT = {"byte-exact": 0, "nondeterministic": 1, "mismatch": 1, "error": 5}


class ReplayCmd(Command):
    """Replay a snapshot's own code object N times in an isolated worker and say whether it
    reproduces the captured post-state: byte-exact, nondeterministic (runs differ from each
    other), mismatch (runs agree, not with the capture) or error. A post-state capture kept
    as digests only (``--post-digest-over``) is compared by a digest computed on the device."""

    name = "replay"
    help = "replay a captured dispatch and check it reproduces its post-state"

    @classmethod
    def add_arguments(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("snapshot", type=Path, help="snapshot directory")
        p.add_argument("--runs", type=integer(1, MAX_RUNS), default=3, metavar="N",
                       help=f"replays, 1 to {MAX_RUNS} (default 3)")
        p.add_argument("--timeout", type=SECONDS, default=600.0,
                       help="seconds before a hung worker is killed (default 600)")
        p.add_argument("--json", action="store_true", help="print the report as JSON")

    def run(self, args: argparse.Namespace) -> int:
        from ..formats import to_builtins
        from ..isolation import replay_isolated
        from ..snapshot import Snapshot, require_complete

        if args.runs < 1:
            raise UsageError("--runs must be at least 1")
        if not args.timeout > 0:
            raise UsageError("--timeout must be a positive number of seconds")
        if not args.snapshot.exists():
            raise InputError("no such snapshot directory", path=args.snapshot)
        # A bad snapshot is a bad input file here as in inspect and pair (exit 3), found
        # before a worker starts: every blob is read and checked against its sha256.
        # An incomplete one (capture left memory out) is refused first, naming what is missing.
        snapshot = Snapshot.open(args.snapshot)
        require_complete(snapshot.manifest, args.snapshot)
        snapshot.verify()
        rep = replay_isolated(args.snapshot, args.runs, timeout_s=args.timeout)
        if args.json:
            print(json.dumps(to_builtins(rep), indent=1))
        else:
            line = f"{rep.status}: {rep.kernel or args.snapshot} ({rep.runs} runs"
            if rep.replay:
                line += f", replay {rep.replay.get('mode')}"
            line += ")"
            if rep.differing_regions:
                line += f"; differs from the capture in {', '.join(rep.differing_regions)}"
                by_digest = [n for n in rep.differing_regions if n in rep.digest_regions]
                if by_digest:
                    line += (f" ({', '.join(by_digest)}: the digest differs; compared by "
                             "digest on the device, how many bytes differ is unknown)")
            if rep.unstable_regions:
                line += f"; varies between runs in {', '.join(rep.unstable_regions)}"
            if rep.error:
                line += f"; {rep.error}"
            print(line)
        if rep.status == "error" and rep.exit_code is not None:
            # What the worker refused, as every verb exits for it: a snapshot whose chain
            # does not regenerate is a bad input file (3), an ABI mismatch 4.
            return rep.exit_code
        return EXIT[rep.status]
