"""``kpair run`` and the generated ``run_harness.py``: run one harness, print its verdict."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import progress
from ..errors import FormatError, InputError, KpairError, UsageError
from ..formats import encode
from ..isolation import run_isolated
from ..measure import StoppingRule
from ..pipeline import MAX_REPLICATES, RunOptions
from ..scale import resolve_devices
from ..trust import CHECKS
from .base import (
    BLOCKS,
    DEVICE,
    REPLICATES,
    SECONDS,
    SEED,
    ArgumentParser,
    Command,
    HelpFormatter,
    UsageExit,
    check_device,
    integer,
    number,
    sigterm_unwinds,
)
from .errordoc import print_error_document


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    from ..isolation import HANG_FACTOR, HANG_FLOOR_S

    p.add_argument("--aa", action="store_true", help="also run an A/A control (ref vs ref)")
    p.add_argument("--no-control", action="store_true",
                   help="skip the identical-binary control (ref against a second load of "
                   "itself) whose offset widens the reported interval: faster, less honest")
    p.add_argument("--warm", action="store_true", help="warm cache (default: flushed, cold)")
    p.add_argument("--device", type=DEVICE, metavar="N",
                   help="device ordinal to run on (the backend's numbering of the devices "
                   "this process sees; default 0; host: 0, its one device); recorded as "
                   "environment.device_index")
    p.add_argument("--relocate", action="store_true",
                   help="force relocation (test the pointer-patching path)")
    rule = StoppingRule()
    p.add_argument("--min-blocks", type=BLOCKS, metavar="N",
                   help="ABBA blocks (a ref and an opt launch each) timed before the CI may "
                   "stop a measurement (default: the harness's measure setting, else "
                   f"{rule.min_blocks})")
    p.add_argument("--max-blocks", type=BLOCKS, metavar="N",
                   help="ABBA blocks at most per measurement (default: the harness's "
                   f"measure setting, else {rule.max_blocks})")
    p.add_argument("--rel-ci", type=number(0, 1), metavar="FRACTION",
                   help="stop when the speedup CI's half-width is below this fraction of it "
                   f"(default: the harness's measure setting, else {rule.rel_ci_halfwidth:g})")
    p.add_argument("--time-cap", type=SECONDS, metavar="S",
                   help="seconds of ABBA timing at most per measurement: the A/B "
                   "measurement (shared by its replicates), the identical-binary control and "
                   "the A/A control each get this much (default: the harness's measure "
                   f"setting, else {rule.time_cap_s:g})")
    p.add_argument("--seed", type=SEED, metavar="N",
                   help="seed of the ABBA schedule, the bootstrap and the trust checks' "
                   "inputs, 0 to 2**63-1 (default: random, recorded in result.json)")
    p.add_argument("--replicates", type=REPLICATES, default=RunOptions.replicates, metavar="N",
                   help="independent measurements on fresh loads of both kernels, read "
                   f"together as a re-run interval (default {RunOptions.replicates}; 1: one "
                   "ABBA run, its own CI)")
    p.add_argument("--max-replicates", type=REPLICATES, metavar="N",
                   help="more replicates past --replicates, up to N in all, while each costs "
                   f"little (about 1 s of extra measurement at most; default {MAX_REPLICATES} "
                   "on a GPU, none on the host)")
    p.add_argument("--timeout", type=SECONDS, metavar="S",
                   help="seconds the worker has for its setup and for each opt before it is "
                   "killed (default: derived from ref's own time: a worker that shows no "
                   f"progress for max({HANG_FLOOR_S:g} s, {HANG_FACTOR:g} x the time of "
                   "ref's stage) is killed; see docs/format.md)")
    p.add_argument("--json", action="store_true", help="print result.json instead of a line")
    p.add_argument("--no-checks", action="store_true",
                   help="skip every trust check (guards, poison, repeats, mutations, timing "
                   "cross-checks): faster, and trusts opt not to cheat")
    p.add_argument("--skip-check", action="append", default=[], choices=CHECKS,
                   metavar="CHECK", help="skip one trust check (repeatable; default: none "
                   f"skipped): {', '.join(CHECKS)}")


def options_from_args(args: argparse.Namespace):
    return RunOptions(device=getattr(args, "device", None), relocate=args.relocate,
                      cache="warm" if args.warm else "cold", aa=args.aa,
                      min_blocks=args.min_blocks, max_blocks=args.max_blocks,
                      rel_ci=args.rel_ci, time_cap_s=args.time_cap, seed=args.seed,
                      replicates=getattr(args, "replicates", RunOptions.replicates),
                      max_replicates=getattr(args, "max_replicates", None),
                      timeout_s=args.timeout,
                      control=not getattr(args, "no_control", False),
                      checks=not getattr(args, "no_checks", False),
                      skip_checks=tuple(getattr(args, "skip_check", None) or ()))


def report(result, as_json: bool, where: Path) -> int:
    """Print a Result (one line, or the whole JSON) and return its exit status."""
    if as_json:
        print(encode(result), end="")
    else:
        print(result.summary())
        print(f"result: {where}")
    return result.exit_code


class RunCmd(Command):
    """Run a pair harness in an isolated worker and write its result.json."""

    name = "run"
    help = "run a pair harness, write result.json"

    @classmethod
    def add_arguments(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("harness", type=Path, help="pair harness directory")
        p.add_argument("-o", "--out", type=Path,
                       help="result path (default: HARNESS/result.json, the harness's latest "
                       "result, replaced by each run); its samples and worker log go beside "
                       "it (r2.json: r2.samples.npz, r2.worker.log). An existing file is not "
                       "replaced without --force")
        p.add_argument("--force", action="store_true",
                       help="replace an existing --out file (and its samples and log)")
        add_run_arguments(p)

    def run(self, args: argparse.Namespace) -> int:
        options = options_from_args(args)  # a usage error before anything is touched
        check_harness_dir(args.harness)
        check_device(harness_backend(args.harness), args.device)
        result = run_isolated(args.harness, options, out=args.out,
                              replace=args.out is None or args.force)
        return report(result, args.json, args.out or args.harness / "result.json")


def check_harness_dir(path: Path) -> None:
    """Refuse, as a bad input (exit 3), a path that is no harness directory."""
    if not path.exists():
        raise InputError("no such harness directory", path=path)
    if not (path / "harness.json").is_file():
        raise FormatError("no harness.json here: not a kpair harness", path=path)


def harness_main(root: Path, argv: list[str]) -> int:
    """Entry point of a harness's generated ``run_harness.py``."""

    p = ArgumentParser(prog="run_harness.py", formatter_class=HelpFormatter,
                       description=f"Run the pair harness in {root}.")
    add_run_arguments(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    try:
        args = p.parse_args(argv)
    except UsageExit as e:
        print(f"{e.prog}: {e.message}", file=sys.stderr)
        if "--json" in argv:
            print_error_document(e.prog, 2, e.message, kind="UsageError")
        return 2

    def fail(code: int, message: str, error: BaseException) -> int:
        print(f"kpair: {message}", file=sys.stderr)
        if args.json:
            print_error_document("run_harness.py", code, message, kind=type(error).__name__)
        return code

    with sigterm_unwinds():
        try:
            with progress.using(progress.for_command("run_harness.py", quiet=args.quiet)):
                options = options_from_args(args)
                check_device(harness_backend(root), args.device)
                result = run_isolated(root, options)
        except KpairError as e:
            return fail(e.exit_code, str(e), e)
        except KeyboardInterrupt as e:
            return fail(getattr(e, "exit_code", 130), "interrupted; result.json left as it was",
                        e)
    return report(result, args.json, root / "result.json")


def harness_backend(harness: Path) -> str:
    """The backend a harness names (host when harness.json cannot say: its own open then
    reports what is wrong with it)."""
    import json

    try:
        spec = json.loads((harness / "harness.json").read_text())
    except (OSError, ValueError):
        return "host"
    backend = spec.get("backend", "host") if isinstance(spec, dict) else "host"
    return backend if isinstance(backend, str) else "host"


def add_pool_arguments(p: argparse.ArgumentParser) -> None:
    """``--gpus`` / ``--workers``: spread the work over a pool of devices of this host."""
    p.add_argument("--gpus", metavar="all|0,1,...",
                   help="spread the work over these GPUs, one harness in flight per GPU "
                   "(all: every GPU this process sees)")
    p.add_argument("--workers", type=integer(1, 1024), metavar="N",
                   help="host backend: N worker slots sharing the CPUs (the pool without GPUs)")


def pool_devices(args: argparse.Namespace, backend: str) -> tuple[int, ...] | None:
    """The pool's ordinals from --gpus/--workers (None: neither given, one device)."""

    if args.gpus is None and args.workers is None:
        return None
    if args.device is not None:
        raise UsageError("--device picks one device; --gpus/--workers pick a pool: not both")
    return resolve_devices(backend, args.gpus, args.workers)


__all__ = ["RunCmd", "add_pool_arguments", "add_run_arguments", "harness_backend", "harness_main",
           "options_from_args", "pool_devices", "report"]
