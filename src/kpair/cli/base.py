"""The shape of a subcommand."""

from __future__ import annotations

import argparse
import contextlib
import signal
from typing import ClassVar

from ..errors import Interrupted


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
