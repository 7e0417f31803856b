"""What a strategy is: something that proposes candidates for one harness.

``Strategy.candidates(harness, context)`` yields ``kpair.candidate.Candidate`` objects,
built: a code object (or ``build_error``, the reason it could not be built) with the kernel
name, an optional launch override and its provenance (source, build command, parameters,
``reorders_fp``). Strategies build; they never judge — ``kpair.optimize.search`` judges every
candidate in a ``kpair.session.Session``.

``KernelSource`` says where a kernel's source is and how ref was built from it. It comes
from the user (``--source FILE --kernel NAME``) or from the snapshot's provenance, where
``record_call(..., provenance={"kernel_source": {...}})`` can declare it
(``KernelSource.from_provenance``); nothing is guessed from a binary.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..candidate import Candidate
from ..errors import UsageError

if TYPE_CHECKING:
    from ..harness import Harness

#: Languages a KernelSource can be in, by file suffix.
LANGUAGES = {".c": "c", ".cu": "cuda"}
#: The snapshot provenance key that declares a kernel's source.
PROVENANCE_KEY = "kernel_source"


@dataclass(frozen=True)
class KernelSource:
    """A kernel's source file, the symbol in it and the macros ref was built with."""

    path: Path
    kernel: str
    defines: dict[str, Any] = field(default_factory=dict)

    @property
    def language(self) -> str:
        try:
            return LANGUAGES[self.path.suffix]
        except KeyError:
            raise UsageError(f"{self.path}: a kernel source is C (.c) or CUDA C (.cu)") from None

    @classmethod
    def given(cls, path: str | os.PathLike, kernel: str, defines: dict | None = None
              ) -> KernelSource:
        p = Path(path)
        if not p.is_file():
            raise UsageError(f"--source {p}: no such file")
        src = cls(p.resolve(), kernel, dict(defines or {}))
        src.language  # noqa: B018 - refuses an unknown suffix here, before any build
        return src

    @classmethod
    def from_provenance(cls, provenance: dict, default_kernel: str) -> KernelSource | None:
        """The source a snapshot declares (``{"path", "kernel", "defines"}``), if it exists."""
        decl = provenance.get(PROVENANCE_KEY)
        if not isinstance(decl, dict) or not isinstance(decl.get("path"), str):
            return None
        path = Path(decl["path"])
        if not path.is_file() or path.suffix not in LANGUAGES:
            return None
        defines = decl.get("defines") if isinstance(decl.get("defines"), dict) else {}
        return cls(path, str(decl.get("kernel") or default_kernel), defines)

    def provenance(self) -> dict:
        """What ``record_call(provenance=...)`` takes to declare this source."""
        return {PROVENANCE_KEY: {"path": str(self.path), "kernel": self.kernel,
                                 "defines": self.defines}}


@dataclass(frozen=True)
class Context:
    """What strategies may use besides the harness: a directory to build in, the kernel's
    source (if known), the user's ``-D`` macro sets and compiler flag sets (None: the
    strategy's own), and the architecture code is built for."""

    work: Path
    source: KernelSource | None = None
    variants: tuple[dict[str, Any], ...] = ()
    flag_sets: tuple[tuple[str, ...], ...] | None = None
    arch: str | None = None
    triton: dict | None = None


def source_applies(harness: Harness, context: Context, *, backend: str, language: str,
                   called: str) -> str | None:
    """Why a strategy that rebuilds a ``language`` source for ``backend`` cannot work here
    (``called``: the language's name for people), or None."""
    if harness.backend != backend:
        return f"the harness runs on {harness.backend}, not {backend}"
    if context.source is None:
        return f"no {called.split()[0]} source is known for this kernel (give --source FILE " \
               "--kernel NAME)"
    if context.source.language != language:
        return f"{context.source.path.name} is not {called}"
    return None


def source_builds(context: Context, flag_sets: Sequence[tuple[str, ...]]
                  ) -> Iterator[tuple[int, dict[str, Any], dict[str, Any], tuple[str, ...]]]:
    """Every build of ``context.source`` to try, numbered from 1: (n, the variant's own
    macros, every macro the build defines, flags), for each macro set — the source's own
    build (no variant) first, then the user's ``-D`` sets — times each flag set."""
    n = 0
    for defines in ({}, *context.variants):
        for flags in flag_sets:
            n += 1
            yield n, defines, {**context.source.defines, **defines}, tuple(flags)


def first_repeat(names: Sequence[str]) -> str | None:
    """The first of ``names`` given more than once, or None when each is given once."""
    return next((n for n in names if names.count(n) > 1), None)


class Strategy(Protocol):
    """Proposes candidates for one harness; ``applies`` says why not when it cannot."""

    name: str

    def applies(self, harness: Harness, context: Context) -> str | None:
        """None when this strategy can propose candidates here; otherwise why not."""

    def candidates(self, harness: Harness, context: Context) -> Iterator[Candidate]:
        """Build and yield candidates (a failed build is one with ``build_error``)."""


__all__ = ["Context", "KernelSource", "LANGUAGES", "PROVENANCE_KEY", "Strategy",
           "first_repeat", "source_applies", "source_builds"]
