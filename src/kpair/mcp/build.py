"""Candidates of every form built into a code object, ABI checked before anything launches.

``build_candidate(harness, form, ...)`` returns a built ``kpair.candidate.Candidate``: the
code object's bytes, the kernel name in it, the launch it needs (Triton: block from
num_warps, shared memory, grid recomputed; ``kpair.optimize.strategies.triton.build_config``,
as the ``triton`` strategy builds its configs) and its provenance. Forms: C (host), CUDA
C++, PTX (parameters checked against ref's layout, then ``ptxas``), Triton source (compiled
with the captured signature and config), edited AMDGPU assembly (``kpair asm``), or a ready
code object. A cubin, whatever made it, has its
``.nv.info`` parameter layout checked against the snapshot's kernarg layout too.
"""

from __future__ import annotations

import base64
import tempfile
from dataclasses import replace
from pathlib import Path

from ..amd.asm import SOURCE, assemble, disassemble
from ..candidate import Candidate
from ..errors import KpairError, UsageError
from ..optimize.strategies import triton as tri
from ..optimize.workbench import built
from ..ptx import assemble_with, check_abi, cubin_params, cubin_text, entries, entry_params
from ..snapshot import detect_format
from ..toolchain import compile_cuda, compile_shared


def _ref_layout(h) -> tuple[list[tuple[int, int]], list[str]]:
    m = h.snapshot.manifest
    return [(p.offset, p.size) for p in m.kernarg.params], [p.name for p in m.kernarg.params]


def _check_cubin(h, image: bytes, kernel: str, what: str) -> None:
    layout, names = _ref_layout(h)
    check_abi(cubin_params(image, kernel), layout, ref_names=names, what=what)


def build_candidate(h, form: str, *, code: str | None, path: str | None,
                    kernel: str | None, ptxas_options: list[str], config: dict | None
                    ) -> Candidate:
    """A candidate of ``form`` for the harness ``h`` built (see the module docstring)."""
    kernel = kernel or h.opt.kernel
    arch = h.snapshot.manifest.arch
    text = code if code is not None else None
    if form != "binary" and text is None:
        text = Path(path).read_text() if Path(path).is_file() else None
        if text is None:
            raise UsageError(f"candidate {path}: no such file")
    with tempfile.TemporaryDirectory(prefix="kpair-mcp-build-") as tmp:
        tmp = Path(tmp)
        if form == "binary":
            image = decode_binary(code, path)
            if not image:
                raise UsageError("the candidate is empty")
            if _format(image) == "cubin":
                _check_cubin(h, image, kernel, "the candidate cubin")
            return built(image, kernel, build="given code object")
        if form == "c":
            if h.backend != "host":
                raise UsageError(f"C source builds host kernels; this operator runs on "
                                 f"{h.backend}")

            (tmp / "cand.c").write_text(text)
            out = compile_shared(tmp / "cand.c", tmp / "cand.so")
            return built(out.read_bytes(), kernel, source="C source (submitted)",
                         build="cc -shared -fPIC -O2 (kpair.toolchain)")
        if form == "cuda":
            _need(h, "cuda", form)

            (tmp / "cand.cu").write_text(text)
            out = compile_cuda(tmp / "cand.cu", tmp / "cand.cubin", arch=arch)
            image = out.read_bytes()
            _check_cubin(h, image, kernel, "the candidate")
            return built(image, kernel, source="CUDA source (submitted)",
                         build=f"nvcc -cubin -arch={arch} -O3")
        if form == "ptx":
            _need(h, "cuda", form)

            names = entries(text)
            name = kernel if kernel in names else (names[0] if len(names) == 1 else kernel)
            layout, ref_names = _ref_layout(h)
            check_abi(entry_params(text, name), layout, ref_names=ref_names,
                      what="the candidate PTX")
            options = ptxas_defaults(h, ptxas_options)
            image, cmd = assemble_with(text, arch=arch, options=options)
            _check_cubin(h, image, name, "the assembled PTX")
            return built(image, name, source="PTX (submitted)",
                         build=" ".join([Path(cmd[0]).name, *cmd[1:]]),
                         params={"ptxas_options": options, "ptxas": cmd[0]})
        if form == "triton":
            _need(h, "cuda", form)
            return _triton(h, text, config or {}, tmp)
        if form == "amdgpu-asm":
            _need(h, "hip", form)

            ref = tmp / "ref.co"
            ref.write_bytes(h.binary(h.ref))
            disassemble(ref, tmp / "asm")
            (tmp / "asm" / SOURCE).write_text(text)
            out = assemble(tmp / "asm", tmp / "cand.co")
            return built(out.read_bytes(), kernel, source="AMDGPU assembly (submitted)",
                         build="kpair asm assemble")
    raise UsageError(f"unknown form {form!r}")


def triton_facts(h) -> dict:
    """What a Triton source candidate may change, for ``describe``: the captured kernel's
    function, constexprs (by name), num_warps / num_stages / maxnreg, the block-size
    constexprs whose change the launch can follow (``tunable_blocks``) and the grid formula;
    or ``{"error": why not}``."""

    info = tri.for_harness(h)
    if info is None:
        return {"error": "no captured Triton metadata (not a Triton launch, or its source "
                         "was not recorded whole)"}
    if isinstance(info, str):
        return {"error": info}
    formula = tri.dispatch_formula(info, h.snapshot.manifest, h.snapshot.kernarg())
    return {"function": info.function,
            "constants": {k: v for k, v in info.constants.items()
                          if isinstance(v, (int, float, bool, str)) or v is None},
            **{k: info.metadata.get(k) for k in ("num_warps", "num_stages", "maxnreg",
                                                 "enable_fp_fusion")},
            "tunable_blocks": tri.tunable_blocks(info, formula is not None),
            "grid_formula": formula, "reduces": info.reduces}


def recompiled_ptx(h, work: Path) -> tuple[str | None, str]:
    """ref's PTX by compiling the captured Triton source with the captured config (when
    capture did not keep the PTX): (PTX or None, how, or why not). The cubin of that
    compilation is compared with ref's code object, and the answer says whether it is the
    same."""

    m = h.snapshot.manifest
    info = tri.for_harness(h)
    if info is None:
        return None, "no captured Triton source to compile"
    if isinstance(info, str):
        return None, info
    config = {"num_warps": int(info.metadata.get("num_warps") or 4),
              "num_stages": int(info.metadata.get("num_stages") or 3),
              "maxnreg": info.metadata.get("maxnreg"), "constants": {}}
    work.mkdir(parents=True, exist_ok=True)
    try:
        fn = tri.load_function(info, work)
        built = tri.compile_config(info, fn, config, m.arch)
    except Exception as e:  # noqa: BLE001 - Triton's own errors are many; say which
        return None, f"compiling the captured Triton source failed: {type(e).__name__}: " \
                     f"{str(e).strip()[:300]}"
    if not built.get("ptx"):
        return None, "Triton's compiled kernel has no PTX"
    try:
        same = cubin_text(built["cubin"]) == cubin_text(h.binary(h.ref))
    except KpairError:
        same = False
    return built["ptx"], ("the captured Triton source compiled again with the captured "
                          "config (asm['ptx']); its cubin's machine code (.text) is " +
                          ("identical to ref's" if same else
                           "NOT identical to ref's (another Triton or ptxas?)"))


def ptxas_defaults(h, options: list[str]) -> list[str]:
    """``options`` plus what ref's own build used and the PTX does not say: Triton runs
    ptxas with ``--fmad=false`` for a kernel compiled without FP fusion, and without it
    ptxas would contract ref's separate multiplies and adds (other rounding)."""

    info = tri.kernel_info(h.snapshot.manifest.provenance or {})
    if info is not None and info.metadata.get("enable_fp_fusion") is False \
            and not any(o.startswith(("--fmad", "-fmad")) for o in options):
        return [*options, "--fmad=false"]
    return list(options)


def decode_binary(code: str | None, path: str | None) -> bytes:
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise UsageError(f"candidate {p}: no such file")
        return p.read_bytes()
    try:
        return base64.b64decode(code or "", validate=True)
    except ValueError:
        raise UsageError("'code' of a binary candidate must be base64") from None


def _need(h, backend: str, form: str) -> None:
    if h.backend != backend:
        raise UsageError(f"a {form} candidate needs a {backend} operator; this one runs on "
                         f"{h.backend}")


def _format(image: bytes) -> str | None:
    try:
        return detect_format(image)
    except KpairError:
        return None


def _triton(h, source: str, config: dict, tmp: Path) -> Candidate:
    """The submitted source compiled as the captured kernel was (signature, specialisation,
    constexprs), with ``config`` (num_warps, num_stages, maxnreg, constants) over the
    captured config; the launch follows the config, the grid recomputed from its formula."""
    m = h.snapshot.manifest
    info = tri.for_harness(h)
    if info is None:
        raise UsageError("this operator has no captured Triton metadata (not a Triton "
                         "launch, or its source was not recorded whole)")
    if isinstance(info, str):
        raise KpairError(info)
    if f"def {info.function}(" not in source:
        raise UsageError(f"the source must define the captured kernel {info.function}(...)")
    unknown = set(config) - {"num_warps", "num_stages", "maxnreg", "constants"}
    if unknown:
        raise UsageError(f"unknown config key {sorted(unknown)[0]!r} (num_warps, num_stages, "
                         "maxnreg, constants)")
    constants = dict(config.get("constants") or {})
    bad = [k for k in constants if k not in info.constants]
    if bad:
        raise UsageError(f"{bad[0]!r} is not a constexpr of {info.function} "
                         f"({', '.join(info.constants)})")
    chosen = {"num_warps": int(config.get("num_warps") or info.metadata.get("num_warps", 4)),
              "num_stages": int(config.get("num_stages") or info.metadata.get("num_stages", 3)),
              "maxnreg": config.get("maxnreg"), "constants": constants}
    edited = replace(info, source=source)
    kernarg = h.snapshot.kernarg()
    formula = tri.dispatch_formula(info, m, kernarg)
    if constants and formula is None:
        raise UsageError("the grid formula of this kernel is unknown, so its block-size "
                         "constexprs cannot change (num_warps and num_stages can)")
    fn = tri.load_function(edited, tmp)
    code = tri.build_config(edited, fn, chosen, arch=m.arch, formula=formula,
                            values=tri.scalars(info, m, kernarg))
    _check_cubin(h, code.image, code.kernel, "the compiled Triton kernel")
    label = " ".join(f"{k}={v}" for k, v in chosen.items() if k != "constants" and v)
    return replace(code, source="Triton source (submitted)",
                   build=f"triton.compile({info.function}, {label} {constants or ''})".strip(),
                   params={k: v for k, v in chosen.items() if v is not None})
