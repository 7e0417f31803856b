"""``kpair optimize``: capture a program's expensive kernels, search faster builds of them,
publish the winners into a release (``kpair.optimize.program``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..capture.child import strip_separator
from ..errors import UsageError
from ..optimize.baseline import MODES
from ..optimize.program import OptimizeOptions
from ..optimize.request import (
    OptimizeTarget,
    RangeCandidate,
    measurement_options,
    optimize_range,
    optimize_release,
)
from ..optimize.strategies import STRATEGIES
from ..optimize.strategies.host_c import parse_flags, parse_variant
from ..optimize.strategy import KernelSource
from .base import BLOCKS, LEVEL, SECONDS, SEED, Command, integer


class Optimize(Command):
    """Profile and capture a program's top-K kernels (or take given snapshots or harnesses),
    run the built-in strategies on each, and publish every winner with `release add`;
    operators that did not improve or failed are recorded as exclusions with the reason.
    Interrupted runs resume (operators already in the release are skipped)."""

    name = "optimize"
    help = "search faster kernels for a program's dispatches and publish them in a release"

    @classmethod
    def add_arguments(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("-o", "--out", type=Path, required=True, help="the release directory")
        p.add_argument("--work", type=Path,
                       help="work directory: capture, harnesses, searches (default "
                       "OUT.work, beside the release); keep it to resume")
        src = p.add_argument_group("what to optimize (one of)")
        src.add_argument("--top", type=integer(1, 1000), default=5, metavar="K",
                         help="with a program: capture the K kernels that take most GPU "
                         "time (default 5)")
        src.add_argument("--kernel-filter", metavar="REGEX",
                         help="with a program: rank only kernels whose name matches, e.g. "
                         "'^triton_' for the kernels the triton strategy can retune")
        src.add_argument("--snapshot", type=Path, action="append", default=[],
                         help="a snapshot, or a capture directory (capture.json), to "
                         "optimize (repeatable)")
        src.add_argument("--harness", type=Path, action="append", default=[],
                         help="an existing harness: candidates are judged against its ref "
                         "(repeatable)")
        src.add_argument("--range", type=Path, metavar="SNAP",
                         help="a range snapshot (kpair capture --range) as ref, judged "
                         "against its captured candidates (--opt-capture) and kpair's "
                         "retunes of their Triton kernels; the best correct one is published")
        src.add_argument("--opt-capture", action="append", default=[], metavar="NAME=SNAP",
                         help="with --range: a capture of the same range made another way, "
                         "named by its producer, e.g. inductor-default=compiled.snap, "
                         "max-autotune=mat.snap (repeatable; one that cannot be bound is "
                         "recorded with its reason)")
        p.add_argument("--level", type=LEVEL, help="release level for --harness/--snapshot "
                       "operators (default: 2 for fused kernels, else 1)")
        p.add_argument("--name", help="operator name (one --harness or --snapshot only)")
        p.add_argument("--prefix", default="",
                       help="put before every operator name, e.g. 'llama.' when several "
                       "programs publish into one release")
        st = p.add_argument_group("strategies")
        st.add_argument("--strategy", action="append", choices=sorted(STRATEGIES),
                        help="strategies to run (repeatable; default all that apply)")
        st.add_argument("--source", type=Path, help="the kernel's C or CUDA C source")
        st.add_argument("--kernel", help="the kernel's name in --source")
        st.add_argument("--variant", action="append", default=[], metavar="NAME=V[,NAME=V]",
                        help="a -D macro set to build --source with (repeatable)")
        st.add_argument("--flags", action="append", metavar="'FLAGS'",
                        help="a compiler flag set replacing the strategy's own, as "
                        "--flags='-O3 -funroll-loops' (repeatable)")
        st.add_argument("--native", action="store_true",
                        help="host-c: also try -march=native (the binary then needs this "
                        "CPU's instruction set)")
        st.add_argument("--policy", type=Path,
                        help="validation policy for harnesses made from snapshots "
                        "(default byte-exact)")
        st.add_argument("--keep", type=integer(1, 1000), default=3,
                        help="candidates confirmed with the full run (default 3)")
        st.add_argument("--triton-limit", type=integer(1, 100_000), default=48, metavar="N",
                        help="triton: configs built per kernel (with --range: per Triton "
                        "launch of each capture), fewest changes first (default 48)")
        b = p.add_argument_group("baseline to beat")
        b.add_argument("--inductor-baseline", action="store_true",
                       help="with a program: capture it again under Inductor's "
                       "coordinate-descent tuning and under max-autotune (fresh Inductor "
                       "caches) and measure the configs they choose beside the search, on "
                       "each operator's own dispatch; the release compares its winners "
                       "with them")
        b.add_argument("--baseline-capture", action="append", default=[],
                       metavar="MODE=DIR", help="a kpair capture of the same program made "
                       "with Inductor tuning MODE on (e.g. coordinate-descent=cd.cap), used "
                       "as --inductor-baseline uses its own (repeatable)")
        m = p.add_argument_group("measurement")
        m.add_argument("--timeout", type=SECONDS, metavar="S",
                       help="seconds a candidate's worker has before it is killed (default: "
                       "derived from ref's own time, as for kpair run)")
        m.add_argument("--prune-max-blocks", type=BLOCKS, default=16, metavar="N",
                       help="ABBA blocks at most in the prune stage's short measurement of "
                       "every candidate")
        m.add_argument("--prune-time-cap", type=SECONDS, default=1.0, metavar="S",
                       help="seconds of ABBA timing at most per candidate in the prune stage")
        m.add_argument("--rungs", type=integer(0, 4), default=1, metavar="N",
                       help="successive-halving rungs between prune and confirm, each "
                       "measuring the best third again with twice the blocks (default 1; "
                       "0: prune, then confirm)")
        m.add_argument("--time-cap", type=SECONDS, metavar="S",
                       help="seconds of ABBA timing in the confirming and publishing runs "
                       "(default: the harness's measure setting, else kpair run's)")
        m.add_argument("--min-blocks", type=BLOCKS, metavar="N",
                       help="ABBA blocks before the CI may stop the confirming and publishing "
                       "runs (default: as kpair run)")
        m.add_argument("--max-blocks", type=BLOCKS, metavar="N",
                       help="ABBA blocks at most in the confirming and publishing runs "
                       "(default: as kpair run)")
        m.add_argument("--seed", type=SEED, metavar="N",
                       help="seed of every ABBA schedule (default: random)")
        p.add_argument("--json", action="store_true",
                       help="print the outcome as one JSON document on stdout: the release, "
                       "the counts and one row per operator (key, status, line, producer: "
                       "the published candidate's); the progress lines stay on stderr")
        # dest "program": "command" is the subcommand's name (messages say "kpair VERB")
        p.add_argument("program", metavar="command", nargs=argparse.REMAINDER,
                       help="-- python prog.py ARGS... (the program to capture)")

    def run(self, args: argparse.Namespace) -> int:
        if bool(args.source) != bool(args.kernel):
            raise UsageError("--source and --kernel go together")
        if args.opt_capture and args.range is None:
            raise UsageError("--opt-capture NAME=SNAP goes with --range SNAP (the range the "
                             "captures are bound to)")
        if args.range is not None and (strip_separator(args.program) or args.snapshot
                                       or args.harness or args.inductor_baseline
                                       or args.baseline_capture):
            raise UsageError("--range judges one range against its captures: give no "
                             "program, --snapshot, --harness or Inductor baseline with it "
                             "(give Inductor's captures as --opt-capture NAME=SNAP)")
        default = () if args.range is not None else tuple(STRATEGIES)
        options = measurement_options(
            OptimizeOptions(
                strategies=tuple(args.strategy) if args.strategy else default,
                source=KernelSource.given(args.source, args.kernel) if args.source else None,
                variants=tuple(parse_variant(v) for v in args.variant),
                flag_sets=tuple(parse_flags(f) for f in args.flags) if args.flags else None,
                native=args.native, policy=args.policy, keep=args.keep,
                triton_limit=args.triton_limit),
            timeout_s=args.timeout, prune_max_blocks=args.prune_max_blocks,
            prune_time_cap_s=args.prune_time_cap, rungs=args.rungs, time_cap_s=args.time_cap,
            min_blocks=args.min_blocks, max_blocks=args.max_blocks, seed=args.seed)
        if args.range is not None:
            summary = optimize_range(
                args.range, [RangeCandidate.parse(t) for t in args.opt_capture], args.out,
                options, level=args.level, name=args.name, prefix=args.prefix,
                work=args.work)
            return self._print(summary, args.json)
        target = OptimizeTarget(
            command=tuple(strip_separator(args.program)), snapshots=tuple(args.snapshot),
            harnesses=tuple(args.harness), top=args.top, kernel_filter=args.kernel_filter,
            level=args.level, name=args.name, prefix=args.prefix,
            inductor_baseline=args.inductor_baseline,
            baseline_captures=dict(_mode_dir(text) for text in args.baseline_capture))
        summary = optimize_release(args.out, target, options, work=args.work)
        return self._print(summary, args.json)

    @staticmethod
    def _print(summary, as_json: bool) -> int:
        if not as_json:
            print(summary.line())
            return summary.exit_code
        print(summary.line(), file=sys.stderr)
        print(json.dumps(summary.to_json(), indent=1))
        return summary.exit_code


def _mode_dir(text: str) -> tuple[str, Path]:
    mode, sep, where = text.partition("=")
    if not sep or mode not in MODES:
        raise UsageError(f"--baseline-capture {text!r}: give MODE=DIR, MODE one of "
                         f"{', '.join(MODES)}")
    path = Path(where)
    if not (path / "capture.json").is_file():
        raise UsageError(f"--baseline-capture {text!r}: {path} holds no capture.json")
    return mode, path
