"""Which launches to capture: a kernel-name pattern or a list of names, the nth match on, at
most K of them.

Matches are numbered from 1 in launch order; with ``distinct`` only the first launch of each
kernel counts as a match (a coverage run wants one dispatch per kernel, not 500 of one).
Capture starts at match ``nth`` and takes at most ``max`` dispatches (None: no limit).
``names`` (exact mangled or demangled names, e.g. the most expensive kernels of a profile)
narrows the matches further.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..errors import UsageError


@dataclass
class Filter:
    kernel: str | None = None
    nth: int = 1
    max: int | None = 1
    distinct: bool = False
    names: tuple[str, ...] | None = None
    matches: int = field(default=0, init=False)
    taken: int = field(default=0, init=False)
    _seen: set = field(default_factory=set, init=False, repr=False)
    _seen_demangled: set = field(default_factory=set, init=False, repr=False)

    def __post_init__(self):
        try:
            self._regex = re.compile(self.kernel) if self.kernel else None
        except re.error as e:
            raise UsageError(f"--kernel {self.kernel!r} is not a valid regular expression: "
                             f"{e}") from None
        if self.names is not None:
            self.names = tuple(self.names)
            if not self.names:
                raise UsageError("the kernel name list is empty: it would match nothing")
        if self.nth < 1:
            raise UsageError(f"--nth must be 1 or more, got {self.nth}")
        if self.max is not None and self.max < 1:
            raise UsageError(f"--max must be 1 or more (or no limit), got {self.max}")

    @property
    def done(self) -> bool:
        return self.max is not None and self.taken >= self.max

    def matches_name(self, mangled: str, demangled: str) -> bool:
        """The pattern is searched in both names, so users may write either form."""
        if self.names is not None and mangled not in self.names and \
                demangled not in self.names:
            return False
        return self._regex is None or bool(self._regex.search(demangled) or
                                           self._regex.search(mangled))

    def consider(self, mangled: str, demangled: str) -> bool:
        """Count this launch; True when it is to be captured."""
        if self.done or not self.matches_name(mangled, demangled):
            return False
        if self.distinct:
            if mangled in self._seen:
                return False
            self._seen.add(mangled)
            self._seen_demangled.add(demangled)
        self.matches += 1
        if self.matches < self.nth:
            return False
        self.taken += 1
        return True

    def seen_names(self) -> set[str]:
        """Names matched so far (with ``distinct``), in whichever form ``names`` gave them."""
        if self.names is None:
            return set()
        return {n for n in self.names if n in self._seen or n in self._seen_demangled}

    def to_json(self) -> dict:
        out = {"kernel": self.kernel, "nth": self.nth, "max": self.max,
               "distinct": self.distinct}
        if self.names is not None:
            out["names"] = list(self.names)
        return out
