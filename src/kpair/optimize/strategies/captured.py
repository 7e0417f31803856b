"""``opt-capture``: a range's captured candidates, then kpair's retunes of their Triton kernels.

``kpair optimize --range`` judges candidates that are captures of the same range made
another way (``RangeCandidate``: a producer's name, as Inductor's default, max-autotune or
coordinate descent, and its snapshot). Each is bound to the harness's range
(``kpair.harness.bind_snapshot``: ``kpair.bind.bind_capture``, the plan's note listing every
binding) into a launch plan: a ``Candidate`` of format ``plan``, labelled with its producer.
A capture that cannot be bound is a candidate with its ``build_error`` (the search records
it as skipped, with the reason); the others go on.

Then, once every capture is proposed, kpair's own retunes (``retunes``): every launch of a
bound plan whose operation the capture recorded with Triton metadata
(``provenance.ops[i].triton``, as ``kpair.capture.triton_meta`` gives it) is recompiled under
other configs by the ``triton`` strategy's own functions (``resolve``, ``configs``, its
``_build``), and the cubin is put in place of that launch's code object (``substitute``):
the same raw kernarg and relocations, the config's block, shared memory and grid. Each
changed plan is read back and checked against the range (``kpair.harness.load_plan``: the
new cubin's own parameter layout must be the kernarg's) before it is a candidate; one that
fails the check is a candidate with its ``build_error``. Retuning needs Triton and the
GPU's architecture; a range without Triton metadata gets no retunes.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

from ...candidate import Candidate
from ...errors import BackendUnavailable, KpairError, UsageError
from ...harness import bind_snapshot, load_plan
from ...plan import Plan, Scratch
from ..strategy import Context
from .triton import (
    DEFAULT_LIMIT,
    TritonKernel,
    _build,
    configs,
    dispatch_formula,
    kernel_info,
    load_function,
    resolve,
    scalars,
    seed_configs,
)

NAME = "opt-capture"
#: The producer of kpair's own retunes of a captured candidate's kernels.
RETUNE = "kpair-retune"
_PRODUCER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")


@dataclass(frozen=True)
class RangeCandidate:
    """A capture of the same range made another way: ``producer`` names the way (a short
    name: letters, digits, ``_.+-``), ``snapshot`` is its range snapshot."""

    producer: str
    snapshot: Path

    def __post_init__(self) -> None:
        if not _PRODUCER.match(self.producer or ""):
            raise UsageError(f"producer {self.producer!r}: give a short name of letters, "
                             "digits and _.+- (as inductor-default, max-autotune)")
        object.__setattr__(self, "snapshot", Path(self.snapshot))

    @classmethod
    def parse(cls, text: str) -> RangeCandidate:
        """``NAME=SNAP`` (``--opt-capture``'s form)."""
        producer, sep, where = text.partition("=")
        if not sep or not where:
            raise UsageError(f"--opt-capture {text!r}: give NAME=SNAP (a producer's name and "
                             "its capture of the range), e.g. inductor-default=compiled.snap")
        return cls(producer, Path(where))


def check_candidates(candidates: Sequence[RangeCandidate]) -> None:
    """At least one, producers named once each (UsageError otherwise)."""
    if not candidates:
        raise UsageError("--range needs at least one --opt-capture NAME=SNAP")
    names = [c.producer for c in candidates]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise UsageError(f"--opt-capture: producer {dup!r} is given twice")
    if RETUNE in names:
        raise UsageError(f"--opt-capture: {RETUNE!r} names kpair's own retunes; give the "
                         "capture another name")


def substitute(plan: Plan, i: int, *, code: str, kernel: str, fmt: str,
               launch: dict | None = None, note: str = "") -> Plan:
    """``plan`` with launch ``i``'s code object replaced by ``code`` (a file beside the plan)
    holding ``kernel``: its raw kernarg, layout and relocations kept, its geometry from
    ``launch`` (``block``, ``grid``, ``dynamic_shared_bytes``, as a launch override) where
    given. Only a kernel launch can be replaced; ``load_plan`` checks the result."""
    old = plan.launches[i]
    if old.data:
        raise UsageError(f"launch {i} is a {old.kind}: no code object to replace")
    o = launch or {}
    new = old.replace(code=code, kernel=kernel, format=fmt,
                      grid=tuple(o.get("grid", old.grid)),
                      block=tuple(o.get("block", old.block)),
                      dynamic_shared_bytes=int(o.get("dynamic_shared_bytes",
                                                     old.dynamic_shared_bytes)))
    launches = (*plan.launches[:i], new, *plan.launches[i + 1:])
    return plan.replace(launches=launches, note=note or plan.note)


def write_variant(base: Path, plan: Plan, image: bytes, suffix: str, stem: str,
                  i: int, kernel: str, fmt: str, launch: dict | None, note: str) -> Path:
    """A plan beside ``base`` (sharing its code objects) with launch ``i`` replaced by
    ``image``: ``<stem>.plan.json``, the image kept in ``code/`` under its digest."""
    rel = f"code/{hashlib.sha256(image).hexdigest()[:16]}{suffix}"
    (base.parent / "code").mkdir(parents=True, exist_ok=True)
    if not (base.parent / rel).is_file():
        (base.parent / rel).write_bytes(image)
    changed = substitute(plan, i, code=rel, kernel=kernel, fmt=fmt, launch=launch, note=note)
    path = base.parent / f"{stem}.plan.json"
    path.write_text(json.dumps(changed.to_json(), indent=1) + "\n")
    return path


def plan_candidate(path: Path, *, label: str, strategy: str, **provenance) -> Candidate:
    """The plan at ``path`` as a candidate (format ``plan``: the worker reads it)."""
    plan = Plan.read(path)
    return Candidate(image=path.read_bytes(), format="plan", binary=path,
                     kernel=" ; ".join(dict.fromkeys(x.label for x in plan.launches)),
                     label=label, strategy=strategy, **provenance)


class CapturedRange:
    """The captured candidates of a range, bound, then their Triton launches retuned (see
    the module docstring). ``limit``: configs per retuned launch (0: no retunes)."""

    name = NAME

    def __init__(self, captures: Sequence[RangeCandidate], limit: int = DEFAULT_LIMIT):
        self.captures = tuple(captures)
        self.limit = limit
        self._bound: dict[str, Path | str] | None = None

    def bind(self, snapshot, work: Path) -> dict[str, Path | str]:
        """Bind every capture to the range of Snapshot ``snapshot`` (once): producer -> its
        plan's path in ``WORK/<producer>``, or why it is not bound."""
        if self._bound is None:
            self._bound = {}
            for c in self.captures:
                try:
                    path = bind_snapshot(snapshot, c.snapshot, Path(work) / c.producer)
                    load_plan(path, snapshot.manifest)
                except KpairError as e:
                    self._bound[c.producer] = f"not bound: {e}"
                    continue
                self._bound[c.producer] = path
        return self._bound

    def scratch(self) -> tuple[Scratch, ...]:
        """Every scratch buffer the bound plans declare (``bind`` first)."""
        return tuple(b for p in (self._bound or {}).values() if isinstance(p, Path)
                     for b in Plan.read(p).scratch)

    def applies(self, harness, context: Context) -> str | None:
        if not self.captures:
            return "no captured candidate was given (--opt-capture NAME=SNAP)"
        return None

    def candidates(self, harness, context: Context) -> Iterator[Candidate]:
        bound = self.bind(harness.snapshot, Path(context.work))
        for c in self.captures:
            proposed = Candidate(label=c.producer, strategy=NAME,
                                 source=f"captured range {c.snapshot}",
                                 build=f"kpair.bind.bind_capture(ref, {c.snapshot})",
                                 params={"producer": c.producer, "snapshot": str(c.snapshot)})
            path = bound[c.producer]
            if isinstance(path, str):
                yield replace(proposed, build_error=path)
                continue
            yield plan_candidate(path, label=c.producer, strategy=NAME,
                                 source=proposed.source, build=proposed.build,
                                 params=proposed.params)
        for c in self.captures:   # then kpair's own, capture by capture
            path = bound[c.producer]
            if self.limit and isinstance(path, Path):
                yield from self.retunes(harness, c, path, context)

    def retunes(self, harness, capture: RangeCandidate, path: Path, context: Context
                ) -> Iterator[Candidate]:
        """kpair's retunes of every Triton launch of the bound plan at ``path``."""
        from ...snapshot import Snapshot

        cand = Snapshot.open(capture.snapshot)
        plan = Plan.read(path)
        ops = (cand.manifest.provenance or {}).get("ops")
        ops = ops if isinstance(ops, list) else []
        for i, launch in enumerate(plan.launches):
            meta = ops[i].get("triton") if i < len(ops) and isinstance(ops[i], dict) else None
            if launch.data or not isinstance(meta, dict):
                continue
            info = kernel_info({"triton": meta})
            if info is None:
                continue
            yield from self._retune_launch(harness, capture, path, plan, i, info, context)

    def _retune_launch(self, harness, capture: RangeCandidate, path: Path, plan: Plan, i: int,
                       info: TritonKernel, context: Context) -> Iterator[Candidate]:
        launch = plan.launches[i]
        shim = SimpleNamespace(launch=SimpleNamespace(grid=launch.grid, block=launch.block),
                               kernarg=SimpleNamespace(params=launch.params))
        kernarg = bytes(launch.kernarg)
        proposed = Candidate(label=f"{capture.producer} op{i}", strategy=RETUNE,
                             source=f"{info.function} (launch {i} of {capture.producer})",
                             params={"producer": RETUNE, "of": capture.producer, "launch": i})
        resolved = resolve(info, shim, kernarg)
        if isinstance(resolved, str):
            yield replace(proposed, build_error=f"not retuned: {resolved}")
            return
        formula = dispatch_formula(resolved, shim, kernarg)
        values = scalars(resolved, shim, kernarg)
        todo = configs(resolved, grid_known=formula is not None, limit=self.limit)
        build = Path(context.work) / f"{capture.producer}-retune" / f"op{i}"
        build.mkdir(parents=True, exist_ok=True)
        try:
            fn = load_function(resolved, build)
        except (BackendUnavailable, KpairError) as e:
            yield replace(proposed, build_error=f"not retuned: {e}")
            return
        except Exception as e:  # noqa: BLE001 - Triton's own errors: this launch is skipped
            yield replace(proposed, build_error=f"not retuned: {type(e).__name__}: {e}")
            return
        seeds = seed_configs(resolved, grid_known=formula is not None)
        ctx = replace(context, work=build, arch=context.arch
                      or harness.snapshot.manifest.arch)
        for n, config in enumerate(todo, 1):
            origin = "inductor autotune config" if config in seeds \
                else "neighbour of the captured config"
            built = _build(resolved, fn, config, f"triton-{n:03d}", harness, ctx, formula,
                           values, origin=origin)
            label = f"{capture.producer} op{i} {built.label}"
            params = {**built.params, "producer": RETUNE, "of": capture.producer,
                      "launch": i}
            if built.build_error is not None:
                yield replace(built, label=label, strategy=RETUNE, params=params)
                continue
            stem = f"{RETUNE}-op{i}-{n:03d}"
            try:
                variant = write_variant(path, plan, built.image, ".cubin", stem, i,
                                        built.kernel, built.format, built.launch_override,
                                        f"{plan.note}; launch {i} retuned by kpair "
                                        f"({built.label})")
                load_plan(variant, harness.snapshot.manifest)
            except KpairError as e:
                yield replace(built, label=label, strategy=RETUNE, params=params,
                              build_error=f"the retuned launch does not fit the plan: {e}")
                continue
            yield plan_candidate(variant, label=label, strategy=RETUNE, source=built.source,
                                 build=built.build, params=params,
                                 reorders_fp=built.reorders_fp)


def producer_of(candidate: Candidate) -> str | None:
    """The producer a candidate came from (its ``params``), if it names one."""
    p = candidate.params or {}
    return p.get("producer") if isinstance(p.get("producer"), str) else None


__all__ = ["NAME", "RETUNE", "CapturedRange", "RangeCandidate", "check_candidates",
           "plan_candidate", "producer_of", "substitute", "write_variant"]

