"""The shape of a subcommand."""

from __future__ import annotations

import argparse
import contextlib
import math
import re
import signal
from collections.abc import Callable
from typing import ClassVar

from ..backends import BACKENDS, device_count
from ..errors import Interrupted, UsageError


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default: "(default: X)" is added where the help
    does not already say it and there is one (not None, off, or empty)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "default" in text or default in (None, False, "", [], argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)"


class Command:
    name: ClassVar[str]
    help: ClassVar[str]

    @classmethod
    def add_arguments(cls, p: argparse.ArgumentParser) -> None:
        pass

    def run(self, args: argparse.Namespace) -> int:
        raise NotImplementedError


@contextlib.contextmanager
def sigterm_unwinds():
    """SIGTERM raises ``Interrupted`` (a KeyboardInterrupt) in the main thread, so that a
    terminated command unwinds as Ctrl-C does: workers killed, temporary directories
    removed, then exit 143."""
    def handler(signum, frame):
        raise Interrupted("terminated by SIGTERM")

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (a test calling main from a thread)
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# ---------------------------------------------------------------------- bounded options

#: The largest seed: the worker keeps seeds as 64-bit signed integers (samples.npz, numpy).
MAX_SEED = 2**63 - 1
#: Bounds shared by every verb's options (README "Options and their bounds").
MAX_BLOCKS = 1_000_000
MAX_SECONDS = 86_400.0
MAX_REPLICATES_OPTION = 64
MAX_RUNS = 100_000


class UsageExit(Exception):
    """argparse refused the command line: ``prog`` (``kpair run``) and the one-line reason.
    ``main`` prints it (and, under ``--json``, its JSON document) and exits 2."""

    exit_code = 2

    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog, self.message = prog, message


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line, not the usage block: ``error`` raises
    ``UsageExit`` for ``main`` to print (``kpair run: argument --seed: ...``, exit 2)."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageExit(self.prog, message)


def integer(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: a whole number (decimal digits only) in [low, high]; argparse
    prefixes the refusal with the option's name."""
    span = f"[{low}, {high}]" if high is not None else f">= {low}"

    def parse(text: str) -> int:
        t = text.strip()
        if not re.fullmatch(r"[+-]?\d+", t):
            raise argparse.ArgumentTypeError(f"must be an integer {_in(span)}, not {text!r}")
        value = int(t)
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be an integer {_in(span)}, not {text}")
        return value

    parse.__name__ = "integer"
    return parse


def number(low: float, high: float, *, low_open: bool = True) -> Callable[[str], float]:
    """An argparse ``type``: a finite number in (low, high] (``low_open=False``: [low, high])."""
    span = f"{'(' if low_open else '['}{low:g}, {high:g}]"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be a number {_in(span)}, not {text!r}") from None
        below = value <= low if low_open else value < low
        if not math.isfinite(value) or below or value > high:
            raise argparse.ArgumentTypeError(f"must be a number {_in(span)}, not {text}")
        return value

    parse.__name__ = "number"
    return parse


def _in(span: str) -> str:
    return span if span.startswith(">") else f"in {span}"


#: The typed options every verb shares.
SEED = integer(0, MAX_SEED)
BLOCKS = integer(4, MAX_BLOCKS)
SECONDS = number(0, MAX_SECONDS)
REPLICATES = integer(1, MAX_REPLICATES_OPTION)
DEVICE = integer(0, 4095)
LEVEL = integer(1, 99)


def check_device(backend: str, device: int | None) -> None:
    """Refuse ``--device N`` when the backend has no device N (host: one device, index 0)."""

    if device is None or backend not in BACKENDS:  # a bad harness.json: its open says so
        return

    count = device_count(backend)  # no driver: BackendUnavailable (exit 4)
    if device >= count:
        more = "; several host worker slots are --workers N" if backend == "host" else ""
        have = "no device" if count < 1 else "one device, index 0" if count == 1 else \
            f"{count} devices, index 0 to {count - 1}"
        raise UsageError(f"--device {device}: the {backend} backend has {have} here{more}")


#: Launch geometry a backend accepts: grid and block limits per dimension, threads per
#: block, dynamic shared memory in bytes. The host records geometry without using it; it
#: takes CUDA's limits, so that a harness never records what no GPU could launch.
GEOMETRY = {
    "cuda": ((2**31 - 1, 65535, 65535), (1024, 1024, 64), 1024, 227 * 1024),
    "hip": ((2**31 - 1, 65535, 65535), (1024, 1024, 1024), 1024, 64 * 1024),
    "host": ((2**31 - 1, 65535, 65535), (1024, 1024, 64), 1024, 227 * 1024),
}


def parse_launch(text: str, backend: str, option: str = "--opt-launch") -> dict:
    """A launch override (``{"grid": [x, y, z], "block": [x, y, z],
    "dynamic_shared_bytes": N}``, every key optional) checked against ``backend``'s limits."""
    import json


    try:
        launch = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{option} is not valid JSON: {e}") from None
    if not isinstance(launch, dict):
        raise UsageError(f"{option} must be a JSON object with grid, block and/or "
                         "dynamic_shared_bytes")
    unknown = sorted(set(launch) - {"grid", "block", "dynamic_shared_bytes"})
    if unknown:
        raise UsageError(f"{option}: unknown key {unknown[0]!r} (grid, block, "
                         "dynamic_shared_bytes)")
    grid_max, block_max, threads_max, shared_max = GEOMETRY.get(backend, GEOMETRY["cuda"])
    for key, limits in (("grid", grid_max), ("block", block_max)):
        dims = launch.get(key)
        if dims is None:
            continue
        if not (isinstance(dims, list) and len(dims) == 3 and all(
                isinstance(d, int) and not isinstance(d, bool) for d in dims)):
            raise UsageError(f"{option}: {key} must be three integers [x, y, z], not "
                             f"{json.dumps(dims)}")
        for axis, d, most in zip("xyz", dims, limits, strict=True):
            if not 1 <= d <= most:
                raise UsageError(f"{option}: {key} {axis} is {d}; the {backend} backend "
                                 f"takes 1 to {most}")
    block = launch.get("block")
    if block is not None and math.prod(block) > threads_max:
        raise UsageError(f"{option}: block {block} is {math.prod(block)} threads; the "
                         f"{backend} backend takes at most {threads_max} per block")
    shared = launch.get("dynamic_shared_bytes")
    if shared is not None and (not isinstance(shared, int) or isinstance(shared, bool)
                               or not 0 <= shared <= shared_max):
        raise UsageError(f"{option}: dynamic_shared_bytes must be an integer in [0, "
                         f"{shared_max}] on the {backend} backend, not {json.dumps(shared)}")
    return launch
