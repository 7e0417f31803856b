"""Trust checks: what a verdict must survive (DESIGN.md, "Trust"), as pure functions.

Each check turns what the runs observed (region bytes, timings) into a ``Finding``: whether it
ran, whether it passed (None: nothing to pass or fail, e.g. a warning) and a JSON-able
``finding`` saying what it saw; a failed check carries a one-line ``reason``. Nothing here
touches a device: ``kpair.trust.audit`` drives the replay (fills, poison, canaries, mutated inputs,
extra launches) and hands the bytes and times to these functions. ``CHECKS`` lists every check
in the order a failure is reported when several fail.

Also here: the write-only runs of a region (``write_only_runs``), from which the poison plan
is made; the guard bands and the poison themselves are ``kpair.trust.armor``'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..dtypes import EPS, decode
from ..policy import Policy, Tolerance, Verdict, check, check_region
from ..policy.judge import _plain
from .armor import Band, Runs, describe_violation, left_mask, mask_runs, poison_left

#: Every check, in the order its failure is reported first.
CHECKS = ("baseline_determinism", "ref_integrity", "guard_bands", "refused_calls",
          "input_integrity",
          "poisoned_outputs", "opt_determinism", "differential", "timed_outputs", "bias",
          "timing_integrity", "impossible_speed", "noop")
#: A one-sided error is "significant" from this sign-test z-score on.
BIAS_Z = 5.0
#: At least this many differing elements before a sign test means anything.
BIAS_MIN_ELEMENTS = 20
#: Impossible speed: opt implies more than this many times the device's measured rate.
SPEED_SLACK = 2.0


@dataclass(frozen=True)
class Finding:
    """One check's outcome: ``passed`` None means "reported, not judged" (or not run)."""

    name: str
    ran: bool
    passed: bool | None
    finding: dict = field(default_factory=dict)
    reason: str = ""

    @property
    def failed(self) -> bool:
        return self.passed is False

    def to_json(self) -> dict:
        out = {"ran": self.ran, "passed": self.passed, "finding": self.finding}
        if self.reason:
            out["reason"] = self.reason
        return _plain(out)


def skipped(name: str, why: str) -> Finding:
    return Finding(name, False, None, {"skipped": why})


def first_failure(findings: dict[str, Finding]) -> Finding | None:
    for name in CHECKS:
        f = findings.get(name)
        if f is not None and f.failed:
            return f
    return None


def _diff(a: bytes, b: bytes) -> tuple[int, int | None]:
    """(differing bytes, first differing offset) of two equal-length byte strings."""
    if a == b:  # a memcmp: the common case, and far cheaper than numpy on large regions
        return 0, None
    x, y = np.frombuffer(a, np.uint8), np.frombuffer(b, np.uint8)
    if x.size != y.size:
        return max(x.size, y.size), min(x.size, y.size)
    ne = x != y   # counted and searched in place: no index array of every differing byte
    n = int(np.count_nonzero(ne))
    return n, (int(ne.argmax()) if n else None)


# ------------------------------------------------------------------ baseline and no-op


def baseline_determinism(policy: Policy, runs: Sequence[dict[str, bytes]], *,
                         hints: dict[str, str] | None = None, harness: str = "HARNESS"
                         ) -> Finding:
    """ref launched ``len(runs)`` times on identical inputs must agree with itself under the
    policy; where it does not, no byte-exact (or tighter) verdict can apply."""
    spread = {}
    for name in runs[0]:
        n = max(_diff(runs[0][name], r[name])[0] for r in runs[1:]) if len(runs) > 1 else 0
        if n:
            spread[name] = n
    bad = [(i, v) for i, v in enumerate((check(policy, runs[0], r, dtype_hints=hints)
                                          for r in runs[1:]), 2) if not v.passed]
    info = {"runs": len(runs), "differing_bytes": spread, "within_policy": not bad}
    if not bad:
        return Finding("baseline_determinism", True, True, info)
    i, v = bad[0]
    region = next(r for r in v.regions if not r.passed)
    return Finding("baseline_determinism", True, False, info, (
        f"baseline nondeterministic: ref run {i} differs from run 1 on identical inputs "
        f"(region {region.region}: {region.reason()}); a byte-exact verdict cannot apply. "
        f"Write a tolerance policy from the observed spread with `kpair policy suggest "
        f"{harness} -o policy.json` and pair again with --policy policy.json"))


def changed_regions(pre: dict[str, bytes], post: dict[str, bytes]) -> dict[str, int]:
    """Bytes that differ between pre- and post-state, per region (0: unchanged)."""
    return {name: _diff(pre[name], post[name])[0] for name in pre}


def noop(changed: dict[str, int], poisoned: Sequence[str]) -> Finding:
    """Say so when ref changes nothing: then only poisoned outputs make the check mean
    anything, and without them a kernel that does nothing at all passes."""
    info = {"noop": not any(changed.values()), "changed_bytes": changed,
            "unchanged_regions": [n for n, c in changed.items() if not c],
            "poisoned_regions": list(poisoned)}
    if not info["noop"]:
        return Finding("noop", True, None, info)
    if poisoned:
        info["note"] = ("ref leaves every region as it found it (the outputs already held "
                        "their answer), but poisoning " + ", ".join(poisoned) + " makes opt "
                        "compute them: the correctness verdict stands")
        return Finding("noop", True, None, info)
    info["warning"] = ("the baseline leaves every region exactly as it found it, and no region "
                       "could be poisoned: this dispatch proves nothing about opt's "
                       "correctness (a kernel that does nothing passes)")
    return Finding("noop", True, None, info, info["warning"])


# ------------------------------------------------------------------ poison


def reads_because(changed: str) -> str:
    """Why a region is an input of ref: filling it changed region ``changed``."""
    return f"ref reads it: its prior content changes region {changed}"


def ref_reads(name: str, policy: Policy, normal: dict[str, bytes], post: dict[str, bytes]
              ) -> str:
    """Why region ``name`` is an input of ref ("" if it is not): ``post`` is ref's post-state
    with the region filled, and any *other* region that comes out otherwise than in ``normal``
    was computed from the fill."""
    for k, want in normal.items():
        if k == name:
            continue
        tols = policy.for_region(k)
        # Only whether it changed: a byte-exact region is one memcmp, never a diff report.
        same = want == post[k] if not tols else check_region(k, want, post[k], tols).passed
        if not same:
            return reads_because(k)
    return ""


def none_kept(name: str, policy: Policy, normal: dict[str, bytes], post: dict[str, bytes],
              granule: int = 4) -> bool:
    """Whether no element of region ``name`` (``granule`` bytes from its start, the whole
    region in elements) came out of a filled run as in ``normal``, and no tolerance range is
    declared over it: then ``write_only_runs`` finds no run whatever the other fills give (an
    element is write-only when it comes out as in ``normal`` after every fill)."""
    word = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(granule)
    want, got = normal[name], post[name]
    if word is None or len(want) % granule or len(got) != len(want) or \
            policy.for_region(name):
        return False
    return not bool((np.frombuffer(got, word) == np.frombuffer(want, word)).any())


def write_only_runs(name: str, policy: Policy, normal: dict[str, bytes],
                    filled: Sequence[dict[str, bytes]], granule: int = 4, *, read_checked: int = 0
                    ) -> tuple[Runs | None, str]:
    """The byte runs of region ``name`` that ref writes whatever they held before.

    ``filled`` are ref's post-states with the region filled by patterns that differ in every
    byte. An element of ``granule`` bytes (from the region's start) is write-only when it
    comes out as in ``normal`` after every fill — whole elements, since a byte that ref
    computes *from* the fill matches by chance once in 256; a declared tolerance range is,
    when it passes its criterion after every fill. If a fill changes any *other* region, ref
    reads this one: (None, why); the first ``read_checked`` fills were already shown not to
    (``ref_reads``). The runs are found per element, not per byte (a region can hold
    hundreds of MB)."""
    for post in filled[read_checked:]:
        why = ref_reads(name, policy, normal, post)
        if why:
            return None, why
    want = np.frombuffer(normal[name], np.uint8)
    whole = want.size // granule * granule
    # Compared a whole element at a time (one comparison per element where a machine word
    # holds one), so an element is write-only only when all of its bytes are.
    word = {2: np.uint16, 4: np.uint32, 8: np.uint64}.get(granule, np.uint8)
    same = np.ones(whole // np.dtype(word).itemsize, bool)
    tail = want.size > whole
    for post in filled:
        got = np.frombuffer(post[name], np.uint8)
        same &= got[:whole].view(word) == want[:whole].view(word)
        tail = tail and bool((got[whole:] == want[whole:]).all())
    if word is np.uint8 and granule > 1:
        same = same.reshape(-1, granule).all(axis=1)
    runs = mask_runs(same)
    starts, ends = runs.starts * granule, runs.ends * granule
    if tail:   # the bytes after the last whole element, as one more element
        if ends.size and ends[-1] == whole:
            ends[-1] = want.size
        else:
            starts, ends = np.append(starts, whole), np.append(ends, want.size)
    runs = Runs(starts, ends)
    ranges = [t for t in policy.for_region(name)
              if all(check_region(name, normal[name], post[name], (t,)).checks[0].passed
                     for post in filled)]
    if ranges:   # rare: a byte mask, the tolerance ranges added
        mask = np.zeros(want.size, bool)
        inside, _ = runs.layout(want.size)
        mask[:] = inside
        for t in ranges:
            mask[t.start:t.end] = True
        runs = mask_runs(mask)
    if not len(runs):
        return None, "ref's output in it depends on what it held (read and written)"
    return runs, ""


@dataclass(frozen=True)
class OptRun:
    """One judged opt launch: the regions as they were before it (pre-state or a mutated
    input, without poison), what ref produced there (``expected``), what opt produced, the
    policy's verdict, the poison (word, runs) per poisoned region and the guard-band
    violations."""

    label: str
    before: dict
    expected: dict
    post: dict
    verdict: Verdict
    poison: dict = field(default_factory=dict)
    violations: tuple = ()
    _diffs: dict = field(default_factory=dict, compare=False, repr=False)

    def changed(self, name: str) -> tuple[int, int | None]:
        """(differing bytes, first offset) of region ``name`` before and after opt: taken
        once per run (the findings are redrawn after every stage)."""
        if name not in self._diffs:
            self._diffs[name] = _diff(self.before[name], self.post[name])
        return self._diffs[name]

    def _once(self, key: tuple, make):
        """``make()``, computed once per run and key: the findings are redrawn after every
        stage from the same runs, and each of these costs whole-region passes on the host
        (a 32 MiB tolerance output: about a second per run and stage)."""
        if key not in self._diffs:
            self._diffs[key] = make()
        return self._diffs[key]

    def poison_left(self, name: str) -> tuple[int, int | None]:
        """(bytes, first offset) of region ``name``'s poison opt left as written."""
        word, spans = self.poison[name]
        return self._once(("poison_left", name),
                          lambda: poison_left(spans, word, self.expected[name], self.post[name]))

    def unpoisoned(self) -> dict[str, bytes]:
        """``post`` with every byte still holding this run's poison set to the expected."""
        return self._once(("unpoisoned",), lambda: _unpoisoned(self))

    def agrees(self, first: OptRun, policy: Policy, hints: dict[str, str]) -> Verdict:
        """This run's unpoisoned outputs judged against ``first``'s (``opt_determinism``)."""
        held = self._diffs.get(("agrees",))
        if held is None or held[0] is not first or held[1] is not policy or held[2] != hints:
            held = self._diffs[("agrees",)] = (first, policy, dict(hints), check(
                policy, first.unpoisoned(), self.unpoisoned(), dtype_hints=hints))
        return held[3]

    def bias_stats(self, t: Tolerance, max_bias: float | None) -> dict:
        """``bias_stats`` of declared range ``t`` of this run (opt against ref's answer)."""
        return self._once(("bias", t, max_bias),
                          lambda: bias_stats(t, self.expected[t.region], self.post[t.region],
                                             max_bias))


def poisoned_outputs(plan: dict[str, Runs], not_tested: dict[str, str],
                     runs: Sequence[OptRun], control: str) -> Finding:
    """opt must write every byte ref writes whatever it held: poisoned bytes left as poison
    mean opt relied on what the output buffer already held."""
    left = []
    for run in runs:
        for name, (word, _) in run.poison.items():
            n, first = run.poison_left(name)
            if n:
                left.append({"run": run.label, "region": name, "bytes": n,
                             "first_offset": first, "poison": f"0x{word:08x}"})
    info = {"regions": {n: {"bytes": r.nbytes, "runs": len(r)}
                        for n, r in plan.items()},
            "not_tested": not_tested, "control": control,
            "opt_runs_poisoned": sum(1 for r in runs if r.poison), "left": left}
    if not plan:
        return Finding("poisoned_outputs", False, None, info)
    if left:
        e = left[0]
        return Finding("poisoned_outputs", True, False, info, (
            f"opt did not write its output: {e['bytes']} byte{'s' * (e['bytes'] != 1)} of "
            f"region {e['region']} still hold the poison written before the launch (first at "
            f"offset {e['first_offset']}, {e['run']}): it relied on what the buffer held"))
    return Finding("poisoned_outputs", True, True, info)


def _unpoisoned(run: OptRun) -> dict[str, bytes]:
    """``run.post`` with every byte that still holds this run's poison set to the expected."""
    post = dict(run.post)
    for name, (word, runs) in run.poison.items():
        if post[name] == run.expected[name]:  # a memcmp: nothing left to put back
            continue
        act = np.frombuffer(post[name], np.uint8).copy()
        left = left_mask(runs, word, run.expected[name], post[name])
        act[left] = np.frombuffer(run.expected[name], np.uint8)[left]
        post[name] = act.tobytes()
    return post


def input_integrity(inputs: Sequence[str], runs: Sequence[OptRun],
                    timed: dict | None = None) -> Finding:
    """Regions ref leaves unchanged must come out of opt unchanged, byte for byte: after every
    check run, and after every timed launch (``timed``: ``checked``, the launches compared,
    and ``modified``, rows as the check runs' are)."""
    modified = []
    for run in runs:
        for name in inputs:
            n, first = run.changed(name)
            if n:
                modified.append({"run": run.label, "region": name, "differing_bytes": n,
                                 "first_offset": first})
    modified += list((timed or {}).get("modified", ()))
    info = {"inputs": list(inputs), "modified": modified[:16],
            "timed_launches_checked": (timed or {}).get("checked", 0)}
    if modified:
        m = modified[0]
        return Finding("input_integrity", True, False, info, (
            f"opt modified input region {m['region']} ({m['differing_bytes']} bytes, first at "
            f"offset {m['first_offset']}, {m['run']}); ref leaves it unchanged"))
    return Finding("input_integrity", True, bool(inputs) or None, info)


def guard_findings(bands: Sequence[Band], runs: Sequence[OptRun], launches: int,
                   timed: Sequence[dict] = ()) -> Finding:
    found = [dict(v, run=r.label) for r in runs for v in r.violations] + list(timed)
    info = {"bands": len(bands), "guard_bytes": sum(b.size for b in bands),
            "opt_launches_checked": launches, "violations": found}
    if not bands and not found:   # a scratch buffer (no band) written: still a violation
        return Finding("guard_bands", False, None, dict(info, skipped="no guard bytes fit "
                                                         "beside the regions"))
    if found:
        return Finding("guard_bands", True, False, info, (
            f"opt wrote out of bounds: {describe_violation(found[0])}, {found[0]['run']}"))
    return Finding("guard_bands", True, True, info)


def opt_determinism(policy: Policy, runs: Sequence[OptRun], hints: dict[str, str]) -> Finding:
    """opt launched several times on identical inputs must agree with itself under the policy
    (a kernel that is right only sometimes is wrong)."""
    if len(runs) < 2:
        return skipped("opt_determinism", "fewer than two opt runs")
    # Poison left behind is poisoned_outputs' finding; each run is judged once (``agrees``).
    verdicts = [(r.label, r.agrees(runs[0], policy, hints)) for r in runs[1:]]
    info = {"runs": len(runs), "passed_policy": [r.verdict.passed for r in runs]}
    bad = [(label, v) for label, v in verdicts if not v.passed]
    if not bad and len(set(info["passed_policy"])) == 1:
        return Finding("opt_determinism", True, True, info)
    label, v = bad[0] if bad else (runs[0].label, runs[0].verdict)
    region = next((r for r in v.regions if not r.passed), None)
    what = f" (region {region.region}: {region.reason()})" if region else ""
    return Finding("opt_determinism", True, False, info, (
        f"opt is nondeterministic: {label} differs from {runs[0].label} on identical "
        f"inputs{what}"))


def differential(source: str, mutations: Sequence, runs: Sequence[OptRun],
                 changed: Sequence[bool], mutated: Sequence[list[str]],
                 notes: dict | None = None) -> Finding:
    """opt against ref on mutated inputs, under the same policy. ``source``: where the
    mutations come from ("declared", "derived" or "off"); ``notes``: declared ones completed
    with derived ones (``derived_for``: the regions) or kept exactly (``mutations_exact``:
    the policy's note and the read-only regions left unvaried, also told as a warning)."""
    if not mutations:
        why = ('the policy turns differential runs off ("mutations": [])' if source == "off"
               else "no input region to mutate (ref reads none that holds values, in place or not)")
        return Finding("differential", False, None, {"skipped": why, "source": source},
                       f"{why}: a kernel that hard-codes the captured answer or caches its "
                       "first one is not caught")
    rows = []
    for run, ch, what in zip(runs, changed, mutated, strict=True):
        ranges = [c.to_json() for r in run.verdict.regions for c in r.checks]
        rows.append({"run": run.label, "mutated": what, "changed_output": ch,
                     "poisoned": bool(run.poison),
                     "passed": run.verdict.passed, "summary": run.verdict.summary(),
                     "mean_signed_rel_err": {c["rule"]: c["detail"]["mean_signed_rel_err"]
                                             for c in ranges}})
    info = {"source": source, "mutations": [m.describe() for m in mutations], "runs": rows,
            **(notes or {})}
    exact = info.get("mutations_exact")
    if exact and exact["unvaried"]:
        many = len(exact["unvaried"]) > 1
        info["warning"] = (
            f"mutations_exact: read-only region{'s' * many} {', '.join(exact['unvaried'])} "
            f"never varied (the policy's note: {exact['note']}): a kernel that takes "
            f"{'them' if many else 'it'} for a constant is not caught")
    bad = [r for r in rows if not r["passed"]]
    if bad:
        return Finding("differential", True, False, info, (
            f"opt is wrong on a mutated input ({bad[0]['run']}: {', '.join(bad[0]['mutated'])}):"
            f" {bad[0]['summary'].removeprefix('FAIL: ')} — it is specialised to the captured "
            "values or returns a stale answer"))
    if not any(changed):
        info["warning"] = "no mutation changed ref's output: these runs prove nothing"
        return Finding("differential", True, None, info, info["warning"])
    return Finding("differential", True, True, info)


# ------------------------------------------------------------------ the sandbox


def _calls(tally: dict) -> str:
    """``openat ×2, socket`` (most frequent first, at most 6 names)."""
    calls = sorted(tally["calls"].items(), key=lambda kv: (-kv[1], kv[0]))
    out = ", ".join(f"{name} ×{n}" if n > 1 else name for name, n in calls[:6])
    return out + (f" and {len(calls) - 6} more" if len(calls) > 6 else "")


def refused_calls(ref: dict | None, opt: dict | None) -> Finding:
    """opt must not reach for what the sandbox refuses (files, sockets, processes, signals to
    others...): ``ref`` and ``opt`` are what the backend saw of each code object
    (``Device.refused_calls``: ``count``, ``at_load``, ``calls`` name -> count), None where it
    runs no sandbox. A call of a kind ref makes too is not held against opt (a library
    function both use); it is reported as a warning."""
    if opt is None:
        return skipped("refused_calls", "the backend runs no sandbox that reports system "
                                        "calls (a GPU kernel makes none)")
    ref = ref or {"count": 0, "at_load": 0, "calls": {}}
    own = {name: n for name, n in opt["calls"].items() if name not in ref["calls"]}
    info = {"opt": opt, "ref": ref, "not_excused": own}
    if not opt["count"]:
        return Finding("refused_calls", True, True, info)
    n = opt["count"]
    what = (f"opt made {n} system call{'s' * (n != 1)} the host sandbox refused "
            f"({_calls(opt)}" + (f"; {opt['at_load']} while loading" if opt["at_load"] else "")
            + ")")
    if not own:
        info["warning"] = (f"{what}, all of kinds ref makes too: not held against it, but "
                           "both computed without what those calls would have given")
        return Finding("refused_calls", True, None, info, info["warning"])
    return Finding("refused_calls", True, False, info, (
        f"{what}: a candidate may only compute on its regions, and one that tries to open, "
        "write or create files, sockets or processes is treated as hostile (each call failed "
        "with EPERM)"))


# ------------------------------------------------------------------ guard bands


def bias_stats(t: Tolerance, expected: bytes, actual: bytes, max_bias: float | None) -> dict:
    """Sign tests on opt-minus-ref over one declared float range: relative ((a-e)/e: a scale
    error) and absolute (a-e: an offset). Cosine similarity is blind to the first."""
    e = decode(np.frombuffer(expected, np.uint8)[t.start:t.end], t.dtype)
    a = decode(np.frombuffer(actual, np.uint8)[t.start:t.end], t.dtype)
    with np.errstate(all="ignore"):
        ok = np.isfinite(e) & np.isfinite(a) & (a != e)
        rel_ok = ok & (e != 0)
        rel = (a[rel_ok] - e[rel_ok]) / e[rel_ok]
        d = a[ok] - e[ok]
        rms = float(np.sqrt(np.mean(np.square(e[np.isfinite(e)])))) if e.size else 0.0
    floor = max_bias if max_bias is not None else EPS[t.dtype]

    def z(x: np.ndarray) -> float:
        n = x.size
        return float((np.count_nonzero(x > 0) - np.count_nonzero(x < 0)) / math.sqrt(n)) \
            if n else 0.0

    out = {"range": f"{t.region}[{t.start}:{t.end})", "dtype": t.dtype,
           "criterion": t.criterion, "differing_elements": int(ok.sum()),
           "mean_signed_rel_err": float(rel.mean()) if rel.size else 0.0,
           "z_rel": z(rel), "mean_signed_err_over_rms": float(d.mean()) / rms
           if d.size and rms else 0.0, "z_abs": z(d), "max_bias": floor}
    judged = t.criterion == "cosine" and out["differing_elements"] >= BIAS_MIN_ELEMENTS
    out["flagged"] = judged and any(
        abs(out[zk]) >= BIAS_Z and abs(out[mk]) > floor
        for zk, mk in (("z_rel", "mean_signed_rel_err"), ("z_abs", "mean_signed_err_over_rms")))
    return out


def bias(runs: Sequence[tuple[str, list[dict]]], timed: dict | None = None) -> Finding:
    """One-sided systematic error over every judged opt run ((label, bias_stats list)) and
    every timed launch of opt whose outputs differ from ref's (``timed``: ``judged``, the
    launches tested, and ``flagged``, (label, flagged bias_stats) of those that showed one)."""
    ranges = [dict(s, run=label) for label, stats in runs for s in stats]
    if not ranges:
        return Finding("bias", False, None, {"skipped": "no declared float range to test"})
    timed = timed or {}
    flagged_timed = [dict(s, run=label) for label, stats in timed.get("flagged", ())
                     for s in stats]
    flagged = [s for s in ranges if s["flagged"]] + flagged_timed
    info = {"z_threshold": BIAS_Z, "ranges": ranges + flagged_timed,
            "timed_launches_judged": timed.get("judged", 0)}
    if not flagged:
        return Finding("bias", True, True, info)
    s = flagged[0]
    kind = "relative" if abs(s["z_rel"]) >= BIAS_Z and \
        abs(s["mean_signed_rel_err"]) > s["max_bias"] else "absolute"
    value = s["mean_signed_rel_err"] if kind == "relative" else s["mean_signed_err_over_rms"]
    zv = s["z_rel"] if kind == "relative" else s["z_abs"]
    return Finding("bias", True, False, info, (
        f"one-sided systematic error in {s['range']} as {s['dtype']} ({s['run']}): mean "
        f"signed {kind} error {value:+.3g} (sign test z = {zv:+.1f}, allowed {s['max_bias']:.3g})"
        + (f" — lower precision or a scaled result that {s['criterion']} cannot see"
           if s.get("criterion_passed", True) else f", beside its failed {s['criterion']}")))


# ------------------------------------------------------------------ timing


def timed_outputs(role: str, launches: int, checked: int, variants: int,
                  failed: Sequence[dict], windows: int = 0) -> Finding:
    """Every timed launch of ``role`` judged: its outputs after the launch against the expected
    outputs of the input it was given (the captured one or a secret sparse variant); and
    after each of its ``windows`` timing-window launches, likewise."""
    info = {"launches": launches, "checked": checked, "input_variants": variants,
            "windows_checked": windows, "failed": list(failed[:8]),
            "failed_count": len(failed)}
    if failed:
        bad = failed[0]
        what = "timing window" if bad.get("window") else "timed launch"
        return Finding("timed_outputs", True, False, info, (
            f"{role}'s output was wrong after {what} {bad['launch']} (input "
            f"{bad['input']}: {bad['summary'].removeprefix('FAIL: ')}); it behaves differently "
            "when timed"))
    if not checked and not windows:
        return skipped("timed_outputs", "no timed launch")
    return Finding("timed_outputs", True, True, info)


def ref_integrity(rejudged: Sequence[tuple[str, bool, str]], code: dict | None,
                  timed: dict) -> Finding:
    """ref must stay ref while opt is loaded and after opt ran: judged again then (each
    ``(label, passed, summary)``), its code bytes unchanged where the backend can read them
    (``code``: {"before", "after"} digests), and every timed launch of ref (and of its
    identical-binary control) correct for the input it was given (``timed``)."""
    info = {"rejudged": [{"run": label, "passed": ok} for label, ok, _ in rejudged],
            "code": code, "timed_launches": timed.get("launches", 0),
            "timed_checked": timed.get("checked", 0), "timed_failed": timed.get("failed", [])[:8]}
    bad = next(((label, why) for label, ok, why in rejudged if not ok), None)
    if bad is not None:
        return Finding("ref_integrity", True, False, info, (
            f"ref no longer reproduces its own answer in {bad[0]} ({bad[1].removeprefix('FAIL: ')}"
            "): opt changed ref, its code or its inputs"))
    if code is not None and code.get("before") != code.get("after"):
        return Finding("ref_integrity", True, False, info, (
            "ref's code bytes changed while opt was loaded: opt patched ref"))
    if timed.get("failed"):
        f = timed["failed"][0]
        return Finding("ref_integrity", True, False, info, (
            f"{f['role']}'s output was wrong after timed launch {f['launch']} (input "
            f"{f['input']}: {f['summary'].removeprefix('FAIL: ')}): something changed the "
            "baseline or its inputs during timing"))
    if not rejudged and not timed.get("checked"):
        return skipped("ref_integrity", "ref was not run with opt loaded")
    return Finding("ref_integrity", True, True, info)


def timing_integrity(ref: Sequence[tuple[float, float]], opt: Sequence[tuple[float, float]],
                     *, floor_s: float = 20e-6) -> Finding:
    """(timer, wall window) pairs per launch. The window runs from just before the launch to
    after a device-wide synchronize; its excess over the timer is launch overhead — the same
    for ref and opt — unless opt starts work the timer does not see."""
    r, o = np.asarray(ref, float), np.asarray(opt, float)
    r_gap, o_gap = r[:, 1] - r[:, 0], o[:, 1] - o[:, 0]
    hidden = float(np.median(o_gap) - np.median(r_gap))
    q75, q25 = np.percentile(r_gap, [75, 25])
    threshold = max(floor_s, 3.0 * float(q75 - q25), 0.5 * float(np.median(o[:, 0])))
    info = {"launches": int(len(o)), "ref_timer_s": float(np.median(r[:, 0])),
            "ref_window_s": float(np.median(r[:, 1])), "opt_timer_s": float(np.median(o[:, 0])),
            "opt_window_s": float(np.median(o[:, 1])), "hidden_s": hidden,
            "threshold_s": threshold}
    over = [(role, float(t), float(w)) for role, arr in (("ref", r), ("opt", o))
            for t, w in arr if t > 1.05 * w + floor_s]
    if over:
        role, t, w = over[0]
        return Finding("timing_integrity", True, False, info, (
            f"the {role} timer reports {t * 1e6:.1f} us, more than the {w * 1e6:.1f} us "
            "wall-clock window around the launch: the timer cannot be trusted"))
    if hidden > threshold:
        return Finding("timing_integrity", True, False, info, (
            f"opt's timer misses work: its synchronized wall-clock window exceeds the timer by "
            f"{hidden * 1e6:.0f} us more than ref's (timer {info['opt_timer_s'] * 1e6:.1f} us); "
            "it starts work the timer does not cover (another stream or thread, deferred)"))
    return Finding("timing_integrity", True, True, info)


def impossible_speed(must_move: int, bandwidth: float | None, t_opt: float, t_ref: float
                     ) -> Finding:
    """opt cannot write ``must_move`` bytes faster than the device's measured write rate."""
    if not bandwidth or must_move <= 0:
        why = "the device cannot measure its bandwidth" if not bandwidth else \
            "the dispatch provably writes no byte"
        return skipped("impossible_speed", why)
    floor = must_move / bandwidth
    implied = must_move / t_opt
    info = {"must_move_bytes": must_move, "device_bytes_per_s": bandwidth,
            "opt_median_s": t_opt, "implied_bytes_per_s": implied, "slack": SPEED_SLACK,
            "max_plausible_speedup": SPEED_SLACK * t_ref / floor}
    if implied > SPEED_SLACK * bandwidth:
        return Finding("impossible_speed", True, False, info, (
            f"impossible speed: opt would write {must_move} bytes at {implied / 1e9:.3g} GB/s, "
            f"more than {SPEED_SLACK:g}x the device's measured {bandwidth / 1e9:.3g} GB/s"))
    return Finding("impossible_speed", True, True, info)
