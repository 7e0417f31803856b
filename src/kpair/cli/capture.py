"""``kpair capture``: run a program and capture its kernel dispatches into snapshots; with
``--top K``, a profiling run first chooses the K kernels with the most GPU time."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

from ..capture.chains import DEFAULT_POST_DIGEST_OVER
from ..capture.child import strip_separator
from ..capture.workflow import capture_program
from ..errors import KpairError, UsageError
from .base import Command, integer

#: The largest size option (``--max-region-bytes``).
MAX_SIZE = 1 << 40
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``1073741824``, ``512MiB``, ``2G`` → bytes (binary units)."""
    m = _SIZE.match(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 512MiB, 2GiB)")
    scale = 1024 ** " KMGT".index(m.group(2).upper() or " ")
    size = int(float(m.group(1)) * scale)
    if not 1 <= size <= MAX_SIZE:
        raise argparse.ArgumentTypeError(f"must be 1 byte to 1TiB, not {text!r}")
    return size


def _pending(summary: dict | None) -> bool:
    records = [*(summary or {}).get("dispatches", []), *(summary or {}).get("ranges", [])]
    return any(r.get("chain_pre") for r in records)


def _verify(outcome):
    """Confirm the capture's chains on this machine's GPU (``kpair.regen.verify_capture``);
    a region whose chain fails is stored as bytes. One line on stderr says what happened."""
    from ..backends import open_device
    from ..regen import verify_capture

    try:
        tally = verify_capture(outcome.out, lambda: open_device("cuda"))
    except (KpairError, OSError) as e:
        print(f"kpair capture: the stored chains could not be verified here ({e}); each is "
              "checked again when the snapshot is replayed", file=sys.stderr)
        return outcome
    print(f"kpair capture: {tally['verified']} regenerable region(s) verified"
          + (f", {tally['stored_as_bytes']} stored as bytes instead (their chain did not make "
             "the captured bytes)" if tally["stored_as_bytes"] else ""), file=sys.stderr)
    summary = json.loads((outcome.out / "capture.json").read_text())
    return dataclasses.replace(outcome, summary=summary)


class Capture(Command):
    """Run a Python program and capture its kernel dispatches into snapshots (CUDA, CUPTI)."""

    name = "capture"
    help = "capture kernel dispatches of a program into snapshots"

    @classmethod
    def add_arguments(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("-o", "--out", type=Path, required=True,
                       help="output directory (new or empty): one snapshot per dispatch, "
                       "plus capture.json")
        p.add_argument("--kernel", metavar="REGEX",
                       help="capture kernels whose mangled or demangled name matches")
        p.add_argument("--nth", type=integer(1, 2**31), default=1, metavar="N",
                       help="start at the Nth matching launch (default 1); with --range, "
                       "capture the Nth occurrence of each range")
        p.add_argument("--range", dest="ranges", action="append", metavar="NAME",
                       help="capture the range NAME (torch.cuda.nvtx.range(NAME) or "
                       "kpair.mark(NAME) in the program) as one range snapshot DIR/NAME/: "
                       "every kernel, memset and device-to-device copy in it, in order; "
                       "repeatable"),
        p.add_argument("--max", type=integer(0, 2**31), default=None, metavar="K",
                       help="capture at most K dispatches; 0 = no limit (default 1)")
        p.add_argument("--distinct", action="store_true",
                       help="only the first launch of each kernel counts as a match")
        p.add_argument("--top", type=integer(1, 1000), metavar="K",
                       help="run the program twice: a profiling run ranks kernels by total GPU "
                       "time, then the first dispatch of each of the K most expensive (among "
                       "those matching --kernel) is captured; profile.json is kept in DIR")
        p.add_argument("--max-region-bytes", type=parse_size, default=2 << 30, metavar="SIZE",
                       help="leave out regions larger than this and mark the snapshot "
                       "incomplete (default 2GiB); with --range, refuse a range whose "
                       "regions exceed it in all")
        p.add_argument("--module-loading", choices=("eager", "lazy"), default="eager",
                       help="CUDA_MODULE_LOADING for the program (default eager: every code "
                       "object is reported as it loads; lazy is cheaper, but drivers have been "
                       "seen not to report the code objects of cudart kernels, PyTorch's own)")
        p.add_argument("--store-bytes", action="store_true",
                       help="store every region's pre- and post-state as bytes: no region is "
                       "stored as the chain of operations that made it (a seeded generator, "
                       "a fill), no post-state as digests only")
        p.add_argument("--post-digest-over", type=parse_size,
                       default=DEFAULT_POST_DIGEST_OVER, metavar="SIZE",
                       help="a written region larger than this keeps its post-state as "
                       "digests only (sha256, digest64, size; no bytes): `kpair replay` "
                       "checks it by a digest computed on the GPU, what needs the bytes "
                       "(pair, run) refuses it (default 64MiB; --store-bytes keeps bytes)")
        p.add_argument("--verify-chains", action=argparse.BooleanOptionalAction, default=True,
                       help="after the program ends, regenerate every stored chain on this "
                       "GPU and store as bytes each region whose chain does not make its "
                       "captured sha256 (default on)")
        p.add_argument("--json", action="store_true",
                       help='print {"out", "exit_status", "capture": capture.json} as one '
                       "JSON document on stdout (the program's own stdout then goes to stderr)")
        # dest "program": "command" is the subcommand's name (messages say "kpair VERB")
        p.add_argument("program", metavar="command", nargs=argparse.REMAINDER,
                       help="-- python prog.py ARGS... (the program to run)")

    def run(self, args: argparse.Namespace) -> int:
        if args.top is not None and (args.nth != 1 or args.max is not None or args.distinct):
            raise UsageError("--top takes the first dispatch of each chosen kernel: it "
                             "does not combine with --nth, --max or --distinct")
        if args.max is not None and args.max < 0:
            raise UsageError(f"--max must be 0 (no limit) or more, got {args.max}")
        if args.ranges and (args.kernel is not None or args.top is not None
                            or args.max is not None or args.distinct):
            raise UsageError("--range captures whole ranges: it does not combine with "
                             "--kernel, --top, --max or --distinct (--nth picks the "
                             "occurrence)")
        outcome = capture_program(
            strip_separator(args.program), args.out, kernel=args.kernel, nth=args.nth,
            max=1 if args.max is None else args.max or None, distinct=args.distinct,
            top=args.top, ranges=args.ranges, max_region_bytes=args.max_region_bytes,
            module_loading=args.module_loading, store_bytes=args.store_bytes,
            post_digest_over=None if args.store_bytes else args.post_digest_over,
            # under --json the program's stdout goes to stderr: kpair's stdout holds nothing
            # but its one JSON document
            stdout=sys.stderr.fileno() if args.json else None)
        if args.verify_chains and not args.store_bytes and _pending(outcome.summary):
            outcome = _verify(outcome)
        if args.json:
            print(json.dumps(outcome.to_json(), indent=1))
        if outcome.no_profile:
            return outcome.exit_status or 5
        return outcome.exit_status
