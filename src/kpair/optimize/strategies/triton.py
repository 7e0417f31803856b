"""``triton``: a captured Triton kernel recompiled with other launch and block configs.

``kpair capture`` records, for a Triton launch, the kernel's Python source, its signature,
constexpr values, specialisation attributes and compile metadata (``kpair.capture.
triton_meta``; snapshot provenance key ``triton``). This strategy recompiles that source with
other ``num_warps``, ``num_stages``, ``maxnreg`` and block-size constexprs, with the same
signature and specialisation, so the kernarg layout is unchanged and the captured dispatch
replays as it is. What a config changes about the launch goes into the launch override:
``block`` = 32 x num_warps, ``dynamic_shared_bytes`` = the new kernel's shared memory, and
the grid when a block size sets it:

* Inductor kernels (``xnumel``/``ynumel`` parameters, ``XBLOCK``/``YBLOCK`` constexprs):
  grid = (cdiv(xnumel, XBLOCK), cdiv(ynumel, YBLOCK), 1); ``RBLOCK``/``R0_BLOCK`` is a loop
  tile (no grid change) and is changed only where the source loops over it (a persistent
  reduction needs its whole row in one block);
* any kernel whose source declares ``# kpair: grid=EXPR`` over its constexprs and scalar
  parameters (``kpair.optimize.geometry`` syntax).

Either formula must reproduce the captured grid at the captured constants, or block sizes are
left alone. The configs Inductor's autotuner was given for the kernel (recorded at capture as
``autotune_configs``) come first; then configs are enumerated cheap-first (one knob changed,
then two, ...; at each count a register cap last; no pipelining depths for a kernel without
a loop) up to a limit. Configs of several CTAs a cluster (``num_ctas`` > 1) are not tried:
replay launches without cluster dimensions.
Everything up to compiling is pure and tested on recorded metadata; compiling needs Triton
(imported lazily; ``pip install triton``) and runs on the machine with the GPU.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import itertools
import json
import re
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ...candidate import Candidate
from ...errors import BackendUnavailable, KpairError, UsageError
from ..geometry import evaluate
from ..strategy import Context

PROVENANCE_KEY = "triton"
_BLOCK = re.compile(r"^(?:[XYZ]BLOCK|R\d?_?BLOCK|BLOCK_[A-Z0-9_]+|[A-Z0-9_]*BLOCK_SIZE[A-Z0-9_]*)$")
_GRID_DECL = re.compile(r"#\s*kpair:\s*grid=(.*)$", re.MULTILINE)
_SIG_FORMATS = {"i1": "<b", "i8": "<b", "u8": "<B", "i16": "<h", "u16": "<H", "i32": "<i",
                "u32": "<I", "i64": "<q", "u64": "<Q", "fp32": "<f", "fp64": "<d"}
_REDUCES = ("tl.sum", "tl.reduce", "tl.max", "tl.min", "tl.dot", "tl.cumsum", "RBLOCK",
            "R0_BLOCK", "tl.atomic")
DEFAULT_LIMIT = 48


@dataclass(frozen=True)
class TritonKernel:
    """What capture recorded about one Triton kernel, normalised."""

    function: str
    source: str
    signature: dict[str, str]
    constants: dict[str, Any]       # constexpr name -> value
    raw_constants: dict[str, Any]   # as recorded (keys may be "(3,)" paths)
    attrs: dict[str, Any]
    metadata: dict[str, Any]
    inductor: bool
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def params(self) -> list[str]:
        """The names of the kernarg parameters, in order (constexprs are compiled in)."""
        return [n for n, t in self.signature.items()
                if t != "constexpr" and n not in self.constants]

    @property
    def loops(self) -> bool:
        """The source has a loop (``num_stages`` can change the code)."""
        return re.search(r"^\s*for\s", self.source, re.MULTILINE) is not None

    @property
    def reduces(self) -> bool:
        return any(word in self.source for word in _REDUCES)


def _key_name(key: str, names: list[str]) -> str | None:
    if key in names:
        return key
    try:
        path = ast.literal_eval(key)
    except (ValueError, SyntaxError):
        return None
    if isinstance(path, tuple) and len(path) == 1 and isinstance(path[0], int) \
            and path[0] < len(names):
        return names[path[0]]
    return None


def _as_dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def kernel_info(provenance: dict) -> TritonKernel | None:
    """The Triton metadata of a snapshot's provenance, or None if there is none to use.

    Constexpr values are those Inductor's ``triton_meta`` fixes, then those the launch
    recorded; an Inductor launch recorded with its compiled kernel's config
    (``launched_config``) has that config applied here, one recorded only with its
    autotuner's configs (``launcher_configs``) is settled by ``resolve`` on the dispatch."""
    meta = provenance.get(PROVENANCE_KEY)
    if not isinstance(meta, dict) or not isinstance(meta.get("source"), str) \
            or meta.get("source_truncated"):
        return None
    tmeta = _as_dict(meta.get("triton_meta"))
    signature = meta.get("signature") or tmeta.get("signature")
    if not isinstance(signature, dict):
        return None
    names = list(signature)
    raw = {**_as_dict(tmeta.get("constants")), **_as_dict(meta.get("constants"))}
    constants = {}
    for k, v in raw.items():
        name = _key_name(str(k), names)
        if name is not None:
            constants[name] = v
    m = re.search(r"def\s+(\w+)\s*\(", meta["source"])
    function = meta.get("function") or (m.group(1) if m else None)
    if not function:
        return None
    tattrs = tmeta.get("configs")
    attrs = meta.get("attrs") or (tattrs[0] if isinstance(tattrs, list) and tattrs
                                  and isinstance(tattrs[0], dict) else {})
    metadata = _as_dict(meta.get("metadata"))
    if "enable_fp_fusion" in tmeta and "enable_fp_fusion" not in metadata:
        metadata = {**metadata, "enable_fp_fusion": tmeta["enable_fp_fusion"]}  # Inductor's
    info = TritonKernel(function=function, source=meta["source"], signature=dict(signature),
                      constants=constants, raw_constants=raw, attrs=attrs,
                      metadata=metadata,
                      inductor="inductor_meta" in meta or "triton_meta" in meta,
                      extra={k: meta[k] for k in ("configs", "inductor_meta",
                                                  "launcher_configs", "autotune_configs")
                             if k in meta})
    launched = meta.get("launched_config")
    return with_config(info, launched) if isinstance(launched, dict) else info


def with_config(info: TritonKernel, config: dict) -> TritonKernel:
    """``info`` with a recorded ``triton.Config`` (``{"kwargs", "num_warps", ...}``) applied:
    its constexprs and, where the compiled kernel's own metadata is absent, its options."""
    kwargs = {k: v for k, v in _as_dict(config.get("kwargs")).items() if k in info.signature}
    metadata = dict(info.metadata)
    for key in ("num_warps", "num_stages", "maxnreg"):
        if key not in metadata and config.get(key) is not None:
            metadata[key] = config[key]
    return replace(info, constants={**info.constants, **kwargs},
                   raw_constants={**info.raw_constants, **kwargs}, metadata=metadata)


def resolve(info: TritonKernel, manifest, kernarg: bytes) -> TritonKernel | str:
    """The info of the config that made this dispatch, or why it is not known.

    A launch recorded with its compiled kernel is known already. Otherwise the autotuner's
    configs that could have made it — ``32 * num_warps`` threads a block and, where the grid
    formula is known, the captured grid — must agree on one."""
    if "num_warps" in info.metadata:
        return info
    recorded = [c for c in info.extra.get("launcher_configs") or [] if isinstance(c, dict)]
    if not recorded:
        return info if not info.inductor else \
            "the autotuner's configs were not recorded, so the config that ran is unknown"
    block = tuple(manifest.launch.block)
    fits = []
    for c in recorded:
        candidate = with_config(info, c)
        if 32 * int(candidate.metadata.get("num_warps") or 4) != block[0]:
            continue
        if grid_formula(candidate) is not None and \
                dispatch_formula(candidate, manifest, kernarg) is None:
            continue
        fits.append(candidate)
    distinct = {repr((c.constants, c.metadata)) for c in fits}
    if len(distinct) != 1:
        return (f"{len(fits)} of the {len(recorded)} recorded autotuner configs fit the "
                f"dispatch (block {list(block)}, grid {list(manifest.launch.grid)}): the "
                "config that ran is unknown")
    return fits[0]


def for_harness(harness) -> TritonKernel | str | None:
    """The Triton kernel a harness's snapshot captured, settled on its dispatch
    (``resolve``): None when the snapshot holds no usable Triton metadata, a string when
    the config that ran is unknown."""
    m = harness.snapshot.manifest
    info = kernel_info(m.provenance or {})
    return None if info is None else resolve(info, m, harness.snapshot.kernarg())


def scalars(info: TritonKernel, manifest, kernarg: bytes) -> dict[str, int | float]:
    """Scalar kernarg values by their Triton parameter names."""
    out: dict[str, int | float] = {}
    params = list(manifest.kernarg.params)
    for name, param in zip(info.params, params, strict=False):
        fmt = _SIG_FORMATS.get(info.signature.get(name, ""))
        if fmt and struct.calcsize(fmt) <= param.size:
            out[name] = struct.unpack_from(fmt, kernarg, param.offset)[0]
    return out


def grid_formula(info: TritonKernel) -> str | None:
    """The grid as an expression over constexprs and scalars (None: not known)."""
    m = _GRID_DECL.search(info.source)
    if m:
        return m.group(1).strip()
    if info.inductor and "xnumel" in info.signature and "XBLOCK" in info.constants:
        if "ynumel" in info.signature and "YBLOCK" in info.constants:
            return "(cdiv(xnumel, XBLOCK), cdiv(ynumel, YBLOCK))"
        return "cdiv(xnumel, XBLOCK)"
    return None


def dispatch_formula(info: TritonKernel, manifest, kernarg: bytes) -> str | None:
    """The grid formula, if it gives this dispatch's grid at its constants and scalars."""
    formula = grid_formula(info)
    if formula is None:
        return None
    try:
        grid = grid_for(formula, info.constants, scalars(info, manifest, kernarg))
    except UsageError:
        return None
    return formula if grid == tuple(manifest.launch.grid) else None


def grid_for(formula: str, constants: dict, values: dict) -> tuple[int, int, int]:
    got = evaluate(formula, {**values, **{k: v for k, v in constants.items()
                                          if isinstance(v, (int, float))
                                          and not isinstance(v, bool)}})
    dims = [int(d) for d in (got if isinstance(got, tuple) else (got,))]
    if any(d < 1 for d in dims) or not 1 <= len(dims) <= 3:
        raise UsageError(f"grid {formula!r} gives {dims}")
    return tuple(dims + [1] * (3 - len(dims)))  # type: ignore[return-value]


def tunable_blocks(info: TritonKernel, grid_known: bool) -> list[str]:
    """Block-size constexprs this kernel's configs may change."""
    out = []
    looped = re.search(r"for\s+r\d?_?offset\s+in\s+(?:tl\.)?range", info.source) is not None
    for name, value in info.constants.items():
        if not _BLOCK.match(name) or not isinstance(value, int) or isinstance(value, bool) \
                or value < 1 or value & (value - 1):
            continue
        if name.startswith("R") and name[1:2] in ("B", "0", "_"):  # RBLOCK / R0_BLOCK
            if looped:
                out.append(name)
        elif grid_known:
            out.append(name)
    return out


def _around(value: int, lo: int, hi: int) -> list[int]:
    return [v for v in (value, value // 2, value * 2) if lo <= v <= hi]


def source_key(source: str, function: str, signature: dict) -> str:
    """The identity of a Triton kernel's code across compilations: its source with its own
    name replaced (Inductor numbers kernels in the order it generates them) and its
    signature."""
    text = re.sub(rf"\b{re.escape(function)}\b", "KERNEL", source).strip()
    return hashlib.sha256(json.dumps([text, sorted(signature.items())]).encode()).hexdigest()


def info_key(info: TritonKernel) -> str:
    return source_key(info.source, info.function, info.signature)


def config_of(info: TritonKernel) -> dict[str, Any]:
    """The config ``info`` was compiled with, as ``configs`` writes configs (every block-size
    constexpr it has)."""
    meta = info.metadata
    return {"num_warps": int(meta.get("num_warps") or 4),
            "num_stages": int(meta.get("num_stages") or 3), "maxnreg": meta.get("maxnreg"),
            "constants": {n: v for n, v in info.constants.items() if _BLOCK.match(n)}}


def fit_config(info: TritonKernel, recorded: dict, *, grid_known: bool) -> dict[str, Any] | str:
    """A recorded config (``{"kwargs" or "constants", "num_warps", ...}``) as this dispatch
    can take it (block sizes only where they are tunable here, every other constexpr as
    captured), or why it cannot."""
    blocks = tunable_blocks(info, grid_known)
    kwargs = _as_dict(recorded.get("kwargs", recorded.get("constants")))
    for k, v in kwargs.items():
        if k not in blocks and (k not in info.constants or info.constants[k] != v):
            return (f"it sets {k}={v}, which this dispatch "
                    + ("does not have" if k not in info.constants else
                       f"cannot change (captured {info.constants[k]}"
                       + ("; no grid formula" if not grid_known else "") + ")"))
    if int(recorded.get("num_ctas") or 1) != 1:
        return f"it launches clusters of {recorded['num_ctas']} CTAs; replay launches none"
    captured = config_of(info)
    try:
        return {"num_warps": int(recorded.get("num_warps") or captured["num_warps"]),
                "num_stages": int(recorded.get("num_stages") or captured["num_stages"]),
                "maxnreg": recorded.get("maxnreg"),
                "constants": {n: int(kwargs.get(n, info.constants[n])) for n in blocks}}
    except (TypeError, ValueError):
        return f"it is not a config of integers: {recorded!r}"


def is_captured(info: TritonKernel, config: dict, *, grid_known: bool) -> bool:
    """Whether ``config`` (as ``fit_config`` gives it) is the captured one: ref itself."""
    blocks = tunable_blocks(info, grid_known)
    captured = config_of(info)
    return {**captured, "constants": {n: info.constants[n] for n in blocks}} == config


def seed_configs(info: TritonKernel, *, grid_known: bool) -> list[dict[str, Any]]:
    """The configs Inductor's autotuner was given for this kernel (``autotune_configs``, else
    the ``launcher_configs`` it compiled), in its order, that this dispatch can take
    (``fit_config``), the captured one left out."""
    recorded = info.extra.get("autotune_configs") or info.extra.get("launcher_configs") or []
    out: list[dict[str, Any]] = []
    for c in recorded:
        config = fit_config(info, c, grid_known=grid_known) if isinstance(c, dict) else "-"
        if isinstance(config, dict) and config not in out \
                and not is_captured(info, config, grid_known=grid_known):
            out.append(config)
    return out


def configs(info: TritonKernel, *, grid_known: bool, limit: int = DEFAULT_LIMIT
            ) -> list[dict[str, Any]]:
    """Configs to try: Inductor's own (``seed_configs``) first, then fewest changes from the
    captured one; the captured one is left out (it is ref). Each: {"num_warps",
    "num_stages", "maxnreg", "constants": {...}}."""
    meta = info.metadata
    warps = int(meta.get("num_warps") or 4)
    stages = int(meta.get("num_stages") or 3)
    maxnreg = meta.get("maxnreg")
    knobs: dict[str, list] = {
        "num_warps": _around(warps, 1, 32),
        # Software pipelining applies to loops; without one every depth builds the same code.
        "num_stages": [stages] + ([s for s in (1, 2, 3, 4) if s != stages]
                                  if info.loops else []),
        "maxnreg": [maxnreg] + [r for r in (None, 128, 64) if r != maxnreg],
    }
    blocks = tunable_blocks(info, grid_known)
    for name in blocks:
        knobs[name] = _around(info.constants[name], 1, 4096)
    names = list(knobs)
    out = []
    for values in itertools.product(*knobs.values()):
        moved = [n for n, v in zip(names, values, strict=True) if v != knobs[n][0]]
        if moved:
            # A register cap seldom changes short kernels' code: after the other knobs.
            out.append(((len(moved), "maxnreg" in moved), values))
    out.sort(key=lambda cv: cv[0])  # stable: product order within one rank
    result = seed_configs(info, grid_known=grid_known)[:limit]
    for _, values in out:
        if len(result) >= limit:
            break
        c = dict(zip(names, values, strict=True))
        config = {"num_warps": c["num_warps"], "num_stages": c["num_stages"],
                  "maxnreg": c["maxnreg"], "constants": {n: c[n] for n in blocks}}
        if config not in result:
            result.append(config)
    return result


def launch_override(info: TritonKernel, config: dict, *, shared: int, formula: str | None,
                    values: dict) -> dict:
    """The launch the recompiled kernel needs on the captured dispatch."""
    out: dict[str, Any] = {"block": [32 * config["num_warps"], 1, 1],
                           "dynamic_shared_bytes": shared}
    if formula and config["constants"]:
        out["grid"] = list(grid_for(formula, {**info.constants, **config["constants"]},
                                    values))
    return out


# --------------------------------------------------------------------------- compiling


def _triton():
    try:
        import triton
    except ImportError:
        raise BackendUnavailable("the triton strategy recompiles Triton kernels and needs "
                                 "Triton: pip install triton") from None
    return triton


_HEADER = """import triton
import triton.language as tl
"""
_INDUCTOR_HEADER = """from torch._inductor.runtime import triton_helpers
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
"""


def load_function(info: TritonKernel, where: Path):
    """The kernel's JITFunction, from its recorded source written to a module file (Triton
    reads a function's source back from its file)."""
    triton = _triton()
    path = where / f"kpair_triton_{info.function}.py"
    body = info.source if info.source.lstrip().startswith("@") else \
        "@triton.jit\n" + info.source
    path.write_text(_HEADER + (_INDUCTOR_HEADER if info.inductor else "") + body + "\n")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    fn = getattr(module, info.function)
    if not isinstance(fn, triton.runtime.JITFunction):
        raise KpairError(f"{info.function} did not load as a triton.jit function")
    return fn


def compile_config(info: TritonKernel, fn, config: dict, arch: str) -> dict:
    """Compile one config: {"cubin": bytes, "ptx", "name", "shared",
    "global_scratch_size"}."""
    triton = _triton()
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(info.signature)
    constexprs: dict = {}
    for k, v in info.raw_constants.items():
        name = _key_name(str(k), names)
        if name is not None:
            constexprs[(names.index(name),)] = v
    for name, v in config["constants"].items():
        constexprs[(names.index(name),)] = v
    attrs = {}
    for k, v in (info.attrs or {}).items():
        try:
            key = ast.literal_eval(k) if isinstance(k, str) else k
        except (ValueError, SyntaxError):
            continue
        attrs[key if isinstance(key, tuple) else (key,)] = [tuple(a) for a in v]
    options = {"num_warps": config["num_warps"], "num_stages": config["num_stages"]}
    if config.get("maxnreg"):
        options["maxnreg"] = config["maxnreg"]
    if info.metadata.get("enable_fp_fusion") is False:
        options["enable_fp_fusion"] = False
    capability = int(re.sub(r"\D", "", arch) or 90)
    src = ASTSource(fn, dict(info.signature), constexprs, attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", capability, 32), options=options)
    meta = compiled.metadata
    return {"cubin": compiled.asm["cubin"], "ptx": compiled.asm.get("ptx"),
            "name": meta.name, "shared": int(meta.shared),
            "global_scratch_size": int(getattr(meta, "global_scratch_size", 0) or 0),
            "profile_scratch_size": int(getattr(meta, "profile_scratch_size", 0) or 0)}


def build_config(info: TritonKernel, fn, config: dict, *, arch: str, formula: str | None,
                 values: dict) -> Candidate:
    """``config`` compiled (``compile_config``): a built candidate — the cubin, the kernel
    in it and the launch it needs on the captured dispatch (``launch_override``). A kernel
    that needs global scratch memory the dispatch did not provide is refused (KpairError);
    Triton's own errors propagate."""
    compiled = compile_config(info, fn, config, arch)
    if compiled["global_scratch_size"] > int(info.metadata.get("global_scratch_size") or 0):
        raise KpairError("the kernel needs global scratch memory the captured dispatch did "
                         "not provide")
    return Candidate(compiled["cubin"], compiled["name"], "cubin",
                     launch_override(info, config, shared=compiled["shared"],
                                     formula=formula, values=values))


class TritonRetune:
    """Recompile a captured Triton kernel with other configs (see the module docstring)."""

    name = "triton"

    def __init__(self, limit: int = DEFAULT_LIMIT):
        self.limit = limit

    def applies(self, harness, context: Context) -> str | None:
        if harness.backend != "cuda":
            return f"the harness runs on {harness.backend}; Triton kernels run on cuda"
        info = for_harness(harness)
        if info is None:
            return "the snapshot holds no usable Triton metadata (not a Triton launch, or " \
                   "its source was not recorded whole)"
        return info if isinstance(info, str) else None

    def plan(self, harness) -> tuple[TritonKernel, list[dict], str | None, dict]:
        """(info, configs, grid formula or None, scalar values): everything before compiling."""
        m = harness.snapshot.manifest
        info = for_harness(harness)
        if not isinstance(info, TritonKernel):
            raise KpairError(info or "the snapshot holds no usable Triton metadata")
        kernarg = harness.snapshot.kernarg()
        values = scalars(info, m, kernarg)
        formula = dispatch_formula(info, m, kernarg)  # None: blocks stay as they are
        return info, configs(info, grid_known=formula is not None, limit=self.limit), \
            formula, values

    def candidates(self, harness, context: Context) -> Iterator[Candidate]:
        info, todo, formula, values = self.plan(harness)
        fn = load_function(info, Path(context.work))
        seeds = seed_configs(info, grid_known=formula is not None)
        for n, config in enumerate(todo, 1):
            origin = "inductor autotune config" if config in seeds \
                else "neighbour of the captured config"
            yield _build(info, fn, config, f"triton-{n:03d}", harness, context, formula,
                         values, origin=origin)

    def baselines(self, harness, context: Context, tuned: dict[str, dict[str, dict]]
                  ) -> Iterator[tuple[str, Candidate | None, dict]]:
        """For each mode of ``tuned`` (``kpair.optimize.baseline.tuned_configs`` of that
        mode's capture): (mode, the built config or None, what ``BaselineEntry`` says of it).
        """
        info, _, formula, values = self.plan(harness)
        key, fn = info_key(info), None
        for mode, found in tuned.items():
            hit = found.get(key)
            if hit is None:
                yield mode, None, {"found": False, "reason": "no kernel with this source in "
                                   f"the {mode} capture"}
                continue
            config = fit_config(info, hit["config"], grid_known=formula is not None)
            entry = {"found": True, "kernel": hit["kernel"], "config": hit["config"]}
            if isinstance(config, str):
                yield mode, None, {**entry, "reason": f"not this dispatch's: {config}"}
            elif is_captured(info, config, grid_known=formula is not None):
                yield mode, None, {**entry, "same_as_ref": True, "speedup": 1.0}
            else:
                fn = fn or load_function(info, Path(context.work))
                yield mode, _build(info, fn, config, f"inductor-{mode}", harness, context,
                                   formula, values, origin=f"inductor {mode}"), entry


def _build(info: TritonKernel, fn, config: dict, stem: str, harness, context: Context,
           formula: str | None, values: dict, *, origin: str) -> Candidate:
    """``config`` compiled (``build_config``), kept in ``WORK/<stem>.cubin``: the candidate,
    or why it was not built."""
    arch = context.arch or harness.snapshot.manifest.arch
    label = " ".join(f"{k}={v}" for k, v in
                     [*((k, config[k]) for k in ("num_warps", "num_stages", "maxnreg")),
                      *config["constants"].items()])
    proposed = Candidate(
        label=label, strategy=TritonRetune.name,
        source=f"{info.function} (captured Triton source)",
        build=f"triton.compile({info.function}, {label})",
        params={**{k: config[k] for k in ("num_warps", "num_stages", "maxnreg")},
                "constants": config["constants"], "origin": origin},
        reorders_fp=info.reduces and (bool(config["constants"]) or
                                      config["num_warps"] != info.metadata.get("num_warps")))
    try:
        code = build_config(info, fn, config, arch=arch, formula=formula, values=values)
    except Exception as e:  # noqa: BLE001 - a config Triton cannot build is skipped
        if isinstance(e, KpairError):  # refused by kpair, not a Triton error
            return replace(proposed, build_error=str(e))
        import traceback

        log = Path(context.work) / f"{stem}.error.txt"
        log.write_text("".join(traceback.format_exception(e)))
        lines = str(e).strip().splitlines() or [""]
        what = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
        return replace(proposed, build_error=f"{type(e).__name__}: {what[:400]} "
                       f"(traceback: {log.name})")
    out = Path(context.work) / f"{stem}.cubin"
    out.write_bytes(code.image)
    return replace(proposed, image=code.image, kernel=code.kernel, format=code.format,
                   binary=out, launch_override=code.launch_override)
