"""The shape of a subcommand."""

from __future__ import annotations

import argparse
from typing import ClassVar


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
