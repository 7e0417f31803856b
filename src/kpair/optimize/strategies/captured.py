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

Each retune changes one launch. When the search has judged a capture's retunes (``scores``:
the speedups of the candidates judged so far, from the prune step's ``attempts.jsonl``), the
best passing retune of each launch that beat the capture itself is put in place together
(``best_per_launch``, ``combined_plan``): where two or more launches improved, that plan is
one more candidate (label ``<producer> combined``), judged like the others.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

from ...candidate import Candidate
from ...errors import BackendUnavailable, KpairError, UsageError
from ...harness import bind_snapshot, load_plan
from ...plan import Plan
from ...session import read_attempts
from ..strategy import Context, first_repeat
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
    dup = first_repeat(names)
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


@dataclass(frozen=True)
class Variant:
    """One retuned launch: the candidate's ``label``, the capture it retunes (``of``), the
    launch, and what ``substitute`` puts there."""

    label: str
    of: str
    launch: int
    code: str
    kernel: str
    fmt: str
    override: dict | None = None


def keep_code(base: Path, image: bytes, suffix: str) -> str:
    """``image`` kept beside the plan at ``base`` in ``code/`` under its digest: its path
    relative to the plan."""
    rel = f"code/{hashlib.sha256(image).hexdigest()[:16]}{suffix}"
    (base.parent / "code").mkdir(parents=True, exist_ok=True)
    if not (base.parent / rel).is_file():
        (base.parent / rel).write_bytes(image)
    return rel


def write_plan(base: Path, plan: Plan, stem: str) -> Path:
    """``plan`` written beside ``base`` (sharing its code objects) as ``<stem>.plan.json``."""
    path = base.parent / f"{stem}.plan.json"
    path.write_text(json.dumps(plan.to_json(), indent=1) + "\n")
    return path


def write_variant(base: Path, plan: Plan, image: bytes, suffix: str, stem: str,
                  i: int, kernel: str, fmt: str, launch: dict | None, note: str) -> Path:
    """A plan beside ``base`` (sharing its code objects) with launch ``i`` replaced by
    ``image``: ``<stem>.plan.json``, the image kept in ``code/`` under its digest."""
    rel = keep_code(base, image, suffix)
    return write_plan(base, substitute(plan, i, code=rel, kernel=kernel, fmt=fmt,
                                       launch=launch, note=note), stem)


def best_per_launch(variants: Sequence[Variant], scores: Mapping[str, float],
                    floor: float) -> dict[int, Variant]:
    """Per launch, the variant with the highest score above ``floor`` (variants without a
    score did not pass, or were not judged)."""
    best: dict[int, Variant] = {}
    for v in variants:
        got = scores.get(v.label)
        if got is None or got <= floor:
            continue
        if v.launch not in best or got > scores[best[v.launch].label]:
            best[v.launch] = v
    return best


def combined_plan(plan: Plan, chosen: Mapping[int, Variant]) -> Plan:
    """``plan`` with every chosen variant put in place of its launch."""
    for i, v in sorted(chosen.items()):
        plan = substitute(plan, i, code=v.code, kernel=v.kernel, fmt=v.fmt, launch=v.override)
    labels = "; ".join(chosen[i].label for i in sorted(chosen))
    return plan.replace(note=f"{plan.note}; launches {sorted(chosen)} retuned by kpair "
                             f"together ({labels})")


def passed_speedups(attempts: Path) -> dict[str, float]:
    """label -> speedup of every passing attempt in ``attempts`` (an ``attempts.jsonl``;
    none yet: empty)."""
    if not attempts.is_file():
        return {}
    return {a.label: a.speedup for a in read_attempts(attempts)
            if a.status == "pass" and a.speedup is not None}


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

    def __init__(self, captures: Sequence[RangeCandidate], limit: int = DEFAULT_LIMIT,
                 scores: Callable[[], Mapping[str, float]] | None = None):
        self.captures = tuple(captures)
        self.limit = limit
        #: The speedups of the candidates judged so far, by label (None: no combinations).
        self.scores = scores
        self._bound: dict[str, Path | str] | None = None
        self._variants: dict[str, list[Variant]] = {}

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
                combined = self.combined(harness, c, path)
                if combined is not None:
                    yield combined

    def combined(self, harness, capture: RangeCandidate, path: Path) -> Candidate | None:
        """The capture's plan with the best judged retune of every launch that beat it put
        in place together, where two or more launches did (see the module docstring)."""
        scores = self.scores() if self.scores is not None else {}
        if capture.producer not in scores:
            return None
        chosen = best_per_launch(self._variants.get(capture.producer, ()), scores,
                                 scores[capture.producer])
        if len(chosen) < 2:
            return None
        label = f"{capture.producer} combined"
        params = {"producer": RETUNE, "of": capture.producer,
                  "launches": {str(i): v.label for i, v in sorted(chosen.items())}}
        try:
            out = write_plan(path, combined_plan(Plan.read(path), chosen),
                             f"{RETUNE}-combined")
            load_plan(out, harness.snapshot.manifest)
        except KpairError as e:
            return Candidate(label=label, strategy=RETUNE, params=params,
                             build_error=f"the combined retunes do not fit the plan: {e}")
        return plan_candidate(out, label=label, strategy=RETUNE, params=params,
                              source=f"retunes of {capture.producer}, "
                                     f"{len(chosen)} launches together")

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
                rel = keep_code(path, built.image, ".cubin")
                variant = write_plan(path, substitute(
                    plan, i, code=rel, kernel=built.kernel, fmt=built.format,
                    launch=built.launch_override, note=f"{plan.note}; launch {i} retuned by "
                    f"kpair ({built.label})"), stem)
                load_plan(variant, harness.snapshot.manifest)
                self._variants.setdefault(capture.producer, []).append(Variant(
                    label, capture.producer, i, rel, built.kernel, built.format,
                    built.launch_override))
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


__all__ = ["NAME", "RETUNE", "CapturedRange", "RangeCandidate", "Variant", "best_per_launch",
           "check_candidates", "combined_plan", "keep_code", "passed_speedups",
           "plan_candidate", "producer_of", "substitute", "write_plan", "write_variant"]

