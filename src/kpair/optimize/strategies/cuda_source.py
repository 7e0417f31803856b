"""``cuda-source``: a CUDA C kernel rebuilt with other nvcc options and launch shapes.

Candidates are (macro set, nvcc flag set, launch geometry) triples. Flag sets change code
generation, not arithmetic: register caps, ptxas optimisation level, extra vectorisation;
options that change results (``--use_fast_math``, ``--fmad``, ``-ftz``, ``-prec-div``,
``-prec-sqrt``) are refused. Geometry changes come only from the kernel's own
``// kpair: block=... grid=...`` declaration (``kpair.optimize.geometry``), checked against
the captured launch first; without one the captured geometry is kept.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from ...candidate import Candidate
from ...errors import KpairError, UsageError
from ...toolchain import compile_cuda, find_nvcc
from ..geometry import launch_options, parse_geometry
from ..strategy import Context, source_applies, source_builds
from ..workbench import built

FP_UNSAFE = ("--use_fast_math", "-use_fast_math", "--fmad", "-fmad", "-ftz", "--ftz",
             "-prec-div", "--prec-div", "-prec-sqrt", "--prec-sqrt")

DEFAULT_FLAG_SETS: tuple[tuple[str, ...], ...] = (
    ("-O3",), ("-O3", "-Xptxas", "-O3"), ("-O3", "-maxrregcount=32"),
    ("-O3", "-maxrregcount=64"), ("-O3", "-maxrregcount=128"),
    ("-O3", "--extra-device-vectorization"))


def check_flags(flags: Sequence[str], what: str = "nvcc flag set") -> tuple[str, ...]:
    for flag in flags:
        if flag.split("=")[0] in FP_UNSAFE:
            raise UsageError(f"{what} {' '.join(flags)!r}: {flag} changes floating-point "
                             "results; kpair's CUDA strategy never uses it")
    return tuple(flags)


class CudaSource:
    """nvcc options x macro sets x declared launch shapes for a CUDA C kernel."""

    name = "cuda-source"

    def __init__(self, flag_sets: Sequence[Sequence[str]] | None = None):
        self.flag_sets = tuple(check_flags(f) for f in (flag_sets or DEFAULT_FLAG_SETS))

    def applies(self, harness, context: Context) -> str | None:
        return source_applies(harness, context, backend="cuda", language="cuda",
                              called="CUDA C")

    def geometries(self, harness, context: Context) -> tuple[list[dict | None], str | None]:
        geometry = parse_geometry(context.source.path, context.source.kernel)
        if geometry is None:
            return [None], None
        return launch_options(geometry, harness.snapshot.manifest, harness.snapshot.kernarg())

    def candidates(self, harness, context: Context) -> Iterator[Candidate]:
        src = context.source
        arch = context.arch or harness.snapshot.manifest.arch
        flag_sets = [check_flags(f) for f in context.flag_sets] if context.flag_sets \
            else self.flag_sets
        launches, why_not = self.geometries(harness, context)
        for n, defines, macros, flags in source_builds(context, flag_sets):
            out = Path(context.work) / f"cuda-{n:03d}.cubin"
            cmd = shlex.join([find_nvcc(), "-cubin", f"-arch={arch}", *flags,
                              *(f"-D{k}={v}" for k, v in macros.items()), "-o", str(out),
                              str(src.path)])
            params = {"flags": list(flags), "defines": macros}
            if why_not:  # the declared geometry was refused: say so in every attempt
                params["geometry_refused"] = why_not
            label = " ".join([*(f"-D{k}={v}" for k, v in defines.items()), *flags])
            try:
                compile_cuda(src.path, out, arch=arch, flags=flags, defines=macros)
            except KpairError as e:
                yield Candidate(label=label, kernel=src.kernel, strategy=self.name,
                                source=str(src.path), build=cmd, params=params,
                                build_error=str(e).splitlines()[-1][:300])
                continue
            code = built(out, src.kernel, strategy=self.name, source=str(src.path),
                         build=cmd)
            for launch in launches:
                shape = "" if launch is None else \
                    f" block={'x'.join(map(str, launch['block']))}"
                yield replace(code, label=label + shape, launch_override=launch,
                              params={**params, "launch": launch})
