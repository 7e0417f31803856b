"""The shape of a subcommand."""

from __future__ import annotations

import argparse
from typing import ClassVar


class Command:
    name: ClassVar[str]
    help: ClassVar[str]

    @classmethod
    def add_arguments(cls, p: argparse.ArgumentParser) -> None:
        pass

    def run(self, args: argparse.Namespace) -> int:
        raise NotImplementedError
