"""Audit: the trust checks of ``kpair.trust.findings``, driven through a ``Replay``.

Every launch an Audit makes goes through the replay with one of its ``Armor``'s hook sets
(``kpair.trust.armor``): canaries around every region always; poison in ref's write-only
bytes for every opt launch, for ref's poisoned control run and for both kernels once timing
starts. ``Audit`` runs the phases of a checked run, in this order (``kpair.pipeline``):
``baseline`` (ref repeated: determinism), ``discover`` (ref on two fills of each candidate
region: which bytes are write-only; ref's control under each poison), ``run_opt`` (ref's
control under the candidate's own poisons, then opt repeated, the poisons in turn),
``differential`` (ref and opt on mutated inputs), ``timing`` (timer
against a synchronized wall-clock window), ``time_one`` (the ABBA launches: poison and guards
on both kernels; every timed launch of every kernel judged: in a block on a fresh secret
sparse change of the captured input, the block's two launches against each other (opt against
ref under the policy where they differ), else against the captured input's expected output) and
``speed``; ``rejudge_ref`` runs ref again once opt is loaded and has run.
``findings()`` gives one ``trust.Finding`` per check. One Audit per run, bound to one Replay.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np

from ..backends import Kernel
from ..backends.base import byte_diff
from ..dtypes import DTYPES, FLOAT_DTYPES, dtype_size
from ..errors import KpairError, UsageError
from ..placement import holds_pointers
from ..policy import Mutation, Policy, Verdict, check
from ..policy.judge import passes
from ..policy.mutation import Patch, completed, derive
from ..replay import Replay
from ..snapshot import Launch
from . import findings as trust
from .armor import HELD_WORDS, QUIET_NAN, Armor, describe_violation, guard_bands, poison_left
from .findings import CHECKS, Finding, OptRun

REF_RUNS = 3        # baseline determinism
OPT_RUNS = 3        # opt repeated, under the candidate's poisons in turn
#: Draws of a candidate's poisons at most before the last ones ref's control passed are kept.
POISON_DRAWS = 3
#: The second discovery fill is the first (a quiet NaN, 0x7FC0xxxx) xor this: every byte
#: differs, and the high half becomes 0x3F65, a positive number as f32, bf16 and f16.
FILL_FLIP = 0x40A5A5A5
TIMING_LAUNCHES = 5  # windows per kernel
#: Sparse differential runs after the whole-region ones (ref is judged again on the first,
#: with opt loaded); the timed blocks' fresh inputs are made the same way, spread out.
SPARSE_RUNS = 2
#: Verdicts of timed launches' outputs kept, by the host objects judged (``_judge_timed``).
JUDGED_KEPT = 8


class Audit:
    def __init__(self, replay: Replay, policy: Policy, hints: dict[str, str], *, seed: int,
                 skip: Iterable[str] = (), harness: str = "HARNESS"):
        self.skip = set(skip)
        unknown = self.skip - set(CHECKS)
        if unknown:
            raise UsageError(f"unknown check {sorted(unknown)[0]!r} (one of {', '.join(CHECKS)})")
        self.replay, self.policy, self.hints, self.harness = replay, policy, hints, harness
        self.rng = np.random.default_rng([seed, 1])
        regions = [(r.name, a, r.size) for r, a in zip(replay.regions, replay.addresses,
                                                       strict=True)]
        # Scratch (a range's, a plan's) is memory a program may use: guarded like a region,
        # never a band itself.
        regions += [(f"scratch:{name}", a, n) for name, a, n in getattr(replay, "scratch", ())]
        bands = [] if "guard_bands" in self.skip else \
            guard_bands(regions, replay.device.mapped_ranges())
        self.armor = Armor(replay.device, bands, np.random.default_rng([seed, 2]),
                           pre=replay.pre)
        # Placed scratch a launched program does not own: canaried as bands for its launch.
        self.armor.guard_scratch = "guard_bands" not in self.skip
        self.found: dict[str, Finding] = {}
        self.ref_posts: list[dict[str, bytes]] = []
        self.opt_runs: list[OptRun] = []
        self.diff_runs: list[OptRun] = []
        self.diff_changed: list[bool] = []
        self.diff_mutated: list[list[str]] = []
        self.mutation_source: str | None = None   # set when the differential runs are chosen
        self.mutation_list: tuple[Mutation, ...] = ()
        # Declared mutations completed with derived ones ("derived_for": the regions), or
        # kept exactly ("mutations_exact": the policy's note, the regions left unvaried).
        self.mutation_notes: dict = {}
        self._mutated: list[tuple] = []   # (label, state, ref's output, changed?, what)
        #: (len(_mutated) when computed, the regions ref writes on some mutated input)
        self._written_mutated: tuple[int, set[str]] = (0, set())
        self._ref_run: tuple = ()      # (ref's latest load, its launch)
        self.not_tested: dict[str, str] = {}
        self.control = "no region to poison"
        self._proven: dict[str, list[int]] = {}   # the last poison words ref's control passed
        # The poisons in use were drawn and proven by ref's control, and no candidate has
        # launched under them yet (discover's, for the first candidate).
        self._unseen = False
        self._unpoisoned: dict[str, str] = {}   # this candidate's: run -> why not poisoned
        self.windows: dict[str, list[tuple[float, float]]] = {"ref": [], "opt": []}
        self.timed = {"launches": 0, "checked": 0, "windows": 0, "failed": [],
                      "violations": []}
        self.ref_timed = {"launches": 0, "checked": 0, "failed": []}
        # Every timed launch of opt gets a check run's checks: the policy's criterion
        # (timed_outputs), the one-sided error (bias: its flagged ranges) and input integrity
        # (the inputs it modified).
        self.timed_bias: dict = {"judged": 0, "flagged": []}
        self.timed_inputs: dict = {"checked": 0, "modified": []}
        self._block_inputs: tuple[object, dict] | None = None   # (patches, expected inputs)
        self.rejudged: list[tuple[str, bool, str]] = []
        self.ref_code: dict | None = None
        self.ref_code_before: str | None = None   # ref's code digest at load, if readable
        # The captured input and the sparse ones ref is judged again on: (label, state or
        # None, expected outputs, whether their launches are poisoned).
        self.variants: list[tuple[str, dict[str, bytes] | None, dict[str, bytes], bool]] = [
            ("captured", None, replay.expected, True)]
        self._fresh_rng = np.random.default_rng([seed, 3])
        self._block: tuple[int, bool] = (0, False)   # fresh blocks: (block, second launch)
        self._captured_blocks = 0    # of them, blocks no sparse range could change
        self._output_names: list[str] | None = None
        self._changed: dict[str, bool] | None = None    # _modified(), once ref_posts are known
        self._changed_bytes: dict[str, int] | None = None   # _bytes_changed(), likewise
        self._sparse: list[Mutation] = []    # the sparse mutations: fresh timed inputs
        self._opt_absent = False    # blocks of ref alone (captured_input)
        self._patches: list[tuple[str, Patch]] = []   # the current block's input
        self._first: tuple[str, int, dict] | None = None   # its first launch, outputs kept
        self._pointers: dict[str, bool] = {}            # _holds_pointers(), per region
        # Regions ref changes and also reads (not every byte write-only): inputs in place,
        # mutated like read-only ones (discover() finds them).
        self._in_place: list[str] = []
        self._judged: list[tuple[int, dict[str, bytes], str | None]] = []
        self._cache: tuple[tuple, dict[str, Finding]] | None = None
        # The latest load of each kernel: the device tallies refused system calls per code
        # object, over every load of it (``Device.refused_calls``).
        self.kernels: dict[str, Kernel | None] = {"ref": None, "opt": None}

    def reset_candidate(self) -> None:
        """Forget everything observed of the last opt; keep ref's runs, the poison plan, the
        mutated inputs and ref's outputs there (a session judges the next candidate on them).
        """
        self.found.pop("impossible_speed", None)
        self.opt_runs, self.diff_runs = [], []
        self.diff_changed, self.diff_mutated = [], []
        self.windows = {"ref": [], "opt": []}
        self.timed = {"launches": 0, "checked": 0, "windows": 0, "failed": [],
                      "violations": []}
        self.ref_timed = {"launches": 0, "checked": 0, "failed": []}
        self.timed_bias = {"judged": 0, "flagged": []}
        self.timed_inputs = {"checked": 0, "modified": []}
        self._drop_block_inputs()
        self._judged = []
        self._block, self._captured_blocks = (0, False), 0
        if self._first is not None:
            self.replay.drop(self._first[2])
            self._first = None
        self.rejudged, self.ref_code = [], None
        self.kernels["opt"] = None
        self._cache = None
        self._unpoisoned = {}
        if not self._unseen:   # new poisons, proven by ref's control before opt's first launch
            self.armor.renew()

    # ---------------------------------------------------------------- phases

    def _launch(self, kernel: Kernel, launch: Launch, *, poison: bool,
                state: dict[str, bytes | int] | None = None, again: bool = False,
                read: bool = True) -> dict[str, bytes]:
        """One launch on ``state`` (the pre-state where None), poisoned or only guarded;
        ``again``: the poison of the launch before; ``read`` False: nothing read back."""
        a = self.armor
        a.pending = []   # compares armed for a timed launch (``_with_launch``) never carry over
        if not poison:
            hooks = a.guarded
        elif any(name in a.plan for name in state or {}):   # poison what the state put there
            hooks = a.poisoned_state_again if again else a.poisoned
        else:                                    # the planned regions hold their pre-state
            hooks = a.poisoned_again if again else a.poisoned_pre
        return self.replay.run(kernel, launch, state=state, hooks=hooks, read=read)

    def _violations(self, role: str, label: str | None = None) -> list[dict]:
        extra = {"role": role} if label is None else {"role": role, "run": label}
        return [dict(v, **extra) for v in self.armor.last]

    def _ref(self, kernel: Kernel, launch: Launch, what: str,
             state: dict[str, bytes | int] | None = None, *, poison: bool = False
             ) -> dict[str, bytes]:
        post = self._launch(kernel, launch, poison=poison, state=state)
        if self.armor.last and state is None:
            raise KpairError(f"the baseline (ref) writes outside the captured regions "
                             f"({describe_violation(self.armor.last[0])}, {what}): the "
                             "snapshot misses memory ref touches, so the replay proves nothing")
        return post

    def baseline(self, ref: Kernel, launch: Launch) -> list[dict[str, bytes]]:
        """ref, REF_RUNS times on the pre-state; the first run is the fidelity run."""
        n = 1 if "baseline_determinism" in self.skip else REF_RUNS
        self.kernels["ref"], self._ref_run = ref, (ref, launch)
        self.ref_posts = [self._ref(ref, launch, f"ref run {i + 1}") for i in range(n)]
        self._changed, self._changed_bytes, self._pointers = None, None, {}
        self.found["baseline_determinism"] = trust.skipped(
            "baseline_determinism", "skipped by request") if n == 1 else \
            trust.baseline_determinism(self.policy, self.ref_posts, hints=self.hints,
                                       harness=self.harness)
        return self.ref_posts

    def _modified(self) -> dict[str, bool]:
        """Whether ref writes each region: some ref run changes it (of ``baseline``'s runs),
        or capture saw the program write it (role ``out`` or ``inout``: a range's output
        whose block already held what a warm-up left there comes out of ref unchanged, yet
        it is an output, never an input opt must leave alone). Computed once."""
        if self._changed is None:
            pre = self.replay.pre
            written = {r.name for r in self.replay.regions if r.role in ("out", "inout")}
            self._changed = {n: n in written or any(p[n] != pre[n] for p in self.ref_posts)
                             for n in pre}
        return self._changed

    def _bytes_changed(self) -> dict[str, int]:
        """Bytes ref's first run changes, per region (``changed_regions``; computed once).
        Where the device holds copies of both the pre-state and that answer (``Known``), they
        are counted there: the answer put in the region and compared with the held pre-state
        (every launch restores the region first), instead of comparing the two on the host."""
        if self._changed_bytes is None:
            r, d = self.replay, self.replay.device
            normal, modified, out = self.ref_posts[0], self._modified(), {}
            for name, pre in r.pre.items():
                post, got = normal[name], None
                if not modified[name] or post is pre:
                    got = (0, None)
                elif d.compares_in_place:
                    held = r.known.find(name, post), r.known.find(name, pre)
                    if None not in held and d.intact(held[0]):
                        d.put(r.address_of(name), held[0])
                        got = d.compare(r.address_of(name), len(pre), held[1])
                out[name] = got[0] if got is not None else \
                    trust.changed_regions({name: pre}, {name: post})[name]
            self._changed_bytes = out
        return self._changed_bytes

    def _holds_pointers(self, name: str) -> bool:
        """Whether region ``name``'s captured pre-state holds a pointer into the replayed
        regions, or ref's post-state there does where it differs (computed once)."""
        if name not in self._pointers:
            r = self.replay
            delta = r.info.mapping.delta
            lo, hi = r.span[0] + delta, r.span[1] + delta
            address = r.address_of(name)
            normal = self.ref_posts[0][name]
            self._pointers[name] = holds_pointers(r.pre[name], address, lo, hi) or (
                normal != r.pre[name] and holds_pointers(normal, address, lo, hi))
        return self._pointers[name]

    def discover(self, ref: Kernel, launch: Launch) -> None:
        """Find the bytes ref writes whatever they held, and arm poison for them."""
        r = self.replay
        normal, modified = self.ref_posts[0], self._modified()
        plan = {}
        regions = [] if "poisoned_outputs" in self.skip else \
            list(zip(r.regions, r.addresses, strict=True))
        for region, address in regions:
            name = region.name
            if self._holds_pointers(name):
                self.not_tested[name] = "holds pointers into the captured regions"
                continue
            if not modified[name] and self.hints.get(name) not in FLOAT_DTYPES:
                self.not_tested[name] = (
                    "ref leaves it unchanged and it is not known to hold floats: filling it "
                    "could fault a kernel that reads it (as indices or sizes)")
                continue
            # Two fill words that differ in every byte, written on the device; the first is
            # of the poison's quiet-NaN family, so a byte whose value ref drops only while it
            # holds a number (kept as NaN, as x * 0 keeps it) is not taken for write-only;
            # the second a positive number (0.9 as f32, bf16 and the high half as f16), so
            # one that ref keeps only while it is positive (an in-place ReLU) is not either.
            x = QUIET_NAN | int(self.rng.integers(0, 2**16))
            filled, runs, why, out_of_bounds = [], None, "", False
            hint = self.hints.get(name)
            granule = dtype_size(hint) if hint in DTYPES else 4
            for fill in (x, x ^ FILL_FLIP):
                self._launch(ref, launch, poison=False, state={name: fill}, read=False)
                if self.armor.last:
                    why, out_of_bounds = "ref writes out of bounds when it is filled", True
                    break
                why = self._changed_elsewhere(name, normal)
                if not why:   # unchanged elsewhere, or only a read back can tell
                    filled.append(r.read_back(fills={name: fill}))
                    why = trust.ref_reads(name, self.policy, normal, filled[-1]) \
                        if why is None else ""
                if why:  # an input: one fill shows it, the second would add nothing
                    break
                if trust.none_kept(name, self.policy, normal, filled[-1], granule):
                    # Nothing came out as in ref's answer (read and written, as an update in
                    # place is): no later fill can make a byte write-only.
                    runs, why = trust.write_only_runs(name, self.policy, normal, filled,
                                                      granule, read_checked=len(filled))
                    break
            else:
                runs, why = trust.write_only_runs(name, self.policy, normal, filled, granule,
                                                  read_checked=len(filled))
            if runs is None:
                self.not_tested[name] = why
            else:
                plan[name] = (address, region.size, runs)
            if modified[name] and not out_of_bounds and (
                    runs is None or runs.nbytes < region.size):
                self._in_place.append(name)
        if plan:
            self.armor.plan = plan
            why = self._prove_poison()
            if why is None:
                self.control = ("ref reproduces its post-state with every write-only byte "
                                f"poisoned, under each of the {HELD_WORDS} poisons launches on "
                                "it take in turn (drawn anew and proven again for every "
                                "candidate)")
            else:
                self.control = f"ref fails under poison ({why}): poison not applied"
                self.armor.plan = {}
        self.found["noop"] = trust.noop(self._bytes_changed(), list(self.armor.plan))

    def _changed_elsewhere(self, name: str, normal: dict[str, bytes]) -> str | None:
        """``ref_reads`` after a discovery fill of ``name``, decided where the memory is
        (each other region compared with ref's normal answer there, in order: nothing read
        back to learn that an input's fill changed an output): why ``name`` is an input, ""
        if no other region changed, or None where a compare cannot tell (no device copies, a
        tolerance over a region, an answer held nowhere): then it is read back."""
        r = self.replay
        if not r.device.compares_in_place:
            return None
        for k, want in normal.items():
            if k == name:
                continue
            if self.policy.for_region(k):
                return None
            equal = r.equals({k: want})
            if equal is None:
                return None
            if not equal:
                return trust.reads_because(k)
        return ""

    def _prove_poison(self) -> str | None:
        """ref under each poison that launches on the pre-state take (``control_launches``),
        which must reproduce its post-state: bytes that look write-only to the two discovery
        fills may still be read for other values (a guard that keeps huge numbers, a
        threshold), and opt must never be judged under a poison that changes ref's own answer.
        Up to POISON_DRAWS draws, the last of the quiet-NaN family only (the discovery's first
        fill, which ref was seen to overwrite); where none passes, the last proven words are
        taken back. None if the poisons now in use passed, else why the last draw failed."""
        normal, why = self.ref_posts[0], None
        for draw in range(POISON_DRAWS):
            n = self.armor.control_launches()
            for k in range(n):
                post = self._ref(*self._ref_run, "poisoned control run", poison=True)
                failure = self._poison_failure(normal, post)
                if failure:
                    why = f"control {k + 1} of {n}: {failure}"
                    break
            else:
                self._proven, self._unseen = self.armor.words(), True
                return None
            self.armor.renew(quiet_nan=draw + 2 == POISON_DRAWS)
        if self._proven:
            self.armor.restore(self._proven)
            return None
        return why

    def run_opt(self, opt: Kernel, launch: Launch) -> Verdict:
        """ref's control under this candidate's poisons (``_prove_poison``; the first
        candidate's were drawn and proven in ``discover``, and no launch has had them since),
        then opt, OPT_RUNS times, the poisons in turn, fresh canaries each; the first failing
        verdict (or the first)."""
        r = self.replay
        if self.armor.plan and not self._unseen:
            self._prove_poison()
        self._unseen = False
        self.kernels["opt"] = opt
        for i in range(OPT_RUNS):
            post = self._launch(opt, launch, poison=True)
            v = check(self.policy, r.expected, post, dtype_hints=self.hints)
            self.opt_runs.append(OptRun(f"opt run {i + 1}", r.pre, r.expected, post, v,
                                        self.armor.poisoned_regions(),
                                        tuple(self._violations("opt"))))
        return next((x.verdict for x in self.opt_runs if not x.verdict.passed),
                    self.opt_runs[0].verdict)

    def mutations(self) -> tuple[tuple[Mutation, ...], str]:
        """The mutations of the differential runs and where they come from: "declared" by
        the policy, "off" (the policy declares none: ``"mutations": []``) or "derived".
        Declared ones are completed with the derived ones of every input region they leave
        out (``mutation_notes["derived_for"]``), unless the policy keeps them exactly
        (``mutations_exact``, with its note: ``mutation_notes["mutations_exact"]``)."""
        declared = self.policy.mutations
        if declared is not None and not declared:
            return (), "off"
        r = self.replay
        pointers = [reg.name for reg in r.regions if self._holds_pointers(reg.name)]
        regions = [(reg.name, reg.size, self.hints.get(reg.name)) for reg in r.regions]
        inputs = self._inputs() + self._in_place
        if declared is None:
            return derive(regions, inputs, pointers), "derived"
        named = {m.region for m in declared}
        left_out = derive(regions, [n for n in inputs if n not in named], pointers)
        muts, added = completed(declared, left_out)
        if self.policy.mutations_exact:
            self.mutation_notes = {"mutations_exact": {"note": self.policy.note,
                                                       "unvaried": added}}
            return declared, "declared"
        self.mutation_notes = {"derived_for": added} if added else {}
        return muts, "declared"

    def mutate(self, ref: Kernel, ref_launch: Launch) -> None:
        """ref on every mutated input, first and alone: a mutation ref itself cannot take
        (it faults or hangs) ends this phase, where the runner can tell it from opt's fault."""
        muts, self.mutation_source = self.mutations()
        self.mutation_list = muts
        if not muts or "differential" in self.skip:
            return
        # Whole-region runs first, then the sparse ones (fresh timed inputs change the same
        # ranges).
        runs = [[m for m in muts if m.count > j] for j in range(max(m.count for m in muts))]
        sparse = list({(m.region, m.start, m.end): m.sparse() for m in muts}.values())
        runs += [sparse] * SPARSE_RUNS
        self._sparse = sparse
        r, normal = self.replay, self.ref_posts[0]
        # Every run's mutated regions are drawn in worker threads (numpy's gathers leave the
        # GIL), each chain with a generator seeded here in order: the inputs are the seed's,
        # and drawing the later runs overlaps ref's launches on the earlier ones.
        plans = []
        for run in runs:
            chains: dict[str, list[tuple[Mutation, np.random.Generator]]] = {}
            what, drawn = [], set()
            for m in run:
                key = (m.region, m.start, m.end)
                if m.method == "permute" and key in drawn:
                    continue   # a resampled range is already in random order: same inputs
                if m.method == "resample":
                    drawn.add(key)
                seed = int(self.rng.integers(2**63))
                chains.setdefault(m.region, []).append((m, np.random.default_rng(seed)))
                what.append(m.describe())
            plans.append((chains, what))

        held = r.device.compares_in_place

        def draw(region: str, chain: list[tuple[Mutation, np.random.Generator]], sparse: bool
                 ) -> tuple[bytes, np.ndarray | None]:
            data = r.pre[region]
            for m, rng in chain:
                data = m.apply(data, rng)
            # A sparse input's changed words are found here too, off the launching thread
            # (``Replay.hold_sparse`` builds its device copy from them).
            return data, r.sparse_words(region, data) if sparse and held else None

        # ref runs the sparse inputs first: they are drawn sooner (a copy with a few
        # elements changed, where a whole-region draw gathers every element), and the
        # whole-region ones are drawn meanwhile. Their results are kept in run order.
        first = len(runs) - SPARSE_RUNS
        order = [*range(first, len(runs)), *range(first)]
        done: dict[int, tuple] = {}
        with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
            drawing = {j: {name: pool.submit(draw, name, chain, j >= first)
                           for name, chain in plans[j][0].items()} for j in order}
            for j in order:
                drawn = {name: f.result() for name, f in drawing[j].items()}
                done[j] = self._mutate_run(ref, ref_launch, j, len(runs),
                                           {name: data for name, (data, _) in drawn.items()},
                                           plans[j][1], normal,
                                           {name: w for name, (_, w) in drawn.items()})
        for j in sorted(done):
            if done[j] is not None:
                entry, variant = done[j]
                self._mutated.append(entry)
                if variant is not None:
                    self.variants.append(variant)

    def _mutate_run(self, ref: Kernel, ref_launch: Launch, j: int, n_runs: int,
                    state: dict[str, bytes], what: list[str], normal: dict[str, bytes],
                    words: dict[str, np.ndarray | None]) -> tuple[tuple, tuple | None] | None:
        """ref on mutated input ``j`` (of ``n_runs``; the last SPARSE_RUNS are sparse, and are
        kept as ``variants`` for ref's rejudging); ``words``: each sparse region's changed
        words (``Replay.sparse_words``; None: too many, or not held on the device). Returns
        its ``_mutated`` entry and its variant (None for a whole-region run), or None where
        ref cannot take the input."""
        r = self.replay
        sparse = j >= n_runs - SPARSE_RUNS
        if sparse:
            for name, data in state.items():
                if words.get(name) is not None:
                    r.hold_sparse(name, data, words[name])
        label = f"differential run {j + 1}"
        expected = self._launch(ref, ref_launch, poison=False, state=state)
        if self.armor.last:  # the mutated input is not one ref can take: not a verdict
            self.not_tested[label] = "ref writes out of bounds on this mutated input"
            return None
        # A region mutated in place is an output too; a read-only one comes out as mutated.
        changed = any(expected[k] != normal[k] for k in expected
                      if k not in state or k in self._in_place)
        if not sparse:
            return (label, state, expected, changed, what), None
        for name, data in state.items():
            r.pin(name, data)
        # Only ref's rejudging runs on it (unpoisoned where poison is planned: no launch is
        # spent here to learn whether ref's answer survives it).
        return (label, state, expected, changed, what), \
            (label, state, expected, not self.armor.plan)

    def ref_reloaded(self, ref: Kernel) -> None:
        """ref was loaded afresh (a measurement replicate): later launches use that load."""
        self.kernels["ref"] = ref
        if self._ref_run:
            self._ref_run = (ref, self._ref_run[1])

    def _poison_holds(self, j: int) -> bool:
        """Whether ref's answer on mutated input ``j`` survives the poison opt's launch just
        had (the same words). Bytes write-only on the captured input may be read on a mutated
        one (a mask that chooses between writing and updating), or for some poison values:
        poison there changes ref's own answer."""
        label, state, expected, _, _ = self._mutated[j]
        under = self._launch(*self._ref_run, poison=True, state=state, again=True)
        holds = not self.armor.last and self._poison_failure(expected, under) is None
        if not holds:
            self._unpoisoned[label] = ("on this mutated input ref reads bytes that are "
                                       "write-only on the captured one, under the poison opt "
                                       "had: opt's run on it is not poisoned")
        return holds

    def _left_poison(self, expected: dict[str, bytes], post: dict[str, bytes]) -> bool:
        """Whether the last launch left a whole poison word as written where ``expected``
        holds something else (what ``poisoned_outputs`` fails): under a tolerance, a few
        elements still holding poison can pass the policy."""
        return any(poison_left(runs, word, expected[name], post[name])[0]
                   for name, (word, runs) in self.armor.poisoned_regions().items())

    def _poison_failure(self, expected: dict[str, bytes], post: dict[str, bytes]
                        ) -> str | None:
        """Why ref's run under the last launch's poison does not stand for its answer: it
        fails the policy against ``expected``, or leaves poison words as written; None if it
        stands."""
        v = check(self.policy, expected, post, dtype_hints=self.hints)
        if not v.passed:
            return v.summary()
        if self._left_poison(expected, post):
            return ("ref leaves poison words as written (within the policy's tolerance, but "
                    "poisoned_outputs would fail)")
        return None

    def differential(self, opt: Kernel, opt_launch: Launch) -> None:
        """opt on the inputs ``mutate`` prepared, judged against ref's outputs there; poisoned,
        unless it fails (or leaves poison) where the poison changes ref's own answer (or ref
        leaves it too): then it runs again without. Guard violations of both launches count."""
        r = self.replay
        for j, (label, state, expected, changed, what) in enumerate(self._mutated):
            post = self._launch(opt, opt_launch, poison=True, state=state)
            v = check(self.policy, expected, post, dtype_hints=self.hints)
            violations = self._violations("opt")
            if self.armor.plan and (not v.passed or self._left_poison(expected, post)) \
                    and not self._poison_holds(j):
                post = self._launch(opt, opt_launch, poison=False, state=state)
                v = check(self.policy, expected, post, dtype_hints=self.hints)
                violations += self._violations("opt")
            self.diff_runs.append(OptRun(label, {**r.pre, **state}, expected, post, v,
                                         self.armor.poisoned_regions(), tuple(violations)))
            self.diff_changed.append(changed)
            self.diff_mutated.append(what)

    def timing(self, ref: Kernel, ref_launch: Launch, opt: Kernel, opt_launch: Launch) -> None:
        """Timer against a synchronized wall-clock window, both kernels, interleaved; opt's
        outputs judged after every window as after a timed block's launches, so no launch of
        opt goes unjudged (windows are opt's launches 4 + D to 8 + D, D the differential
        runs: a kernel that counts its launches finds nothing to gain there)."""
        if "timing_integrity" in self.skip:
            return
        judge = "timed_outputs" not in self.skip
        for i in range(TIMING_LAUNCHES):
            # With fresh timed blocks the windows get fresh inputs too: a kernel cannot tell
            # a window from a timed launch by having seen its input before.
            # Both launches of a window pair take the same poison, in turn by pair, as both
            # launches of a timed block do: opt's poison never tells a window from a block.
            patches = self._fresh_input() if self._fresh else []
            self._hold_inputs(patches)
            kept, found = None, {}
            for role, k, launch, hooks in (
                    ("ref", ref, ref_launch, self.armor.poisoned_pre),
                    ("opt", opt, opt_launch, self.armor.poisoned_again)):
                inputs = self._input_checks(role, patches)
                judged = judge and role == "opt"
                found = self._with_launch(
                    inputs, kept=kept if judged else None,
                    captured={n: self.variants[0][2][n] for n in self._outputs()}
                    if judged and kept is None else None)
                self.windows[role].append(self.replay.time_window(
                    k, launch, patches=patches, hooks=hooks))
                found = found()
                self._timed_guards(role, f"timing-window launch {i + 1}")
                self._timed_inputs(f"timing window {i + 1}", inputs, found)
                if judge and patches and role == "ref":
                    kept = self.replay.keep(self._outputs())
            if judge:
                self._judge_window(i + 1, kept, found)
        self._drop_block_inputs()

    def _judge_window(self, window: int, kept: dict | None, found: dict) -> None:
        """opt's outputs after timing window ``window``: against ref's in the same window
        (``kept``, on a fresh input) or against the captured input's expected outputs
        (``found``: the compares made with the window's canary check)."""
        outputs, label = self._outputs(), f"timing window {window}"
        try:
            summary = self._judge_block(outputs, kept, kept_expected=True, label=label,
                                        found=found) \
                if kept is not None else self._judge_captured(outputs, label, found)
        finally:
            if kept is not None:
                self.replay.drop(kept)
        self.timed["windows"] += 1
        if summary is not None:
            self.timed["failed"].append({"launch": window, "window": True, "summary": summary,
                                         "input": "a fresh sparse one" if kept is not None
                                         else "captured"})

    def _timed_guards(self, role: str, label: str) -> None:
        if role == "opt":
            self.timed["violations"] += self._violations(role, label)

    @property
    def _fresh(self) -> bool:
        """Whether every timed block gets an input no launch had before (there are sparse
        mutations to make it from, and opt may run in it), or repeats the captured one."""
        return bool(self._sparse) and not self._opt_absent

    @contextmanager
    def captured_input(self) -> Iterator[None]:
        """Blocks where opt does not run (ref against its second load, A/A) time the
        captured input, each launch judged against its known output on the device: nothing
        there is the candidate's, and a fresh input per block would only cost time (0.06 s
        of the 0.55 s that checks added to axpbyz on an H200, 2026-12-04)."""
        assert not self._block[1], "a block is open"
        self._opt_absent = True
        try:
            yield
        finally:
            self._opt_absent = False

    def time_one(self, kernel: Kernel, launch: Launch, role: str) -> float:
        """One timed launch (poison and canaries on both kernels) on the input of the current
        block (the meter launches in pairs: the first launch of a pair sets the input, the
        second reuses it). With fresh blocks (``_time_fresh``) no input repeats; without
        mutations to make them (``"mutations": []``) every block runs the captured input.
        After every launch the outputs are judged: opt's under ``timed_outputs``, ref's and
        its control's under ``ref_integrity``. Nothing in a launch tells a kernel whether it
        is timed, judged or which input it was given beyond the bytes it reads."""
        if role == "opt":
            self.kernels["opt"] = kernel   # a replicate's fresh load
        if self._fresh:
            return self._time_fresh(kernel, launch, role)
        label = self.variants[0][0]
        check_name = "timed_outputs" if role == "opt" else "ref_integrity"
        judged = check_name not in self.skip
        inputs = self._input_checks(role, [])
        outputs = self._outputs()
        want = {k: self.variants[0][2][k] for k in outputs} if judged else {}
        found = self._with_launch(inputs, captured=want)
        t = self.replay.time_one(kernel, launch, hooks=self.armor.poisoned_pre)
        found = found()
        tally = self.timed if role == "opt" else self.ref_timed
        n = tally["launches"] = tally["launches"] + 1
        self._timed_guards(role, f"timed launch {n}")
        self._timed_inputs(f"timed launch {n}", inputs, found)
        if judged:
            tally["checked"] += 1
            failed = self._judge_captured(outputs, f"timed launch {n}" if role == "opt"
                                          else None, found)
            if failed is not None:
                tally["failed"].append({"launch": n, "role": role, "input": label,
                                        "summary": failed})
        return t

    def _fresh_input(self) -> list[tuple[str, Patch]]:
        """An input no launch had before: (region, ``Patch``) writes over the captured one,
        a few elements in every window of every sparse-mutated range, from the secret
        stream."""
        pre = self.replay.pre
        return [(m.region, p) for m in self._sparse
                if (p := m.patch(pre[m.region], self._fresh_rng)) is not None]

    def _time_fresh(self, kernel: Kernel, launch: Launch, role: str) -> float:
        """One timed launch of a block whose input no launch had before: the captured input
        with a fresh secret change of a few elements in every sparse-mutated range, so a kernel
        that remembers answers to inputs it has seen never sees one again. Both launches of
        the block get that input and the same poison; the first one's outputs are kept on the
        device and the second one's compared with them there, and where they differ opt is
        judged against ref under the policy. (Blocks without opt, ref against its control and
        A/A, run the captured input: ``captured_input``.)"""
        block, second = self._block
        if not second:
            self._patches = self._fresh_input()
            self._captured_blocks += not self._patches   # every range constant: no change
            block += 1
            self._hold_inputs(self._patches)   # before the block's launches: its inputs
        self._block = (block, not second)
        inputs = self._input_checks(role, self._patches)
        outputs = self._outputs()
        kept = self._first[2] if second else None
        judged = "opt" if second and "opt" in (self._first[0], role) else role
        judge = second and ("timed_outputs" if judged == "opt" else "ref_integrity") \
            not in self.skip
        found = self._with_launch(inputs, kept=kept if judge else None)
        t = self.replay.time_one(kernel, launch, patches=self._patches,
                                 hooks=self.armor.poisoned_again if second
                                 else self.armor.poisoned_pre)
        found = found()
        tally = self.timed if role == "opt" else self.ref_timed
        n = tally["launches"] = tally["launches"] + 1
        self._timed_guards(role, f"timed launch {n}")
        self._timed_inputs(f"timed launch {n}", inputs, found)
        if not second:
            self._first = (role, n, self.replay.keep(outputs))
            return t
        (first, first_n, kept), self._first = self._first, None
        try:
            if not judge:
                return t
            summary = self._judge_block(outputs, kept, kept_expected=first != judged,
                                        label=f"timed launch {n if role == judged else first_n}"
                                        if judged == "opt" else None, found=found)
        finally:
            self.replay.drop(kept)
        for r in (first, role):
            (self.timed if r == "opt" else self.ref_timed)["checked"] += 1
        if summary is not None:
            (self.timed if judged == "opt" else self.ref_timed)["failed"].append(
                {"launch": n if role == judged else first_n, "role": judged,
                 "input": f"a fresh sparse one of timed block {block}", "summary": summary})
        return t

    def _input_variants(self) -> int:
        """The inputs opt's timed launches were given: a fresh one per block, and the
        captured one where blocks repeat it (no mutations, or no sparse range could change)."""
        if not self._fresh:
            return 1
        return self._block[0] - self._captured_blocks + (self._captured_blocks > 0)

    def _judge_block(self, outputs: list[str], kept: dict, *, kept_expected: bool,
                     label: str | None = None, found: dict | None = None) -> str | None:
        """The outputs now against the ones ``kept`` after the block's first launch: None if
        they pass (byte-identical, found on the device, or within the policy's tolerances on
        the host: a tolerance harness reads both back whenever they differ), else the
        verdict's summary, the kept ones expected where ``kept_expected``. ``label``: opt's
        launch judged (its one-sided error is tested too, ``_summary``). ``found``: the
        compares already made with the launch's canary check (``_with_launch``)."""
        r, d = self.replay, self.replay.device
        done = found or {}
        found = [done[("kept", name)] if ("kept", name) in done else
                 d.compare(r.address_of(name), len(r.pre[name]), kept[name])
                 for name in outputs]
        if any(f is None for f in found):   # only a kernel writing outside its regions can
            return ("FAIL: kpair's device copy of the block's first outputs changed under it "
                    "(a kernel wrote outside its regions)")
        if not any(n for n, _ in found):
            return None
        now = r.read_back(outputs)
        then = {name: d.fetch(kept[name]) for name in outputs}
        want, got = (then, now) if kept_expected else (now, then)
        return self._summary(outputs, want, got, label)

    def _summary(self, outputs: list[str], want: dict, got: dict, label: str | None = None
                 ) -> str | None:
        """``got`` judged against ``want`` under the tolerances of ``outputs``: None if it
        passes (the quick test first, ``check`` where it cannot tell), else the summary.
        With ``label`` (opt's timed launch) a passing ``got`` is also tested for one-sided
        error, as a check run's is (``bias``): a flagged range is kept in ``timed_bias``."""
        only = Policy(tuple(t for t in self.policy.tolerances if t.region in outputs))
        if not passes(only, want, got):
            v = check(only, want, got, dtype_hints=self.hints)
            if not v.passed:
                return v.summary()
        if label is not None and "bias" not in self.skip:
            self._timed_bias(label, only, want, got)
        return None

    def _timed_bias(self, label: str, only: Policy, want: dict, got: dict) -> None:
        """The sign tests of ``bias`` on one timed launch's float ranges (those that differ
        from ``want``: identical bytes have no error); flagged ranges are kept."""
        tested = [t for t in only.tolerances if t.dtype in FLOAT_DTYPES
                  and want[t.region][t.start:t.end] != got[t.region][t.start:t.end]]
        if not tested:
            return
        self.timed_bias["judged"] += 1
        stats = [trust.bias_stats(t, want[t.region], got[t.region], self.policy.max_bias)
                 for t in tested]
        flagged = [dict(s, criterion_passed=True) for s in stats if s["flagged"]]
        if flagged and len(self.timed_bias["flagged"]) < JUDGED_KEPT:
            self.timed_bias["flagged"].append((label, flagged))

    # ------------------------------------------------- inputs of timed launches

    def _inputs(self) -> list[str]:
        """Regions ref leaves unchanged, on the captured input and on every mutated one, and
        that are not poisoned: opt must too. A region ref writes only once its inputs change
        (a library's split-K workspace, holding from the capture the partial sums the
        captured input gives) is ref's to write: judged against ref's answer, not kept."""
        modified, written = self._modified(), self._written_on_mutation()
        return [n for n in self.replay.pre if not modified[n] and n not in self.armor.plan
                and n not in written]

    def _written_on_mutation(self) -> set[str]:
        """Regions ref writes on some mutated input (computed again as runs are added)."""
        if self._written_mutated[0] != len(self._mutated):
            pre = self.replay.pre
            written = {n for _, state, expected, _, _ in self._mutated for n, got in
                       expected.items() if n in pre and got != state.get(n, pre[n])}
            self._written_mutated = (len(self._mutated), written)
        return self._written_mutated[1]

    def _drop_block_inputs(self) -> None:
        if self._block_inputs is not None:
            for held in self._block_inputs[1].values():
                if not isinstance(held, (bytes, bytearray)):
                    self.replay.device.drop(held)
            self._block_inputs = None

    def _patched(self, name: str, patch: Patch) -> bytearray:
        """Region ``name``'s pre-state with ``patch`` written over it, on the host (one copy
        of the region, every run written at once)."""
        data = bytearray(self.replay.pre[name])
        if len(patch.offsets):
            at = np.asarray(patch.offsets, np.int64)[:, None] + np.arange(patch.size)
            np.frombuffer(data, np.uint8)[at.ravel()] = np.frombuffer(patch.data, np.uint8)
        return data

    def _hold_inputs(self, patches: list[tuple[str, Patch]]) -> None:
        """What each input region holds for a block (or window) given ``patches``: the
        pre-state's held copy where it is not patched; else a copy made on the device from
        the held pre-state and the patch (written into the region, which the next launch
        restores anyway), or the bytes on the host. Made before the block's first launch, so
        no launch of the candidate can have touched it."""
        self._drop_block_inputs()
        if "input_integrity" in self.skip:
            return
        r, d = self.replay, self.replay.device
        by_region = dict(patches)
        names = [n for n in self._inputs() if n in by_region]   # unpatched: the pre-state
        pre = {n: r.known.find(n, r.pre[n]) for n in names} if d.compares_in_place else {}
        on_device = [n for n in names if pre.get(n) is not None]
        out: dict = {}
        if on_device:
            for name in on_device:
                d.put(r.address_of(name), pre[name])
            # Every patch of the block in one scatter, as its launches write them (a device
            # that builds the upload once per block builds it once for all three).
            d.scatter([(r.address_of(name), p) for name, p in patches])
            for name in on_device:
                out[name] = d.keep(r.address_of(name), len(r.pre[name]))
        for name in names:
            if out.get(name) is None:
                out[name] = self._patched(name, by_region[name])
        self._block_inputs = (patches, out)

    def _input_checks(self, role: str, patches: list[tuple[str, Patch]]
                      ) -> list[tuple[str, int, int, object, Patch | None]] | None:
        """What every input region must hold after opt's timed launch given ``patches``:
        (region, address, size, expected, its patch or None), expected a held copy (compared
        where the memory is) or host bytes; None where the launch is not opt's or the check
        is skipped."""
        if role != "opt" or "input_integrity" in self.skip:
            return None
        r, d = self.replay, self.replay.device
        held = self._block_inputs[1] if self._block_inputs is not None and \
            self._block_inputs[0] is patches else {}
        by_region = dict(patches)
        out = []
        for name in self._inputs():
            expected = held.get(name)
            if name in by_region and expected is None:   # not held for these patches
                expected = self._patched(name, by_region[name])
            elif name not in by_region:
                expected = (r.known.find(name, r.pre[name]) if d.compares_in_place
                            else None) or r.pre[name]
            out.append((name, r.address_of(name), len(r.pre[name]), expected,
                        by_region.get(name)))
        return out

    def _with_launch(self, inputs: list | None, *, kept: dict | None = None,
                     captured: dict[str, bytes] | None = None):
        """Arm the compares of the next timed launch to run with its canary check in one
        pass (``Armor.pending``, ``Device.check_many``): every input against its held copy
        (``inputs``, from ``_input_checks``), the outputs against the block's first ones
        (``kept``) or against the captured input's expected bytes where the device holds them
        (``captured``). Returns what gives, once the launch is done, their results by
        ("input" | "kept" | "captured", region); empty where the device does not compare in
        place (each check then reads back on its own, as before)."""
        self.armor.pending = []
        if not (inputs or kept or captured) or not self.replay.device.compares_in_place:
            return dict
        r = self.replay
        keys, pending = [], []
        for name, address, size, expected, _ in inputs or ():
            if not isinstance(expected, (bytes, bytearray)):
                keys.append(("input", name))
                pending.append((address, size, expected))
        for name, held in (kept or {}).items():
            keys.append(("kept", name))
            pending.append((r.address_of(name), len(r.pre[name]), held))
        for name, data in (captured or {}).items():
            held = r.known.find(name, data)
            if held is not None:
                keys.append(("captured", name))
                pending.append((r.address_of(name), len(data), held))
        self.armor.pending = pending

        def results() -> dict:
            compared = self.armor.compared if pending else []
            self.armor.compared = []
            return dict(zip(keys, compared, strict=True)) if len(compared) == len(keys) \
                else {}

        return results

    def _timed_inputs(self, label: str, inputs: list | None, found: dict) -> None:
        """After opt's timed launch ``label``: every input region must hold what it was given
        (``inputs``, from ``_input_checks``), byte for byte, as after a check run
        (``input_integrity``). Compared where the memory is when the device keeps copies
        (``found``: done with the launch's canary check); else read back."""
        if inputs is None:
            return
        d = self.replay.device
        for name, address, size, expected, patch in inputs:
            host = isinstance(expected, (bytes, bytearray))
            got = None if host else found[("input", name)] if ("input", name) in found \
                else d.compare(address, size, expected)
            if got is None:   # host bytes, or a device copy that changed under it: read
                want = expected if host else self._patched(name, patch) \
                    if patch is not None else self.replay.pre[name]
                got = byte_diff(d.read(address, size), want)
            if got[0]:
                self.timed_inputs["modified"].append(
                    {"run": label, "region": name, "differing_bytes": got[0],
                     "first_offset": got[1]})
        self.timed_inputs["checked"] += 1

    def _judge_captured(self, outputs: list[str], label: str | None = None,
                        found: dict | None = None) -> str | None:
        """The outputs now against the captured input's expected ones: None if they pass
        (byte-identical, found on the device: under any policy), else the summary.
        ``found``: the compares already made with the launch's canary check."""
        want = {k: self.variants[0][2][k] for k in outputs}
        done = [found.get(("captured", k), False) for k in outputs] if found else []
        if done and all(isinstance(f, tuple) for f in done):
            equal = not any(f[0] for f in done)
        else:
            equal = self.replay.equals(want)
        return None if equal else self._judge_timed(0, outputs, want, label)

    def _judge_timed(self, index: int, outputs: list[str], want: dict[str, bytes],
                     label: str | None = None) -> str | None:
        """A timed launch's outputs, not byte-identical to input ``index``'s expected ones,
        judged under the policy: None if they pass, else the verdict's summary. Outputs the
        replay matched on the device to bytes it already holds come back as the very same
        host objects (``Known.match``); bytes judged before for this input are not judged
        again (a tolerance harness would otherwise compare whole regions on the host after
        every timed launch). The memo keeps the objects it was keyed on alive."""
        got = self.replay.read_back(outputs)
        for i, seen, summary in self._judged:
            if i == index and all(got[k] is seen[k] for k in outputs):
                return summary
        summary = self._summary(outputs, want, got, label)
        self._judged = [(index, got, summary), *self._judged[:JUDGED_KEPT - 1]]
        return summary

    def rejudge_ref(self, ref: Kernel, launch: Launch) -> None:
        """ref once more, now that opt is loaded and has run, on the captured input and on a
        sparse variant: it must still give its own answers, and its code (where the backend
        can read it) must be the bytes it was."""
        if "ref_integrity" in self.skip:
            return
        for label, state, expected, poison in self.variants[:2]:
            post = self._launch(ref, launch, poison=poison, state=state)
            v = check(self.policy, expected, post, dtype_hints=self.hints)
            self.rejudged.append((f"ref after opt ({label} input)", v.passed, v.summary()))
        if self.ref_code_before is not None:
            self.ref_code = {"before": self.ref_code_before,
                             "after": self.replay.device.code_digest(ref)}

    def _outputs(self) -> list[str]:
        """Regions some ref run changes (on the captured input or a mutated one), or that are
        poisoned."""
        if self._output_names is None:
            modified = self._modified()
            self._output_names = [n for n in self.replay.pre
                                  if modified[n] or n in self.armor.plan]
        more = self._written_on_mutation() - set(self._output_names)
        return self._output_names + [n for n in self.replay.pre if n in more]

    def must_move(self) -> int:
        """Bytes any correct kernel must write: those ref changes, and the poisoned ones."""
        total = 0
        for name, pre in self.replay.pre.items():
            # The same bytes object often comes back for every run (Replay.read_back).
            changed = [post for post in {id(p[name]): p[name] for p in self.ref_posts}.values()
                       if post != pre]
            runs = self.armor.plan[name][2] if name in self.armor.plan else None
            if not changed and runs is None:
                continue
            if runs is not None and runs.nbytes == len(pre):   # every byte is poisoned
                total += len(pre)
                continue
            if runs is None and len(changed) == 1 and changed[0] is self.ref_posts[0][name]:
                total += self._bytes_changed()[name]   # counted once, in discover
                continue
            need = np.zeros(len(pre), bool)
            for post in changed:
                need |= np.frombuffer(post, np.uint8) != np.frombuffer(pre, np.uint8)
            if runs is not None:
                if len(runs) <= 64:   # a few runs: mark them (a layout costs a region pass)
                    for start, end in runs:
                        need[start:end] = True
                else:
                    need |= runs.layout(need.size)[0]
            total += int(need.sum())
        return total

    def speed(self, t_opt: float, t_ref: float) -> None:
        if "impossible_speed" in self.skip:
            return
        need = self.must_move()
        bw = self.replay.device.measure_bandwidth(need) if need else None
        self.found["impossible_speed"] = trust.impossible_speed(need, bw, t_opt, t_ref)

    # ---------------------------------------------------------------- verdicts

    def refusals(self) -> tuple[dict | None, dict | None]:
        """(ref's, opt's) refused system calls as the device saw them (None: it cannot tell,
        or that kernel has not run)."""
        dev = self.replay.device
        return tuple(dev.refused_calls(k) if k is not None else None
                     for k in (self.kernels["ref"], self.kernels["opt"]))

    def findings(self) -> dict[str, Finding]:
        """One Finding per check, from everything observed so far (cached until more is)."""
        refused = self.refusals()
        key = (tuple(r and r["count"] for r in refused), len(self.found), len(self.opt_runs),
               len(self.diff_runs),
               len(self.windows["opt"]), self.timed["launches"], self.timed["checked"],
               self.timed["windows"],
               len(self.timed["failed"]), len(self.timed["violations"]),
               self.ref_timed["checked"], len(self.ref_timed["failed"]), len(self.rejudged),
               self.ref_code is not None, self.timed_bias["judged"],
               len(self.timed_bias["flagged"]), self.timed_inputs["checked"],
               len(self.timed_inputs["modified"]))
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, self._findings(refused))
        return dict(self._cache[1])

    def _findings(self, refused: tuple[dict | None, dict | None]) -> dict[str, Finding]:
        f = dict(self.found)
        runs = self.opt_runs + self.diff_runs
        if self.kernels["opt"] is not None:
            f["refused_calls"] = trust.refused_calls(*refused)
        plan = {n: runs_ for n, (_, _, runs_) in self.armor.plan.items()}
        inputs = self._inputs()
        if runs:
            f["guard_bands"] = trust.guard_findings(self.armor.bands, runs, len(runs) +
                                                    self.timed["launches"] + len(
                                                        self.windows["opt"]),
                                                    self.timed["violations"])
            f["input_integrity"] = trust.input_integrity(inputs, runs, self.timed_inputs)
            f["poisoned_outputs"] = trust.poisoned_outputs(plan, {**self.not_tested,
                                                                  **self._unpoisoned}, runs,
                                                           self.control)
            f["opt_determinism"] = trust.opt_determinism(self.policy, self.opt_runs,
                                                         self.hints)
            f["bias"] = trust.bias([(r.label, [
                dict(r.bias_stats(t, self.policy.max_bias),
                     criterion_passed=_range_passed(r.verdict, t))
                for t in self.policy.tolerances if t.dtype in FLOAT_DTYPES]) for r in runs],
                timed=self.timed_bias)
        if self.opt_runs and self.mutation_source is not None and \
                (self.diff_runs or not self.mutation_list):
            f["differential"] = trust.differential(self.mutation_source, self.mutation_list,
                                                   self.diff_runs, self.diff_changed,
                                                   self.diff_mutated, self.mutation_notes)
        if self.windows["opt"]:
            f["timing_integrity"] = trust.timing_integrity(self.windows["ref"],
                                                           self.windows["opt"])
        if self.timed["launches"] or self.timed["windows"]:
            f["timed_outputs"] = trust.timed_outputs(
                "opt", self.timed["launches"], self.timed["checked"],
                self._input_variants(), self.timed["failed"], self.timed["windows"])
        if self.rejudged or self.ref_timed["checked"]:
            f["ref_integrity"] = trust.ref_integrity(self.rejudged, self.ref_code,
                                                     self.ref_timed)
        for name in CHECKS:
            if name in self.skip:
                f[name] = trust.skipped(name, "skipped by request (--skip-check)")
            f.setdefault(name, trust.skipped(name, "not reached (an earlier verdict ended the "
                                                   "run)"))
        return f

    def failure(self) -> Finding | None:
        return trust.first_failure(self.findings())


def _range_passed(verdict: Verdict, t) -> bool:
    """Whether the declared range ``t`` met its own criterion in ``verdict``."""
    for region in verdict.regions:
        for c in region.checks:
            if c.tolerance == t:
                return c.passed
    return True
