"""Launch plans an agent submits (``submit_candidate`` with form ``plan``), and what
``describe_operator`` says about a range.

``build_plan(h, dest, text=..., path=..., objects=...)`` writes a plan directory ``dest``:
``opt.plan.json`` and one code object per name its launches give as ``code``. A code object
comes from ``objects[name]`` (``{"form": ..., "code": text | "path": file}``): ``binary``
(base64 or a file: a host ``.so``, cubin, fatbin, PTX), ``c`` (host; ``cc -shared -g``, so
its DWARF gives the parameter layout), ``cuda`` (nvcc ``-cubin`` for the snapshot's
architecture), ``ptx`` (ptxas, as form ``ptx``) or ``triton`` (the kernel's Python source
compiled with the existing Triton build path, once per launch that names it: its signature
from that launch's bindings — a region's pointer of the region's dtype, a scalar of its
kind — unless ``signature`` gives a parameter's type; ``constants`` are its constexprs,
``num_warps``/``num_stages`` its config; the launch's block and dynamic shared memory follow
the compiled kernel, and Triton's trailing scratch pointers, when the kernel needs no global
scratch, are bound to null). A name no object gives is read beside ``path``. The plan is
then read and checked against the operator's range (``kpair.harness.load_plan``, which runs
``kpair.plan.check_plan``) before anything runs: a bad plan is one error naming the launch
and the parameter.

``range_facts(manifest)``: a range's live-in, live-out (with its declared output spans)
and scratch regions, and its operations.
"""

from __future__ import annotations

import ast
import json
import shutil
import tempfile
from pathlib import Path

from ..dtypes import dtype_size
from ..errors import KpairError, UsageError
from ..harness import load_plan
from ..plan import FILENAME
from ..ptx import assemble_with
from ..toolchain import compile_cuda, compile_shared
from .build import decode_binary

OBJECT_FORMS = ("binary", "c", "cuda", "ptx", "triton")
_BACKEND = {"c": "host", "cuda": "cuda", "ptx": "cuda", "triton": "cuda"}
_SUFFIX = {"c": ".so", "cuda": ".cubin", "ptx": ".cubin", "triton": ".cubin"}
#: Triton's type of a pointer to a region of each dtype, and of each scalar kind.
_TRITON_DTYPE = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32",
                 "float64": "fp64", "int8": "i8", "int16": "i16", "int32": "i32",
                 "int64": "i64", "uint8": "u8", "uint16": "u16", "uint32": "u32",
                 "uint64": "u64", "bool": "i1"}
_TRITON_SCALAR = {"i8": "i8", "i16": "i16", "i32": "i32", "i64": "i64", "u8": "u8",
                  "u16": "u16", "u32": "u32", "u64": "u64", "f32": "fp32", "f64": "fp64"}


def build_plan(h, dest: Path, *, text: str | None = None, path: str | None = None,
               objects: dict | None = None, ptxas_options: list[str] | None = None
               ) -> tuple[Path, list[str]]:
    """The plan written into ``dest`` with its code objects built, and checked against the
    harness ``h``'s range (see the module docstring): (the plan's path, one build note per
    built object)."""
    if (text is None) == (path is None):
        raise UsageError("give the plan as 'code' (the JSON text of opt.plan.json) or "
                         "'path', one of them")
    beside = None
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise UsageError(f"plan {p}: no such file")
        text, beside = p.read_text(errors="replace"), p.parent
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise UsageError(f"the plan is not JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("launches"), list):
        raise UsageError("the plan is a JSON object with a list of 'launches' "
                         "(docs/format.md, Launch plan)")
    objects = dict(objects or {})
    if not all(isinstance(v, dict) for v in objects.values()):
        raise UsageError("each of 'objects' is {\"form\": ..., \"code\": ...} or "
                         "{\"form\": ..., \"path\": ...}")
    dest.mkdir(parents=True, exist_ok=False)
    notes: list[str] = []
    done: dict[str, str] = {}
    launches = doc["launches"]
    named = {x.get("code") for x in launches if isinstance(x, dict)}
    for i, launch in enumerate(launches):
        if not isinstance(launch, dict) or launch.get("kind", "kernel") != "kernel":
            continue
        name = launch.get("code")
        if not isinstance(name, str) or not _safe(name):
            continue   # the plan's own check names it
        spec = objects.get(name)
        if spec is not None and spec.get("form") == "triton":
            launches[i] = _triton_launch(h, spec, launch, i, dest, notes)
            continue
        if name in done:
            continue
        if spec is None:
            if beside is None or not (beside / name).is_file():
                raise UsageError(f"launch {i} ({launch.get('kernel')}): no code object "
                                 f"{name!r} (give it in 'objects'"
                                 + (", or beside the plan" if beside else "") + ")")
            _put(dest / name, (beside / name).read_bytes())
            done[name] = "copied"
            continue
        _put(dest / name, _object(h, name, spec, ptxas_options or [], notes))
        done[name] = "built"
    unknown = sorted(set(objects) - named)
    if unknown:
        raise UsageError(f"object {unknown[0]!r} is named by no launch of the plan")
    plan_file = dest / FILENAME
    plan_file.write_text(json.dumps(doc, indent=1))
    load_plan(plan_file, h.snapshot.manifest, what="the plan")   # refused before any launch
    return plan_file, notes


def _safe(name: str) -> bool:
    return bool(name) and not name.startswith("/") and "\\" not in name \
        and ".." not in name.split("/")


def _put(file: Path, data: bytes) -> None:
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_bytes(data)


def _source(name: str, spec: dict) -> str:
    if (spec.get("code") is None) == (spec.get("path") is None):
        raise UsageError(f"object {name!r}: give 'code' (its text) or 'path', one of them")
    if spec.get("code") is not None:
        return str(spec["code"])
    p = Path(spec["path"])
    if not p.is_file():
        raise UsageError(f"object {name!r}: {p}: no such file")
    return p.read_text(errors="replace")


def _need(h, name: str, form: str) -> None:
    want = _BACKEND.get(form)
    if want is not None and h.backend != want:
        raise UsageError(f"object {name!r}: a {form} object needs a {want} operator; this "
                         f"one runs on {h.backend}")


def _object(h, name: str, spec: dict, ptxas_options: list[str], notes: list[str]) -> bytes:
    """One code object of form binary, c, cuda or ptx, as bytes."""
    form = spec.get("form")
    if form not in OBJECT_FORMS:
        raise UsageError(f"object {name!r}: form must be one of {', '.join(OBJECT_FORMS)}, "
                         f"not {form!r}")
    if form == "binary":
        if (spec.get("code") is None) == (spec.get("path") is None):
            raise UsageError(f"object {name!r}: give 'code' (base64) or 'path', one of them")
        image = decode_binary(spec.get("code"), spec.get("path"))
        if not image:
            raise UsageError(f"object {name!r} is empty")
        notes.append(f"{name}: given code object")
        return image
    _need(h, name, form)
    text = _source(name, spec)
    arch = h.snapshot.manifest.arch
    with tempfile.TemporaryDirectory(prefix="kpair-mcp-plan-") as tmp:
        tmp = Path(tmp)
        if form == "c":
            (tmp / "obj.c").write_text(text)
            out = compile_shared(tmp / "obj.c", tmp / "obj.so", flags=("-O2", "-g"))
            notes.append(f"{name}: cc -shared -fPIC -O2 -g")
            return out.read_bytes()
        if form == "cuda":
            (tmp / "obj.cu").write_text(text)
            out = compile_cuda(tmp / "obj.cu", tmp / "obj.cubin", arch=arch)
            notes.append(f"{name}: nvcc -cubin -arch={arch} -O3")
            return out.read_bytes()
        image, cmd = assemble_with(text, arch=arch, options=ptxas_options)
        notes.append(f"{name}: " + " ".join([Path(cmd[0]).name, *cmd[1:]]))
        return image


def _triton_launch(h, spec: dict, launch: dict, i: int, dest: Path,
                   notes: list[str]) -> dict:
    """Launch ``i`` with its Triton object compiled for it (a cubin of its own): the launch
    rewritten to name that cubin, its kernel, block and dynamic shared memory."""
    from ..optimize.strategies import triton as tri

    name = launch["code"]
    _need(h, name, "triton")
    source = _source(name, spec)
    function = spec.get("function") or launch.get("kernel")
    params = _triton_params(source, function, name)
    constants = dict(spec.get("constants") or {})
    given = dict(spec.get("signature") or {})
    args = list(launch.get("args") or [])
    free = [p for p in params if p not in constants]
    if len(free) != len(args):
        raise UsageError(f"launch {i} ({function}): {function} takes {len(free)} parameters "
                         f"besides its constexprs ({', '.join(free)}), the plan binds "
                         f"{len(args)}")
    m = h.snapshot.manifest
    dtypes = {r.name: r.dtype for r in m.regions}
    signature: dict[str, str] = {}
    for p in params:
        if p in constants:
            signature[p] = "constexpr"
            continue
        arg = args[free.index(p)]
        if p in given:
            signature[p] = str(given[p])
        elif isinstance(arg, dict) and arg.get("bind") == "scalar" \
                and arg.get("kind") in _TRITON_SCALAR:
            signature[p] = _TRITON_SCALAR[arg["kind"]]
        elif isinstance(arg, dict) and arg.get("bind") == "region" \
                and dtypes.get(arg.get("name")) in _TRITON_DTYPE:
            signature[p] = "*" + _TRITON_DTYPE[dtypes[arg["name"]]]
        else:
            raise UsageError(f"launch {i} ({function}) parameter {p!r}: its Triton type is "
                             "not known from the plan (a scratch buffer, or a region of no "
                             "recorded dtype): give it in the object's 'signature', e.g. "
                             "{\"" + p + "\": \"*fp32\"}")
    config = {"num_warps": int(spec.get("num_warps") or 4),
              "num_stages": int(spec.get("num_stages") or 3),
              "maxnreg": spec.get("maxnreg"), "constants": {}}
    info = tri.TritonKernel(function=function, source=source, signature=signature,
                            constants=constants, raw_constants=constants, attrs={},
                            metadata={}, inductor=False)
    with tempfile.TemporaryDirectory(prefix="kpair-mcp-triton-") as tmp:
        try:
            fn = tri.load_function(info, Path(tmp))
            built = tri.compile_config(info, fn, config, m.arch)
        except KpairError:
            raise
        except Exception as e:  # noqa: BLE001 - Triton's own errors are many; say which
            raise KpairError(f"launch {i} ({function}): compiling the Triton source failed: "
                             f"{type(e).__name__}: {str(e).strip()[:300]}") from None
    if built["global_scratch_size"] or built["profile_scratch_size"]:
        raise UsageError(f"launch {i} ({function}): the compiled kernel needs Triton's "
                         "global scratch memory, which a plan cannot provide yet")
    file = f"{Path(name).stem}.launch{i}.cubin"
    _put(dest / file, built["cubin"])
    from ..harness import plan_layout

    layout = plan_layout(built["cubin"], "cubin", built["name"], m.arch) or []
    extra = len(layout) - len(args)
    if 0 < extra <= 2:   # Triton's scratch pointers (none needed: null)
        args += [{"bind": "scalar", "kind": "u64", "value": 0}] * extra
    notes.append(f"{name} (launch {i}): triton.compile({function}, num_warps="
                 f"{config['num_warps']}, num_stages={config['num_stages']}, "
                 f"constants={constants}) -> {file}")
    return {**launch, "code": file, "kernel": built["name"], "args": args,
            "block": [32 * config["num_warps"], 1, 1],
            "dynamic_shared_bytes": built["shared"]}


def _triton_params(source: str, function: str | None, name: str) -> list[str]:
    if not function:
        raise UsageError(f"object {name!r}: the launch names no kernel (the Triton function)")
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise UsageError(f"object {name!r}: not Python: {e}") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return [a.arg for a in node.args.args]
    raise UsageError(f"object {name!r}: no function {function}(...) in the source")


# --------------------------------------------------------------------------- describe


def range_facts(m) -> dict:
    """A range's regions by role and its operations, for ``describe_operator``: each
    region's name, captured address, offset from the lowest captured address of the
    range's memory, size, role, dtype and element count where recorded (a shape where the
    snapshot records one: none does today); live-out regions with their declared output
    spans; scratch as name, address, offset and size."""
    regions, scratch = m.regions, m.scratch_regions
    base = min([r.address for r in regions] + [s.address for s in scratch], default=0)
    spans: dict[str, list[dict]] = {}
    for s in m.output_spans:
        spans.setdefault(s.region, []).append({"offset": s.offset, "size": s.size})

    def row(r) -> dict:
        out = {"name": r.name, "address": hex(r.address), "offset": r.address - base,
               "size": r.size, "role": r.role, "dtype": r.dtype, "shape": None}
        if r.dtype and r.dtype != "bool" and r.size % dtype_size(r.dtype) == 0:
            out["elements"] = r.size // dtype_size(r.dtype)
        return out

    live_in = [row(r) for r in regions if (r.role or "in") == "in"]
    live_out = [row(r) | {"outputs": spans.get(r.name, [])} for r in regions
                if r.role in ("out", "inout")]
    ops = []
    for k, op in enumerate(m.operations):
        entry = {"index": k, "kind": op.kind, "kernel": op.code.kernel_name
                 if op.code is not None else None}
        if op.launch is not None:
            entry.update(grid=list(op.launch.grid), block=list(op.launch.block))
        ops.append(entry)
    name = m.provenance.get("range") if isinstance(m.provenance, dict) else None
    return {"name": name if isinstance(name, str) else None, "ops": ops,
            "live_in": live_in, "live_out": live_out,
            "scratch": [{"name": s.name, "address": hex(s.address),
                         "offset": s.address - base, "size": s.size, "role": "scratch"}
                        for s in scratch]}


def discard(dest: Path) -> None:
    shutil.rmtree(dest, ignore_errors=True)


__all__ = ["OBJECT_FORMS", "build_plan", "discard", "range_facts"]
