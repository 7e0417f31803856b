"""``host-c``: a C kernel rebuilt with other compiler options and the user's macro sets.

Candidates are every (macro set, flag set) pair: the source's own build (no macros) and each
``-D`` set the user gives (``--variant KP_VARIANT=1``), each with every flag set. The default
flag sets leave the floating-point semantics alone: kpair's base flags keep
``-ffp-contract=off -fno-fast-math``, and flags that let the compiler reassociate or
approximate (``-ffast-math``, ``-Ofast``, ...) are refused outright — a byte-exact harness
would fail them, and a tolerance harness should get its candidates from source changes whose
author says why, not from a switch. ``-march=native`` is opt-in (``native=True``): the binary
then runs only on CPUs with this one's instruction set, which a published harness may not meet.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator, Sequence
from pathlib import Path

from ...candidate import Candidate
from ...errors import KpairError, UsageError
from ...toolchain import BASE_FLAGS, compile_shared, find_cc
from ..strategy import Context, source_applies, source_builds
from ..workbench import built

#: Options that change floating-point results (reassociation, approximations, contraction).
FP_UNSAFE = ("-ffast-math", "-Ofast", "-funsafe-math-optimizations", "-fassociative-math",
             "-freciprocal-math", "-ffp-contract=fast", "-ffp-contract=on", "-ffinite-math-only",
             "-fno-signed-zeros", "-fno-trapping-math", "-fcx-limited-range")

DEFAULT_FLAG_SETS: tuple[tuple[str, ...], ...] = (
    ("-O2",), ("-O3",), ("-O3", "-funroll-loops"), ("-O2", "-fno-tree-vectorize"),
    ("-O3", "-fno-tree-vectorize", "-funroll-loops"))


def check_flags(flags: Sequence[str], what: str = "flag set") -> tuple[str, ...]:
    """Refuse options that change floating-point results (see the module docstring)."""
    for flag in flags:
        if flag in FP_UNSAFE or flag.startswith(("-ffast-math", "-Ofast")):
            raise UsageError(f"{what} {' '.join(flags)!r}: {flag} changes floating-point "
                             "results; kpair's C strategy never uses it")
    return tuple(flags)


def parse_variant(text: str) -> dict[str, str]:
    """``"KP_VARIANT=1,TILE=32"`` (or space separated) → {"KP_VARIANT": "1", "TILE": "32"}."""
    out = {}
    for word in text.replace(",", " ").split():
        name, eq, value = word.partition("=")
        if not name.isidentifier():
            raise UsageError(f"--variant {text!r}: {name!r} is not a macro name")
        out[name] = value if eq else "1"
    if not out:
        raise UsageError("--variant needs at least one NAME=VALUE")
    return out


def parse_flags(text: str) -> tuple[str, ...]:
    return check_flags(shlex.split(text), f"--flags {text!r}:")


def _label(defines: dict, flags: Sequence[str]) -> str:
    macros = " ".join(f"-D{k}={v}" for k, v in defines.items())
    return " ".join(p for p in (macros, " ".join(flags)) if p)


class HostC:
    """Compiler options x macro sets for a C kernel on the host backend."""

    name = "host-c"

    def __init__(self, flag_sets: Sequence[Sequence[str]] | None = None, *,
                 native: bool = False):
        sets = [check_flags(f) for f in (flag_sets or DEFAULT_FLAG_SETS)]
        if native:
            sets += [(*f, "-march=native") for f in sets]
        self.flag_sets = tuple(sets)

    def applies(self, harness, context: Context) -> str | None:
        return source_applies(harness, context, backend="host", language="c", called="C")

    def candidates(self, harness, context: Context) -> Iterator[Candidate]:
        src = context.source
        flag_sets = [check_flags(f) for f in context.flag_sets] if context.flag_sets \
            else self.flag_sets
        for n, defines, macros, flags in source_builds(context, flag_sets):
            out = Path(context.work) / f"host-c-{n:03d}.so"
            cmd = shlex.join([find_cc(), *BASE_FLAGS, *flags,
                              *(f"-D{k}={v}" for k, v in macros.items()), "-o", str(out),
                              str(src.path), "-lm"])
            params = {"flags": list(flags), "defines": macros}
            common = dict(label=_label(defines, flags), strategy=self.name,
                          source=str(src.path), build=cmd, params=params)
            try:
                compile_shared(src.path, out, flags=flags, defines=macros)
            except KpairError as e:
                yield Candidate(kernel=src.kernel,
                                build_error=str(e).splitlines()[-1][:300], **common)
                continue
            yield built(out, src.kernel, **common)
