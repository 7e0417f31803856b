"""The run pipeline: one harness, in this process, as a straight list of stages.

``execute(root, options)`` opens the harness, places its regions on a device and runs the
stages of ``CHECKED`` (the default) or ``UNCHECKED`` (``RunOptions(checks=False)``), in order,
over one ``Run`` (what the stages share). A stage either adds to the run or ends it with a
``fail`` verdict; the last stage ends it with ``pass``. A checked and an unchecked run differ
only by the stages in their lists:

    verify, place                the harness; its regions on the device
    load                         the sandbox checked (host: each kernel then loads into its
                                 own confined executor process), then both kernels
    ref                          ref on the pre-state (3x when checked: determinism)
    fidelity                     ref must reproduce the captured post-state, or no verdict
    trust:poison                 which bytes ref writes whatever they held (checked)
    opt                          opt judged under the policy (3x, freshly poisoned, if checked)
    trust:mutate                 ref alone on mutated inputs (checked; a fault here drops the
                                 differential runs, see kpair.isolation)
    trust:differential           opt on the same inputs, judged against ref (checked)
    trust:timing                 timer against wall-clock windows (checked)
    measure                      the ABBA meter in replicates (fresh loads of both kernels),
                                 poisoned and guarded when checked; every timed launch
                                 judged, each block on a fresh secret sparse change of the
                                 captured input (checked)
    control                      ref against a second load of itself: the systematic offset
                                 folded into the reported interval (``--no-control``: off)
    aa                           an A/A control, on request
    trust:ref                    ref judged again with opt loaded and run; its code unchanged
                                 where the backend can read it (checked)
    trust:speed                  impossible speed (checked)

Exceptions (bad inputs, driver errors) leave ``execute``; the isolated runner
(``kpair.isolation``) turns them into an ``error`` Result with the facts gathered so far.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from . import progress
from .backends import open_device
from .candidate import Candidate  # the one candidate type; re-exported
from .errors import InputError, KpairError, UsageError
from .formats import convert
from .harness import Harness, load_plan
from .measure import (
    Samples,
    StoppingRule,
    another_replicate,
    combine,
    combine_replicates,
    difference,
    measure,
    replicate_seed,
    samples_bytes,
)
from .measure import analyze as pooled_stats
from .options import RunOptions  # re-exported: most importers want only this
from .policy.lint import lint
from .replay import Replay
from .result import Checks, Correctness, Result, Side, Speed, Systematic, TrustEntry
from .snapshot import sha256
from .sol import peaks_for, speed_of_light, traffic
from .trust.audit import Audit
from .trust.findings import refused_calls

#: The raw samples file, beside result.json.
SAMPLES = "samples.npz"
#: The most replicates a run takes by default where its backend takes extra ones.
MAX_REPLICATES = 12


@dataclass
class Facts:
    """What a run has learnt so far: the parts of its Result that any outcome keeps."""

    harness: str
    started: str
    stage_s: dict[str, float] = field(default_factory=dict)
    inputs_digest: str | None = None
    ref: Side | None = None
    opt: Side | None = None
    environment: dict | None = None
    replay: dict | None = None
    sandbox: dict | None = None
    checks: Checks | None = None

    def keep(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class Run:
    """What the stages of one run share. Stages read what earlier stages set. The setup
    stages fill the harness-level part once; a session then evaluates candidates on it, each
    resetting the candidate-level part (``begin``)."""

    root: Path
    options: RunOptions
    facts: Facts
    harness: Any = None
    device: Any = None
    replay: Any = None
    hints: dict[str, str] = field(default_factory=dict)
    ref: tuple = ()            # (Kernel, Launch)
    opt: tuple = ()
    ctl: tuple = ()            # ref's binary loaded a second time: the identical-binary control
    audit: Any = None          # kpair.trust.audit.Audit on a checked run
    ref_post: dict | None = None
    verdict: Any = None        # kpair.policy.Verdict of opt
    speed: Speed | None = None
    samples: bytes | None = None  # the raw ABBA samples (.npz bytes) behind ``speed``
    medians: tuple[float, float] = (0.0, 0.0)   # ref, opt: debug only, for trust:speed
    candidate: Candidate | None = None
    systematic: Any = None     # the identical-binary control: measured once per placement
    setup_stage_s: dict[str, float] = field(default_factory=dict)
    traffic: Any = None        # kpair.sol.Traffic of the snapshot: once per placement
    # Scratch buffers placed besides the harness plan's own: (name, size, align), the union
    # of every candidate plan's judged on this Run so far (``_place_scratch``).
    extra_scratch: tuple = ()
    scratch: tuple = ()        # every plan scratch buffer placed: (name, size, align)
    on_stage: Callable[[str], None] = lambda s: None   # the caller's stage callback

    def begin(self, candidate: Candidate) -> None:
        """Forget the previous candidate; keep the placement, ref's runs, the baselines."""
        self.candidate, self.opt, self.verdict = candidate, (), None
        self.speed, self.samples, self.medians = None, None, (0.0, 0.0)
        self.facts.stage_s = dict(self.setup_stage_s)
        self.facts.opt = Side(kernel=candidate.kernel, binary=candidate.label)
        if self.audit is not None:
            self.audit.reset_candidate()

    def time_one(self, which: str) -> float:
        kernel, launch = {"ref": self.ref, "opt": self.opt, "ctl": self.ctl}[which]
        if self.audit is not None:
            return self.audit.time_one(kernel, launch, which)
        return self.replay.time_one(kernel, launch)

    # -------------------------------------------------------------- outcomes

    def failure(self):
        return self.audit.failure() if self.audit is not None else None

    def trust(self) -> tuple[dict[str, TrustEntry] | None, list[str] | None]:
        if self.audit is None:  # unchecked: refused system calls are still told
            return None, self._refusal_warning()
        found = self.audit.findings()
        entries = {name: TrustEntry(**f.to_json()) for name, f in found.items()}
        warnings = [f"{name}: {f.reason}" for name, f in found.items()
                    if f.passed is None and f.reason]
        # A passing check can still say what it did not test (a policy's opt-out).
        warnings += [f"{name}: {f.finding['warning']}" for name, f in found.items()
                     if f.passed and isinstance(f.finding.get("warning"), str)]
        return entries, warnings or None

    def _refusal_warning(self) -> list[str] | None:
        if not self.opt or not self.ref:
            return None
        f = refused_calls(self.device.refused_calls(self.ref[0]),
                          self.device.refused_calls(self.opt[0]))
        return [f"refused_calls: {f.reason}; not judged: the checks are off"] if f.reason \
            else None

    def correctness(self) -> Correctness:
        policy = self.harness.policy
        failure = self.failure()
        if self.verdict is None:
            c = Correctness(passed=False, mode=policy.mode, regions=[],
                            policy=policy.to_json())
        else:
            v = self.verdict.to_json()
            c = Correctness(passed=v["passed"], mode=v["mode"], regions=v["regions"],
                            policy=policy.to_json(), summary=v["summary"])
        if failure is not None:  # a failed check explains the verdict better than the bytes
            c = Correctness(passed=False, mode=c.mode, regions=c.regions, policy=c.policy,
                            summary=f"FAIL [{failure.name}]: {failure.reason}",
                            failed_check=failure.name)
        return c

    def fail(self) -> Result:
        trust, warnings = self.trust()
        return Result.make(status="fail", correctness=self.correctness(), trust=trust,
                           warnings=warnings, **self.facts.keep())

    def passed(self) -> Result:
        trust, warnings = self.trust()
        return Result.make(status="pass", correctness=self.correctness(), speed=self.speed,
                           trust=trust, warnings=warnings, sol=self.speed_of_light(),
                           **self.facts.keep())

    def speed_of_light(self):
        """ref's and opt's distance to the device's floor (``kpair.sol``); None when it cannot
        be had: an optional figure never costs a verdict."""

        try:
            if self.traffic is None:   # from the states the replay holds: no blob read again
                r = self.replay
                self.traffic = traffic((g.name, r.pre[g.name], r.expected[g.name])
                                       for g in r.regions)
            peaks = peaks_for(self.device)
        except (KpairError, OSError, ValueError, MemoryError):
            return None
        ref_s, opt_s = self.medians
        return speed_of_light(self.traffic, peaks, ref_s=ref_s or None, opt_s=opt_s or None)


#: A stage: its name (the key of ``stage_s``) and what it does. A stage returns a Result to
#: end the run there (a ``fail``), or None to go on.
Stage = tuple[str, Callable[[Run], "Result | None"]]


# ------------------------------------------------------------------ stages


def _verify(run: Run) -> None:
    h = run.harness = Harness.open(run.root)
    run.facts.inputs_digest = h.inputs_digest()
    m = h.snapshot.manifest
    run.facts.ref = Side(kernel=h.ref.kernel, binary=h.ref.binary) if not m.is_range else \
        Side(kernel=" ; ".join(op.label for op in m.operations),
             binary=h.spec.snapshot)


def _place(run: Run) -> None:
    h = run.harness
    ordinal = run.options.ordinal
    run.device = open_device(h.backend, **{**(run.options.device_options or {}),
                                           "device": ordinal})
    # Every backend's environment says which device ran it: a verdict must not depend on it,
    # and per-device comparisons need to know.
    run.facts.environment = {**run.device.environment(), "device_index": ordinal}
    own = [(b.name, b.size, b.align) for b in h.plan.scratch] if h.plan else []
    run.scratch = merged_scratch([*own, *run.extra_scratch])
    run.replay = Replay(run.device, h.snapshot, relocate=run.options.relocate,
                        cache=run.options.cache, plan_scratch=run.scratch)
    run.device = run.replay.device   # launches a range or a plan as one kernel
    run.facts.replay = {**run.replay.info.to_json(), **h.kind}
    run.hints = {r.name: r.dtype for r in h.snapshot.manifest.regions if r.dtype}


def _seal(run: Run) -> None:
    # Before any code object is loaded: a host shared object runs code as it loads, so a
    # backend that cannot confine it refuses here (SandboxUnavailable), before ref.
    run.facts.sandbox = run.device.seal()


def _load_ref(run: Run) -> None:
    h = run.harness
    run.ref = (_ref_kernel(run), h.launch(h.ref))
    if run.options.control:
        # A second module of the same code: the identical-binary control's "opt".
        run.ctl = (_ref_kernel(run, check=False), h.launch(h.ref))


def _ref_kernel(run: Run, *, check: bool = True):
    """ref loaded: a range's captured operations as one program, else ref's kernel."""
    h, device = run.harness, run.device
    if h.snapshot.manifest.is_range:
        return run.replay.load_range("ref")
    ref = device.load(h.binary(h.ref), h.ref.kernel, fmt=h.ref.format)
    if check:
        run.replay.check_abi(ref, "ref")
    return ref


def _opt_kernel(run: Run):
    """The candidate loaded: a plan's launches as one program, else its kernel."""
    c = run.candidate
    if c.plan is not None:
        return run.replay.load_plan(*c.plan)
    opt = run.device.load(c.image, c.kernel, fmt=c.format)
    run.replay.check_abi(opt, "opt")
    return opt


def _load_opt(run: Run) -> None:
    c, h = run.candidate, run.harness
    if c.plan is None and c.format == "plan":   # a plan sent by its path (kpair evaluate)
        if c.binary is None:
            raise UsageError(f"{c.label or 'the candidate'}: a launch plan comes as the "
                             "path of its opt.plan.json")
        if c.image and Path(c.binary).is_file() and Path(c.binary).read_bytes() != c.image:
            raise InputError(f"{c.label or c.binary}: the plan file changed after it was "
                             "submitted")
        c = run.candidate = replace(c, plan=load_plan(Path(c.binary), h.snapshot.manifest,
                                                      what=c.label or "plan"))
    if c.plan is not None:
        _place_scratch(run, c.plan[0].scratch)
        h = run.harness
    try:
        launch = h.snapshot.manifest.launch.override(c.launch_override or {})
    except KpairError as e:
        raise UsageError(f"launch override of {c.label or 'the candidate'}: {e}") from None
    if c.plan is None and h.snapshot.manifest.is_range:
        raise UsageError(f"{c.label or 'the candidate'}: a range of "
                         f"{len(h.snapshot.manifest.operations)} operations is judged against "
                         "a launch plan, not one same-layout kernel")
    if c.plan is None:
        run.replay.check_declared(c.image, c.kernel, c.format, "opt")  # a candidate's DWARF
    run.opt = (_opt_kernel(run), launch)


def merged_scratch(buffers) -> tuple[tuple[str, int, int], ...]:
    """(name, size, align) buffers, one per name in first-seen order: the largest size and
    alignment asked for under it."""
    out: dict[str, tuple[str, int, int]] = {}
    for name, size, align in buffers:
        had = out.get(name)
        out[name] = (name, size, align) if had is None else \
            (name, max(had[1], size), max(had[2], align))
    return tuple(out.values())


def unplaced_scratch(placed, wanted) -> list:
    """The buffers of ``wanted`` (``kpair.plan.Scratch``) that ``placed`` ((name, size,
    align), as ``Run.scratch``) lacks, or holds smaller or less aligned than asked."""
    have = {name: (size, align) for name, size, align in placed}
    return [b for b in wanted if b.name not in have or have[b.name][0] < b.size
            or have[b.name][1] < b.align]


def _place_scratch(run: Run, wanted) -> None:
    """A candidate plan's scratch placed like the harness plan's own. A session places its
    harness's scratch once, with the regions; where the candidate declares a buffer the
    placement lacks (another name, or larger, or more aligned), the Run is set up again on
    a placement that adds it (``prepare`` with ``extra_scratch``: every buffer placed so far
    plus the new ones, after the captured span behind a guard gap): guard bands around it,
    poisoned before every launch of the plan, ref run and its checks made again there. Later
    candidates with the same scratch are judged on that placement."""
    missing = unplaced_scratch(run.scratch, wanted)
    if not missing:
        return
    extra = merged_scratch([*run.extra_scratch,
                            *((b.name, b.size, b.align) for b in missing)])
    candidate, on_stage = run.candidate, run.on_stage
    close(run)
    fresh, failed = prepare(run.root, run.options, facts=run.facts, stage=on_stage,
                            extra_scratch=extra)
    if failed is not None:
        close(fresh)
        raise KpairError(f"placing the scratch of {candidate.label or 'the candidate'} "
                         f"({', '.join(b.name for b in missing)}): ref failed a check on the "
                         f"new placement: {failed.reason}")
    vars(run).update(vars(fresh))
    run.begin(candidate)
    on_stage("load")
    progress.stage("load")


def _arm(run: Run) -> None:
    o = run.options
    seed = o.seed if o.seed is not None else secrets.randbits(63)
    run.audit = Audit(run.replay, run.harness.policy, run.hints, seed=seed,
                      skip=o.skip_checks, harness=str(run.root))
    run.audit.ref_code_before = run.device.code_digest(run.ref[0])
    run.facts.checks = Checks(enabled=True, skipped=list(o.skip_checks), seed=seed)


def _ref_once(run: Run) -> None:
    run.ref_post = run.replay.run(*run.ref)


def _ref_repeated(run: Run) -> Result | None:
    run.ref_post = run.audit.baseline(*run.ref)[0]
    return run.fail() if run.audit.found["baseline_determinism"].failed else None


def _fidelity(run: Run) -> None:
    from .policy import check

    fidelity = check(run.harness.policy, run.replay.expected, run.ref_post,
                     dtype_hints=run.hints)
    run.facts.replay = {**run.facts.replay, "fidelity": fidelity.to_json()}
    if not fidelity.passed:
        raise KpairError("the baseline (ref) does not reproduce the captured post-state "
                         f"under the policy, so the replay proves nothing: "
                         f"{fidelity.summary()}")
    # A tolerance that a constant output meets judges nothing (refused at pairing too; a
    # hand-made harness meets the same rule here).
    lint(run.harness.policy, run.replay.expected)


def _discover_poison(run: Run) -> None:
    run.audit.discover(*run.ref)


def _opt_once(run: Run) -> Result | None:
    from .policy import check

    run.verdict = check(run.harness.policy, run.replay.expected, run.replay.run(*run.opt),
                        dtype_hints=run.hints)
    return None if run.verdict.passed else run.fail()


def _opt_repeated(run: Run) -> Result | None:
    run.verdict = run.audit.run_opt(*run.opt)
    return None if run.verdict.passed and run.failure() is None else run.fail()


def _mutate(run: Run) -> None:
    run.audit.mutate(*run.ref)  # ref alone: a mutation it cannot take ends setup, not a verdict


def _differential(run: Run) -> Result | None:
    run.audit.differential(*run.opt)
    return run.fail() if run.failure() else None


def _timing(run: Run) -> Result | None:
    # Before ABBA: work the timer misses may outlive the launch and disturb the meter.
    run.audit.timing(*run.ref, *run.opt)
    return run.fail() if run.failure() else None


def _measure(run: Run) -> None:
    o = run.options
    rule = _rule(run)
    # A replicate runs whole rounds of 8 blocks: a block budget too small for every
    # replicate gets one plain ABBA run (fewer replicates would widen the interval by a
    # larger t quantile than they narrow it).
    n = o.replicates if rule.max_blocks >= 8 * o.replicates else 1
    # Past n, more replicates (up to max_replicates) while they are cheap
    # (measure.another_replicate: their cost decides, never their values); by default
    # MAX_REPLICATES where the backend takes extra ones (its timing model says), else none.
    most = o.max_replicates if o.max_replicates is not None else \
        MAX_REPLICATES if run.device.timing_model().extra_replicates else n
    limit = max(n, most) if n > 1 else 1
    seed = o.seed if o.seed is not None else secrets.randbits(32)
    rule = rule.split(n)
    clocks_before = run.device.clocks()
    parts, samples = [], []
    started, planned_end = time.monotonic(), None
    waited = [0, 0]   # the kernels' ns on a CPU and waiting for one, over every replicate
    while len(parts) < n or another_replicate(
            len(parts), limit=limit, per_replicate_s=(time.monotonic() - started) / len(parts),
            extra_s=time.monotonic() - planned_end):
        i = len(parts)
        if i:  # fresh loads of both kernels and fresh pages under the regions: another
            _reload(run)   # placement of code and data, as a re-run in a new process meets
            run.device.renew_memory()
        what = f"replicate {i + 1}/{n}" if i < n else f"extra replicate {i + 1} (<= {limit})"
        before = run.device.sched_times() or {}
        abba, part = measure(run.time_one, rule=rule, seed=replicate_seed(seed, i),
                             progress=_meter(what if n > 1 else "A/B", rule,
                                             after=max(0, n - 1 - i)),
                             location=run.device.timing_model().location)
        for pid, (on_cpu, wait) in (run.device.sched_times() or {}).items():
            if pid in before:
                waited[0] += on_cpu - before[pid][0]
                waited[1] += wait - before[pid][1]
        parts.append(abba)
        samples.append(part)
        if len(parts) == n:
            planned_end = time.monotonic()
    clocks_after = run.device.clocks()
    joined = Samples.joined(samples)
    pooled = pooled_stats(joined)
    speed = pooled.to_json(SAMPLES)
    wait = waited[1] / sum(waited) if sum(waited) else None
    run_rel = run.device.run_rel(wait)
    offset_s = run.device.timing_model().run_offset_s
    if len(parts) > 1:
        rep = combine_replicates(parts, run_offset_s=offset_s, run_rel=run_rel)
        speed.update(speedup=rep.speedup, ci95=list(rep.ci95),
                     rel_ci_halfwidth=(rep.ci95[1] - rep.ci95[0]) / 2 / rep.speedup,
                     interval="re-run", mean_ci95=list(rep.mean_ci95),
                     replicate_sd_log=rep.sd_log, run_offset_ns=offset_s * 1e9,
                     run_rel_sd_log=run_rel or None, cpu_wait=wait,
                     run_sd_log=rep.run_sd_log, replicates=rep.replicate_rows(),
                     stopped_by=parts[-1].stopped_by)
    run.samples = samples_bytes(joined)
    # The samples archive's CRC catches accidents only; this ties it to the result.
    speed["samples_sha256"] = sha256(run.samples)
    speed["cache"] = o.cache
    if clocks_before or clocks_after:
        speed["clocks_mhz"] = {"before": clocks_before, "after": clocks_after}
    run.speed = convert(speed, Speed)
    run.medians = (pooled.ref_median_s, pooled.opt_median_s)


def _reload(run: Run) -> None:
    """ref and opt loaded again from their bytes (and the old loads given back)."""
    device = run.device
    old = (run.ref[0], run.opt[0])
    ref, opt = _ref_kernel(run), _opt_kernel(run)
    run.ref, run.opt = (ref, run.ref[1]), (opt, run.opt[1])
    if run.audit is not None:
        run.audit.ref_reloaded(ref)
    for kernel in old:
        device.unload(kernel)


def _rule(run: Run):
    o = run.options
    cfg = {**run.harness.info.get("measure", {}), **{
        k: v for k, v in (("min_blocks", o.min_blocks), ("max_blocks", o.max_blocks),
                          ("rel_ci_halfwidth", o.rel_ci), ("time_cap_s", o.time_cap_s))
        if v is not None}}
    return StoppingRule(**{k: cfg[k] for k in ("min_blocks", "max_blocks",
                                               "rel_ci_halfwidth", "time_cap_s") if k in cfg})


def _meter(what: str, rule, *, after: int = 0) -> Callable[[int, Any], None]:
    """A ``measure`` progress callback reporting a ``progress.Meter`` for ``what``; its ETA
    counts ``after`` more measurements like this one (replicates still to come)."""
    started = time.monotonic()

    def report(blocks: int, result) -> None:
        elapsed = time.monotonic() - started
        rel = result.rel_ci_halfwidth if result is not None else None
        eta = progress.eta_s(blocks=blocks, elapsed_s=elapsed, rel_ci=rel,
                             target=rule.rel_ci_halfwidth, min_blocks=rule.min_blocks,
                             max_blocks=rule.max_blocks, time_cap_s=rule.time_cap_s)
        if eta is not None and after:
            eta += after * (elapsed + eta)
        progress.measuring(progress.Meter(
            what, blocks, round(elapsed, 3), result.speedup if result else None,
            tuple(result.ci95) if result else None, rel, rule.rel_ci_halfwidth, eta))

    return report


def _aa_control(run: Run) -> None:
    rule = _rule(run)
    with _ref_alone(run):
        aa, _ = measure(run.time_one, rule=rule, seed=run.options.seed, aa=True,
                        progress=_meter("A/A", rule), location=run.device.timing_model().location)
    run.speed = run.speed.replace(aa_control=convert(aa.to_json(), Speed))


def _ref_alone(run: Run):
    """Timed blocks without opt: on the captured input (``Audit.captured_input``)."""
    return run.audit.captured_input() if run.audit is not None else contextlib.nullcontext()


def _control(run: Run) -> None:
    if run.systematic is None:  # once per placement: ref and its second load do not change
        rule = _rule(run)
        with _ref_alone(run):
            ctl, _ = measure(lambda w: run.time_one("ctl" if w == "opt" else "ref"),
                             rule=rule, seed=run.options.seed,
                             progress=_meter("ref vs its second load", rule),
                             location=run.device.timing_model().location)
        run.systematic = Systematic(control="identical binary (ref loaded twice)",
                                    speedup=ctl.speedup, ci95=ctl.ci95,
                                    slot_bias=ctl.slot_bias, blocks=ctl.blocks,
                                    bound=combine((1.0, 1.0), ctl.ci95)[2])
    lo, hi, _ = combine(run.speed.ci95, run.systematic.ci95)
    run.speed = run.speed.replace(systematic=run.systematic, combined_ci95=(lo, hi),
                                  difference=difference((lo, hi)))


def _rejudge_ref(run: Run) -> Result | None:
    run.audit.rejudge_ref(*run.ref)
    return run.fail() if run.failure() else None


def _impossible_speed(run: Run) -> Result | None:
    t_ref, t_opt = run.medians
    run.audit.speed(t_opt, t_ref)
    return run.fail() if run.failure() else None


def _pass(run: Run) -> Result:
    return run.passed()


#: Harness-level stages: run once per placement (a session then judges many candidates).
SETUP_UNCHECKED: list[Stage] = [
    ("verify", _verify), ("place", _place), ("load", _seal), ("load", _load_ref),
    ("ref", _ref_once), ("ref", _fidelity),
]
SETUP_CHECKED: list[Stage] = [
    ("verify", _verify), ("place", _place), ("load", _seal), ("load", _load_ref),
    ("load", _arm), ("ref", _ref_repeated), ("ref", _fidelity),
    ("trust:poison", _discover_poison), ("trust:mutate", _mutate),
]
#: Candidate-level stages: run for every opt.
CANDIDATE_UNCHECKED: list[Stage] = [
    ("load", _load_opt), ("opt", _opt_once), ("measure", _measure), ("control", _control),
    ("aa", _aa_control), ("measure", _pass),
]
CANDIDATE_CHECKED: list[Stage] = [
    ("load", _load_opt), ("opt", _opt_repeated), ("trust:differential", _differential),
    ("trust:timing", _timing), ("measure", _measure), ("control", _control),
    ("aa", _aa_control), ("trust:ref", _rejudge_ref), ("measure", _impossible_speed),
    ("measure", _pass),
]


def stages(options: RunOptions) -> tuple[list[Stage], list[Stage]]:
    """The (setup, candidate) stages a run with ``options`` goes through, in order."""
    setup, each = (SETUP_CHECKED, CANDIDATE_CHECKED) if options.checks else \
        (SETUP_UNCHECKED, CANDIDATE_UNCHECKED)
    return setup, [s for s in each if (options.aa or s[1] is not _aa_control)
                   and (options.control or s[1] is not _control)]


def _steps(run: Run, steps: list[Stage], stage: Callable[[str], None]) -> Result | None:
    """Run ``steps`` in order, timing each stage; the Result that ends them early, if any."""
    current, t0 = None, time.monotonic()
    try:
        for name, step in steps:
            if name != current:
                _clock(run.facts, current, t0)
                current, t0 = name, time.monotonic()
                stage(name)
                progress.stage(name)
            outcome = step(run)
            if outcome is not None:
                return outcome
        return None
    finally:
        _clock(run.facts, current, t0)


def prepare(root: Path, options: RunOptions, *, facts: Facts,
            stage: Callable[[str], None] = lambda s: None,
            extra_scratch: tuple = ()) -> tuple[Run, Result | None]:
    """Open, place and baseline the harness at ``root``: the Run candidates are judged on,
    and a ``fail`` Result when the baseline itself fails a check (then no candidate can
    pass). ``extra_scratch``: (name, size, align) buffers placed besides the harness plan's
    scratch (``_place_scratch``). The caller owns the Run's device (``close``)."""
    run = Run(root=Path(root), options=options, facts=facts,
              extra_scratch=tuple(extra_scratch), on_stage=stage)
    if not options.checks:
        facts.checks = Checks(enabled=False)
    try:
        failed = _steps(run, stages(options)[0], stage)
    except BaseException:
        close(run)
        raise
    run.setup_stage_s = dict(facts.stage_s)
    return run, failed.replace(stage_s=dict(facts.stage_s)) if failed else None


def evaluate(run: Run, candidate: Candidate, stage: Callable[[str], None] = lambda s: None
             ) -> tuple[Result, bytes | None]:
    """Judge one candidate on a prepared Run: its Result and raw samples (when timed)."""
    run.begin(candidate)
    outcome = _steps(run, stages(run.options)[1], stage)
    if outcome is None:
        raise AssertionError("the last stage of a run returns its Result")
    outcome = outcome.replace(stage_s=dict(run.facts.stage_s))
    return outcome, run.samples if outcome.speed is not None else None


def own_candidate(h) -> Candidate:
    """The harness's own opt: its same-layout kernel, or its launch plan."""
    plan = (h.plan, h.plan_code, h.plan_layouts) if h.plan is not None else None
    return Candidate(h.binary(h.opt), h.opt.kernel, h.opt.format, h.opt.launch_override,
                     h.spec.plan or h.opt.binary, plan)


def close(run: Run) -> None:
    if run.device is not None:
        run.device.close()
        run.device = None


def execute(root: Path, options: RunOptions, *, facts: Facts,
            stage: Callable[[str], None] = lambda s: None) -> tuple[Result, bytes | None]:
    """Run the harness at ``root`` in this process — its setup, then its own opt as the one
    candidate; its Result (not written) and, when speed was measured, the raw samples (the
    bytes of ``samples.npz``).

    ``facts`` is filled as the run goes (``stage_s`` too), so a caller that catches an error
    still has the environment and replay facts gathered before it.
    """
    run, failed = prepare(root, options, facts=facts, stage=stage)
    try:
        if failed is not None:
            return failed, None
        return evaluate(run, own_candidate(run.harness), stage)
    finally:
        close(run)


def _clock(facts: Facts, name: str | None, t0: float) -> None:
    if name is not None:
        facts.stage_s[name] = round(facts.stage_s.get(name, 0.0) + time.monotonic() - t0, 6)
