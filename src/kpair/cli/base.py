"""The shape of a subcommand."""

from __future__ import annotations

import argparse
import contextlib
import signal
from typing import ClassVar

from ..errors import Interrupted


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
