"""Run ref and opt of a harness to propose its tolerance policy (``kpair pair --propose-policy``).

``propose_policy(harness)`` replays, in this process on the harness's backend (as ``kpair
policy suggest`` replays ref; the device is sealed first, as a run seals it), ref twice and
opt once on the captured input, then ref and opt on ``runs`` mutated inputs (the harness's
planned mutations: declared, else derived from the regions ref only reads), and hands every
pair of outputs to ``kpair.policy.propose`` (pure), which measures the differences per
live-out region and proposes the tightest policy every run passes with a margin, or refuses
(``ToleranceOverCeiling``, exit 4) over the ceiling. ``pair_with_proposal`` is ``kpair pair
--propose-policy``: the harness made byte-exact, measured, then made again with the policy.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import numpy as np

from . import progress
from .backends import open_device
from .harness import Harness, create_harness
from .policy.propose import CEILING, MARGIN, Observed, Proposal, RegionSpec, propose
from .replay import Replay


def propose_policy(root: str | os.PathLike, *, runs: int = 8, margin: float = MARGIN,
                   ceiling: tuple[float, float] = CEILING, seed: int = 0,
                   device_options: dict | None = None) -> Proposal:
    """The tightest policy under which the harness at ``root``'s opt passes against its ref
    on the captured input and ``runs`` mutated inputs (see the module doc)."""
    h = Harness.open(root)
    m = h.snapshot.manifest
    spans: dict[str, list[tuple[int, int]]] = {}
    for o in m.output_spans:
        spans.setdefault(o.region, []).append((o.offset, o.offset + o.size))
    mutations, source = h.planned_mutations()
    rng = np.random.default_rng(seed)
    with open_device(h.backend, **(device_options or {})) as device:
        device.seal()
        scratch = [(b.name, b.size, b.align) for b in h.plan.scratch] if h.plan else []
        replay = Replay(device, h.snapshot, plan_scratch=scratch)
        dev = replay.device
        if m.is_range:
            ref = replay.load_range("ref")
        else:
            ref = dev.load(h.binary(h.ref), h.ref.kernel, fmt=h.ref.format)
            replay.check_abi(ref, "ref")
        if h.plan is not None:
            opt = replay.load_plan(h.plan, h.plan_code, h.plan_layouts)
        else:
            opt = dev.load(h.binary(h.opt), h.opt.kernel, fmt=h.opt.format)
            replay.check_abi(opt, "opt")
        ref_launch, opt_launch = h.launch(h.ref), h.launch(h.opt)
        written = {r.name for r in m.regions
                   if r.role in ("out", "inout") or (r.role is None
                                                     and r.pre.sha256 != r.post.sha256)}
        pairs = []
        progress.stage("propose: captured input")
        want = replay.run(ref, ref_launch)
        written |= {n for n, b in want.items() if b != replay.pre[n]}
        again = replay.run(ref, ref_launch)   # ref's own spread counts too
        pairs.append(("the captured input (ref against ref)", want, again))
        pairs.append(("the captured input", want, replay.run(opt, opt_launch)))
        for j in range(runs if mutations else 0):
            progress.stage(f"propose: mutated input {j + 1}/{runs}")
            state: dict[str, bytes] = {}
            for mu in mutations:
                state[mu.region] = bytes(mu.apply(state.get(mu.region, replay.pre[mu.region]),
                                                  rng))
            want = replay.run(ref, ref_launch, state=state)
            written |= {n for n, b in want.items() if b != state.get(n, replay.pre[n])}
            pairs.append((f"mutated input {j + 1}", want,
                          replay.run(opt, opt_launch, state=state)))
    specs = [RegionSpec(r.name, r.size, r.dtype, r.name in written,
                        tuple(spans.get(r.name, ()))) for r in m.regions]
    observed = Observed(specs, max_rtol=ceiling[1])
    for label, want, got in pairs:
        observed.add(label, want, got)
    what = "; ".join(mu.describe() for mu in mutations) or "none"
    how = (f"the captured input, ref repeated, and {runs if mutations else 0} mutated "
           f"input(s), mutations {source}: {what}")
    return propose(observed, margin=margin, ceiling=ceiling, base=h.policy, how=how)


def pair_with_proposal(snapshot: str | os.PathLike, out: str | os.PathLike, *,
                       runs: int = 8, margin: float = MARGIN,
                       ceiling: tuple[float, float] = CEILING, policy=None, **pair):
    """``create_harness`` whose policy is proposed from ref-against-opt differences: the
    harness is made with ``policy`` (default byte-exact), measured (``propose_policy``), then
    made again in the same place with the proposed policy. (harness, proposal); on a refusal
    nothing is left at ``out`` (an empty directory the caller had stays, empty)."""
    out = Path(out)
    existed = out.exists()
    h = create_harness(snapshot, out, policy=policy, **pair)
    try:
        proposal = propose_policy(h.root, runs=runs, margin=margin, ceiling=ceiling)
        plan = h.root / h.spec.plan if h.spec.plan else None
        with _moved_aside(h.root, plan) as kept:
            _clear(out, existed)
            pair = {**pair, "opt_capture": None, "plan": kept} if kept else pair
            h = create_harness(snapshot, out, policy=proposal.policy, **pair)
    except BaseException:
        _clear(out, existed)
        raise
    return h, proposal


@contextlib.contextmanager
def _moved_aside(root: Path, plan: Path | None):
    """A harness's plan folder copied out of it for the second pairing (a captured
    candidate is bound once: its plan is reused), removed afterwards; None without one."""
    if plan is None:
        yield None
        return
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kpair-propose-") as tmp:
        dest = Path(tmp) / "plan"
        shutil.copytree(plan.parent, dest)
        yield dest / plan.name


def _clear(out: Path, existed: bool) -> None:
    shutil.rmtree(out, ignore_errors=True)
    if existed:
        with contextlib.suppress(OSError):
            out.mkdir()


__all__ = ["pair_with_proposal", "propose_policy"]
