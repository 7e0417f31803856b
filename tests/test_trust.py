"""Trust checks: the pure findings, and the adversarial suite — cheating opt kernels
(tests/csrc/adversarial.c) run against real harnesses, each rejected with the right reason,
while the honest pairs pass."""

from __future__ import annotations

import ctypes
import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import CSRC, record_rowsum, run_json, summarize
from kpair.cli import main as kpair
from kpair.errors import PolicyError, UsageError
from kpair.harness import create_harness
from kpair.isolation import _describe_exit
from kpair.pipeline import RunOptions
from kpair.policy import Mutation, Policy, Tolerance, check
from kpair.policy.mutation import PATCH_RUNS, PATCH_WINDOW
from kpair.record import record_call
from kpair.toolchain import compile_shared
from kpair.trust import CHECKS
from kpair.trust.armor import (
    QUIET_NAN,
    Armor,
    Band,
    Runs,
    band_violation,
    describe_violation,
    guard_bands,
    left_mask,
    mask_runs,
    pattern,
    poison_into,
    poisoned_image,
)
from kpair.trust.findings import (
    baseline_determinism,
    bias_stats,
    impossible_speed,
    ref_reads,
    timing_integrity,
    write_only_runs,
)

N = 64
#: Small measurement budgets (and a 4 MiB cache flush) keep each run well under a second.
QUICK = RunOptions(time_cap_s=1.0, min_blocks=4, max_blocks=8, seed=7, timeout_s=120,
                   device_options={"flush_bytes": 4 << 20})
CHEATS = {"honest_split": 0, "nowrite": 1, "const": 2, "stale": 3, "oob": 4, "input": 5,
          "hardcode": 6, "nondet": 7, "lowprec": 8, "deferred": 9, "lazy": 10, "scale": 11,
          "count": 12, "memo": 13, "hashmemo": 14, "deltamemo": 15}


# ---------------------------------------------------------------- pure checks


def test_guard_bands_fill_the_mapped_gaps_and_split_them():
    regions = [("a", 0x1100, 0x100), ("b", 0x1300, 0x100)]
    bands = guard_bands(regions, [(0x1000, 0x2000)])
    assert [(b.region, b.side, b.address, b.size, b.offset) for b in bands] == [
        ("a", "before", 0x1000, 0x100, -0x100), ("a", "after", 0x1200, 0x80, 0x100),
        ("b", "before", 0x1280, 0x80, -0x80), ("b", "after", 0x1400, 0xC00, 0x100)]
    capped = guard_bands(regions, [(0x1000, 0x2000)], cap=0x10)
    assert all(b.size == 0x10 for b in capped)
    # Mapping unknown: only the short gap between two regions, never past either end.
    assert [(b.region, b.side) for b in guard_bands(regions, None)] == [("a", "after"),
                                                                      ("b", "before")]
    assert guard_bands([("a", 0, 16), ("b", 0x10000, 16)], None) == []


def test_band_violation_names_region_and_offsets():
    band = Band("c", "after", 0x2000, 64, 4096)
    seen = bytearray(pattern(0xDEADBEEF, 64).tobytes())
    assert band_violation(band, bytes(seen), 0xDEADBEEF) is None
    seen[0:4] = b"\xef\0\x80\x3f"      # 1.0f + 1 ulp; its first byte equals the canary's
    v = band_violation(band, bytes(seen), 0xDEADBEEF)
    assert v["bytes"] == 4 and (v["first_offset"], v["last_offset"]) == (4096, 4099)
    assert describe_violation(v) == ("4 bytes past the end of region c (offsets +4096..+4099 "
                                     "from its start)")


def test_poison_left_is_judged_per_word_not_per_byte():
    word = 0x7FC01234
    expected = np.arange(8, dtype="<f4").tobytes()
    actual = bytearray(pattern(word, 32).tobytes())      # nothing written
    assert left_mask([(0, 32)], word, expected, bytes(actual)).sum() == 32
    actual[4:8] = expected[4:8]                           # one element written
    actual[8:12] = b"\x34\x12\x00\x00"                    # two bytes match the poison by chance
    left = left_mask([(0, 32)], word, expected, bytes(actual))
    assert left.sum() == 24 and not left[4:12].any()


def test_poison_arithmetic_over_many_fragmented_runs_matches_the_run_by_run_rule():
    # A data-dependent write pattern: thousands of runs of 1-9 bytes at any alignment.
    rng = np.random.default_rng(5)
    size = 1 << 16
    runs = mask_runs(rng.random(size) < 0.5)
    assert len(runs) > 10_000 and runs.nbytes == sum(e - s for s, e in runs)
    word = 0x7FC0ABCD
    image = poisoned_image(runs, word, size)
    expected = rng.integers(0, 256, size, np.uint8)
    actual = expected.copy()
    inside = np.zeros(size, bool)
    for s, e in runs:
        inside[s:e] = True
        assert (image[s:e] == pattern(word, e - s)).all()
    assert not image[~inside].any()
    # opt leaves poison in a random half of the runs, whole or in part.
    for s, e in runs:
        if rng.random() < 0.5:
            actual[s:e] = pattern(word, e - s)
            if e - s > 4 and rng.random() < 0.5:
                actual[s] ^= 0xFF          # its first word was written after all
    left = left_mask(runs, word, expected.tobytes(), actual.tobytes())
    want = np.zeros(size, bool)
    for s, e in runs:
        for lo in range(s, e, 4):          # whole words from the run's start; the tail is one
            hi = min(lo + 4, e)
            im = pattern(word, e - s)[lo - s:hi - s]
            want[lo:hi] = (actual[lo:hi] == im).all() and not (expected[lo:hi] == im).all()
    assert (left == want).all() and want.any()


def test_runs_sharing_one_alignment_take_the_word_from_each_runs_start():
    # The tiled fast path: every run starts at a mod 4, for each a; and mixed starts.
    rng = np.random.default_rng(3)
    size, word = 1 << 14, 0x7FC01234
    for a in (0, 1, 2, 3, None):
        starts = np.sort(rng.choice(np.arange(0, size - 64, 64), 100, replace=False))
        starts = starts + (a if a is not None else rng.integers(0, 4, starts.size))
        runs = Runs(starts, starts + rng.integers(1, 60, starts.size))
        assert runs.alignment == a
        buf = rng.integers(0, 256, size, np.uint8)
        want = buf.copy()
        for s, e in runs:
            want[s:e] = pattern(word, e - s)
        poison_into(buf, runs, word)
        assert (buf == want).all()


def _fragmented_armor(device, size=1 << 14):
    rng = np.random.default_rng(7)
    pre = rng.integers(0, 256, size, np.uint8).tobytes()
    runs = mask_runs(rng.random(size) < 0.5)
    mem = np.frombuffer(bytearray(pre), np.uint8)
    armor = Armor(device, [], np.random.default_rng(1), pre={"out": pre})
    armor.plan = {"out": (mem.ctypes.data, size, runs)}
    return armor, mem, pre, runs


def _poisoned(pre, runs, word):
    image = np.frombuffer(pre, np.uint8).copy()
    poison_into(image, runs, word)
    return image


def test_launches_on_the_pre_state_take_their_poison_from_held_copies():
    from kpair.backends.host import HostDevice

    armor, mem, pre, runs = _fragmented_armor(HostDevice())
    words = []
    for _ in range(4):
        mem[:] = 0                      # whatever the last launch left: the copy replaces it
        armor.poisoned_pre.before()
        word = armor.poisoned_regions()["out"][0]
        assert (mem == _poisoned(pre, runs, word)).all()
        armor.poisoned_pre.after()
        assert armor.last == []
        words.append(word)
    # Two words alternate (one of the quiet-NaN family), drawn anew for the next candidate.
    assert words[0] == words[2] != words[1] == words[3]
    assert sum((w & 0xFFC00000) == 0x7FC00000 for w in words[:2]) >= 1
    assert armor.words() == {"out": words[:2]} or armor.words() == {"out": words[1::-1]}
    assert armor.renew()["out"] in (words[:2], words[1::-1])
    armor.poisoned_pre.before()
    assert armor.poisoned_regions()["out"][0] not in words[:2]
    # Launches on another state poison what the region holds now (a mutated input, say).
    mem[:] = 3
    armor.poisoned.before()
    word = armor.poisoned_regions()["out"][0]
    assert (mem == _poisoned(bytes(mem.size * [3]), runs, word)).all()


def test_poisons_ref_changes_under_are_drawn_again_and_proven_ones_kept():
    """ref's control under a draw of poisons: a failing draw is replaced (the last draw of
    quiet-NaN words only); where no draw passes, a candidate keeps the last proven words, and
    discovery, which has none, drops the poison."""
    from kpair.backends.host import HostDevice
    from kpair.trust.audit import POISON_DRAWS, Audit

    armor, mem, pre, runs = _fragmented_armor(HostDevice())
    tried: list[int] = []
    refuse = {"all": False}

    def ref_run(kernel, launch, what, state=None, *, poison=False):
        assert poison
        armor.poisoned_pre.before()
        word = armor.poisoned_regions()["out"][0]
        tried.append(word)
        nan = (word & 0xFFC00000) == QUIET_NAN
        return {"out": b"refused" if refuse["all"] or not nan else pre}

    audit = Audit.__new__(Audit)
    audit.armor, audit.ref_posts, audit._ref_run, audit._proven = armor, [{"out": pre}], \
        (None, None), {}
    audit.policy, audit.hints, audit._ref = Policy(), {}, ref_run
    # Draws with an arbitrary word fail; the last draw is of quiet NaNs only, and passes.
    assert audit._prove_poison() is None
    proven = armor.words()["out"]
    assert all((w & 0xFFC00000) == QUIET_NAN for w in proven) and audit._proven["out"] == proven
    assert len(set(tried)) > 2
    # A candidate whose every draw fails keeps the proven words.
    armor.renew()
    refuse["all"] = True
    tried.clear()
    assert audit._prove_poison() is None
    assert armor.words()["out"] == proven
    assert len(tried) == POISON_DRAWS     # the first control of each draw failed
    # Discovery (nothing proven yet) drops the poison, saying why.
    audit._proven = {}
    assert "control 1 of 2" in audit._prove_poison()


def test_a_timed_blocks_fresh_input_survives_poison_from_a_held_copy():
    """A held poisoned copy replaces its whole region: the fresh input of a timed block (a
    few elements changed at secret positions, here in the region updated in place) is written
    after it, so no block repeats the input of another (a memo on the whole input would win)."""
    from kpair.backends.host import HostDevice
    from kpair.policy.mutation import Patch
    from kpair.replay import Replay

    armor, mem, pre, runs = _fragmented_armor(HostDevice())
    replay = SimpleNamespace(device=armor.device, cache="warm", _put=None,
                             _restore=armor.device.restore,
                             address_of=lambda name: mem.ctypes.data)
    offsets = np.array([8, 4000, 9000], np.int64)
    patch = Patch(offsets, 4, bytes(range(1, 13)))
    Replay._prepare_timed(replay, None, [("out", patch)], armor.poisoned_pre)
    word = armor.poisoned_regions()["out"][0]
    want = _poisoned(pre, runs, word)
    for i, at in enumerate(offsets.tolist()):
        want[at:at + 4] = np.arange(1 + 4 * i, 5 + 4 * i, dtype=np.uint8)
    assert (mem == want).all()


def test_both_launches_of_a_timing_window_pair_take_the_same_poison_in_turn():
    """As both launches of a timed block do: opt's poison in a window pair is ref's, and the
    pairs alternate the candidate's two words, so opt's poison never tells a window apart."""
    from kpair.backends.host import HostDevice
    from kpair.trust.audit import TIMING_LAUNCHES, Audit

    armor, mem, _, _ = _fragmented_armor(HostDevice())
    seen: list[tuple[str, int]] = []

    def time_window(kernel, launch, *, patches=(), hooks=None):
        hooks.before()
        seen.append((kernel, armor.poisoned_regions()["out"][0]))
        hooks.after()
        return 1.0, 1.0

    audit = Audit.__new__(Audit)
    audit.armor, audit._sparse, audit._opt_absent = armor, [], False
    # the poison only, not the outputs or inputs, is under test here
    audit.skip, audit._block_inputs = {"timed_outputs", "input_integrity"}, None
    audit.replay = SimpleNamespace(time_window=time_window)
    audit.windows, audit.timed = {"ref": [], "opt": []}, {"violations": []}
    audit.timing("ref", None, "opt", None)
    assert [k for k, _ in seen] == ["ref", "opt"] * TIMING_LAUNCHES
    pairs = [(seen[i][1], seen[i + 1][1]) for i in range(0, len(seen), 2)]
    assert all(a == b for a, b in pairs)
    assert [a for a, _ in pairs[:2]] == [a for a, _ in pairs[2:4]] and pairs[0] != pairs[1]


def test_a_kernel_that_writes_into_a_held_poisoned_copy_is_caught():
    from kpair.backends.host import HostDevice

    class Tampered(HostDevice):   # as a kernel that found kpair's copy and wrote into it
        def intact(self, held):
            return False

    armor, mem, _, _ = _fragmented_armor(Tampered())   # mem: the memory must stay alive
    armor.poisoned_pre.before()
    armor.poisoned_pre.after()
    assert [v["side"] for v in armor.last] == ["held copy"]
    assert "poisoned copy of region out changed" in describe_violation(armor.last[0])
    armor.poisoned.before()     # a read-modify-write launch holds no copy to check
    armor.poisoned.after()
    assert armor.last == []


def test_write_only_runs_separate_outputs_from_inputs():
    pol = Policy()
    normal = {"x": b"\1\2\3\4", "y": bytes(range(8))}
    assert write_only_runs("y", pol, normal, [normal, normal])[0] == [(0, 8)]
    changed = {"x": b"\1\2\3\4", "y": b"\0\1\x99\3\4\5\6\7"}  # byte 2 kept the fill
    runs, _ = write_only_runs("y", pol, normal, [normal, changed])
    assert runs == [(4, 8)]
    runs, _ = write_only_runs("y", pol, normal, [normal, changed], granule=1)
    assert runs == [(0, 2), (3, 8)]
    filled = {"x": b"\0\0\0\0", "y": b"\1" * 8}
    runs, why = write_only_runs("x", pol, normal, [filled])
    assert runs is None and "changes region y" in why
    assert ref_reads("x", pol, normal, filled) == why and ref_reads("y", pol, normal, normal) == ""
    # already shown not to be read: the fill is judged only as an output
    assert write_only_runs("x", pol, normal, [filled], read_checked=1)[0] is None


def test_write_only_runs_match_a_byte_mask_on_large_fragmented_regions():
    rng = np.random.default_rng(3)
    normal = {"y": rng.integers(0, 256, 4 * 1000 + 3, np.uint8).tobytes()}
    posts = []
    for _ in range(2):
        got = np.frombuffer(normal["y"], np.uint8).copy()
        got[rng.random(got.size) < 0.1] ^= 0xFF      # bytes that kept the fill
        posts.append({"y": got.tobytes()})
    runs, _ = write_only_runs("y", Policy(), normal, posts)
    want = np.frombuffer(normal["y"], np.uint8)
    same = np.ones(want.size, bool)
    for p in posts:
        same &= np.frombuffer(p["y"], np.uint8) == want
    elements = np.append(same[:4000].reshape(-1, 4).all(axis=1).repeat(4), [same[4000:].all()] * 3)
    assert runs == mask_runs(elements)


def test_baseline_determinism_fails_with_the_suggestion():
    runs = [{"c": np.float32([1, 2]).tobytes()}, {"c": np.float32([1, 2.0000002]).tobytes()}]
    f = baseline_determinism(Policy(), runs, harness="H")
    assert f.failed and f.reason.startswith("baseline nondeterministic")
    assert "kpair policy suggest H" in f.reason and f.finding["differing_bytes"] == {"c": 1}
    tol = Policy((Tolerance("c", 0, 8, "float32", "allclose", atol=0, rtol=1e-6),))
    assert baseline_determinism(tol, runs).passed


def test_bias_sees_what_cosine_cannot():
    rng = np.random.default_rng(0)
    e = rng.standard_normal(4096).astype("<f4")
    t = Tolerance("c", 0, e.nbytes, "float32", "cosine", min_cosine=0.9999)
    scaled = (e * np.float32(1.0001)).astype("<f4")
    assert check(Policy((t,)), {"c": e.tobytes()}, {"c": scaled.tobytes()}).passed  # cosine 1
    s = bias_stats(t, e.tobytes(), scaled.tobytes(), None)
    assert s["flagged"] and s["z_rel"] > 50 and s["mean_signed_rel_err"] == pytest.approx(1e-4,
                                                                                         rel=0.1)
    noisy = (e + rng.standard_normal(4096).astype("<f4") * 1e-6).astype("<f4")
    assert not bias_stats(t, e.tobytes(), noisy.tobytes(), None)["flagged"]
    allow = bias_stats(t, e.tobytes(), scaled.tobytes(), 1e-3)
    assert not allow["flagged"]


def test_timing_integrity_flags_work_the_timer_misses():
    ref = [(1e-3, 1.6e-3), (1e-3, 1.62e-3), (1e-3, 1.58e-3)]
    honest = [(5e-4, 1.1e-3), (5e-4, 1.12e-3), (5e-4, 1.09e-3)]
    assert timing_integrity(ref, honest).passed
    hidden = [(2e-5, 2.6e-3), (2e-5, 2.7e-3), (2e-5, 2.5e-3)]
    f = timing_integrity(ref, hidden)
    assert f.failed and "timer misses work" in f.reason
    assert timing_integrity(ref, [(5e-3, 1e-3)] * 3).failed  # the timer claims more than wall


def test_impossible_speed():
    assert impossible_speed(1 << 20, 1e11, 1e-5, 1e-3).passed        # 100 GB/s: the limit
    f = impossible_speed(1 << 20, 1e10, 1e-5, 1e-3)                   # 10x what the device does
    assert f.failed and "impossible speed" in f.reason
    assert not impossible_speed(1 << 20, None, 1e-5, 1e-3).ran


def test_mutations_keep_the_values_and_round_trip_in_the_policy():
    data = np.arange(64, dtype="<f4").tobytes()
    rng = np.random.default_rng(1)
    perm = Mutation("a", "float32", "permute").apply(data, rng)
    assert perm != data and sorted(np.frombuffer(perm, "<f4")) == list(range(64))
    res = np.frombuffer(Mutation("a", "float32", "resample", 1, 16, 32).apply(data, rng), "<f4")
    assert set(res[4:8]) <= set(range(64)) and (res[:4] == np.arange(4)).all()
    p = Policy(mutations=(Mutation("a", "float32", "permute", 3, 0, 256),), max_bias=1e-4)
    assert Policy.from_json(p.to_json()) == p
    p.validate_against({"a": 256})
    with pytest.raises(PolicyError) as info:
        p.validate_against({"a": 128})
    assert info.value.field == "mutations[0].range"
    doc = {"schema": "kpair.validation_policy", "schema_version": 1,
           "mutations": [{"region": "a", "dtype": "float32", "method": "shuffle"}]}
    with pytest.raises(PolicyError) as info:
        Policy.from_json(doc)
    assert info.value.field == "mutations[0].method"
    with pytest.raises(PolicyError):
        Policy.from_json({**doc, "mutations": [], "max_bias": -1})


def test_large_mutations_move_every_tile_and_keep_the_values():
    # Past EXACT elements the order is drawn per tile; a tail that fills no tile is kept too.
    from kpair.policy.mutation import EXACT, TILE

    n = EXACT * 2 + 5
    data = np.arange(n, dtype="<i4").tobytes()
    rng = np.random.default_rng(2)
    perm = np.frombuffer(Mutation("a", "int32", "permute").apply(data, rng), "<i4")
    assert (np.sort(perm) == np.arange(n)).all() and (perm != np.arange(n)).mean() > 0.9
    tiles = perm[:n // TILE * TILE].reshape(-1, TILE) // TILE   # each tile from one tile
    assert (tiles == tiles[:, :1]).all()
    res = np.frombuffer(Mutation("a", "int32", "resample", 1).apply(data, rng), "<i4")
    assert ((res >= 0) & (res < n)).all() and len(np.unique(res)) < n
    assert (res != np.arange(n)).mean() > 0.9


def test_derived_whole_region_runs_fit_a_byte_budget():
    """Small inputs get up to four whole-region runs, large ones one; pointers and regions
    whose values ref does not read are never mutated, and floats are resampled where the rest
    is permuted."""
    from kpair.policy.mutation import derive
    mib = 1 << 20
    small = derive([("a", 4096, "float32"), ("b", 4096, None), ("c", 4096, "float32")],
                   inputs=["a", "b"], holds_pointers=[])
    assert [(m.region, m.dtype, m.method, m.count) for m in small] == [
        ("a", "float32", "resample", 4), ("b", "uint64", "permute", 4)]
    assert {m.count for m in derive([("x", 10 * mib, "float16"), ("p", 64, None)],
                                    inputs=["x", "p"], holds_pointers=["p"])} == {3}
    assert {m.count for m in derive([("x", 16 * mib, "float32"), ("y", 16 * mib, "float32")],
                                    inputs=["x", "y"], holds_pointers=[])} == {1}


def test_run_options_name_the_checks():
    assert RunOptions.from_json(RunOptions(skip_checks=["bias"]).to_json()).skip_checks == \
        ("bias",)
    with pytest.raises(UsageError, match="unknown check 'guards'"):
        RunOptions(skip_checks=("guards",))
    assert "--skip-check differential" in _describe_exit(-11, "trust:differential")


# ---------------------------------------------------------------- the adversarial suite


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """One snapshot of kp_matmul (n=64) whose output buffer *already holds the answer* (the
    case where a kernel that writes nothing passes a naive harness), every cheat built, and
    the policies: byte-exact and cosine >= 0.9999, both with mutations of a and b."""
    d = tmp_path_factory.mktemp("trust")
    naive = compile_shared(CSRC / "matmul.c", d / "naive.so", defines={"KP_VARIANT": 0})
    fast = compile_shared(CSRC / "matmul.c", d / "fast.so", defines={"KP_VARIANT": 1})
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((N, N), dtype=np.float32) for _ in range(2))
    c = np.zeros((N, N), np.float32)
    args, names = [a, b, c, np.int32(N)], ["a", "b", "c", "n"]
    record_call(naive, "kp_matmul", args, d / "first", names=names)   # c now holds a @ b
    snap = record_call(naive, "kp_matmul", args, d / "snap", names=names)
    assert snap.pre(2) == snap.post(2)
    answer = d / "answer.h"
    answer.write_text("static const uint32_t kp_answer[] = {" + ",".join(
        map(str, np.frombuffer(snap.post(2), "<u4"))) + "};\n")
    libs = {"fast": fast, "naive": naive}
    for name, k in CHEATS.items():
        extra = {"KP_ANSWER": f'"{answer}"'} if name == "hardcode" else {}
        libs[name] = compile_shared(CSRC / "adversarial.c", d / f"{name}.so",
                                    flags=("-O2", "-pthread"), defines={"KP_CHEAT": k, **extra})
    muts = (Mutation("a", "float32", "permute", 2), Mutation("b", "float32", "resample", 2))
    policies = {"exact": Policy(mutations=muts), "default": Policy(),
                "off": Policy(mutations=()),
                "cosine": Policy((Tolerance("c", 0, N * N * 4, "float32", "cosine",
                                            min_cosine=0.9999),), mutations=muts)}
    count = iter(range(1000))

    def run(opt: str, policy: str = "exact", options: RunOptions = QUICK, **kw) -> dict:
        h = create_harness(d / "snap", d / f"h{next(count)}-{opt}", opt=libs[opt],
                           policy=policies[policy], **kw)
        return run_json(h.root, options)

    run.libs, run.dir = libs, d
    return run


#: opt kernel, policy -> the check that must reject it (None: the policy verdict itself) and a
#: phrase of the summary line.
REJECTED = [
    ("nowrite", "exact", "poisoned_outputs", "still hold the poison"),
    ("const", "exact", None, "region c: "),
    ("stale", "exact", "differential", "wrong on a mutated input"),
    ("oob", "exact", "guard_bands", "past the end of region c (offsets +16384..+16387"),
    ("input", "exact", "input_integrity", "modified input region a"),
    ("hardcode", "exact", "differential", "wrong on a mutated input"),
    ("nondet", "exact", "opt_determinism", "nondeterministic"),
    ("lowprec", "exact", None, "region c: "),
    ("lowprec", "cosine", "bias", "one-sided systematic error"),
    ("scale", "cosine", "bias", "one-sided systematic error"),
    ("lazy", "exact", "timed_outputs", "wrong after timing window"),
    # Honest exactly where a fixed, public schedule would check: every timed launch is judged.
    ("count", "exact", "timed_outputs", "wrong after timed launch"),
    # A memo keyed on sampled inputs: the secret sparse variants keep the key and change the
    # answer; the differential runs meet them in a row, the timed launches rotate among them.
    ("memo", "exact", ("differential", "timed_outputs"), ""),
    ("memo", "default", ("differential", "timed_outputs"), ""),
]


@pytest.mark.parametrize(("opt", "policy", "check_name", "phrase"), REJECTED,
                         ids=[f"{o}-{p}" for o, p, _, _ in REJECTED])
def test_cheat_is_rejected_with_the_right_reason(suite, opt, policy, check_name, phrase):
    r = suite(opt, policy)
    assert r["status"] == "fail" and r["correct"] is False and r["speed"] is None, \
        r.get("error")
    line = summarize(r)
    assert phrase in line, line
    failed = r["correctness"].get("failed_check")
    assert failed in (check_name if isinstance(check_name, tuple) else (check_name,)), line
    if failed:
        assert line.startswith(f"FAIL [{failed}]")
        assert r["trust"][failed]["passed"] is False
        assert r["trust"][failed]["reason"] in line


def test_a_kernel_wrong_only_in_the_timing_windows_fails(suite):
    """Counting its calls, a kernel can tell the timing windows (opt's launches 4 + D to
    8 + D, D the differential runs) from everything else; judged after every window, one that
    cheats only there fails ``timed_outputs``, named as a timing window."""
    honest = suite("fast", "exact")
    d = len(honest["trust"]["differential"]["finding"]["runs"])
    assert honest["trust"]["timed_outputs"]["finding"]["windows_checked"] == 5
    lib = compile_shared(CSRC / "adversarial.c", suite.dir / "windows.so", flags=("-O2",),
                         defines={"KP_CHEAT": 16, "KP_FROM": 4 + d})
    suite.libs["windows"] = lib
    r = suite("windows", "exact")
    line = summarize(r)
    assert r["status"] == "fail" and r["correctness"]["failed_check"] == "timed_outputs", line
    assert "wrong after timing window 1 " in line, line


def test_work_handed_to_a_thread_gains_nothing(suite):
    """The thread-handoff cheat returns at once and leaves the work to a detached thread. Its
    executor's CPU clock counts every thread, and the executor is stopped between its
    launches: the handoff is caught (by the window, or by an output still unwritten when a
    launch is judged, whichever comes first) or charged in full — never a gain."""
    r = suite("deferred", "exact")
    if r["status"] == "fail":
        assert r["correctness"]["failed_check"] in ("timing_integrity", "timed_outputs",
                                                    "differential", "opt_determinism",
                                                    "poisoned_outputs"), summarize(r)
    else:
        assert r["status"] == "pass" and r["speed"]["difference"] != "faster", summarize(r)


@pytest.mark.parametrize("policy", ["exact", "default", "cosine"])
def test_a_memo_of_every_input_byte_gains_nothing(suite, policy):
    """ref's own loop behind a memo keyed on a hash of all its input bytes: never wrong, and a
    memcpy on any input it has seen (3.2-3.5x "faster" when the timed blocks rotated among
    three inputs). Every timed block now gets an input no launch had before, under a
    tolerance policy too: no hit, no gain."""
    r = suite("hashmemo", policy)
    assert r["status"] == "pass", summarize(r)
    # Without a hit it is ref plus a hash (0.76-0.84x here); a busy machine blurs 8 blocks
    # (1.24x seen beside a full test run), hits would make it a memcpy (3.2x and more).
    assert r["speed"]["speedup"] < 2.0, summarize(r)
    timed = r["trust"]["timed_outputs"]["finding"]
    assert timed["checked"] == timed["launches"] > 0
    # One fresh input per block of the measurement; blocks without opt (ref against its
    # second load) run the captured input: as many fresh inputs as opt launches.
    assert timed["input_variants"] == timed["launches"]
    assert r["trust"]["ref_integrity"]["finding"]["timed_checked"] > timed["launches"]


def test_blocks_no_sparse_range_can_change_count_as_the_captured_input(tmp_path, matmul_libs):
    """A and B hold one value each: no sparse change of them changes a byte, so every timed
    block runs the captured input, and timed_outputs says one input, not one per block."""
    n = 32
    a, b = np.ones((n, n), np.float32), np.full((n, n), 2.0, np.float32)
    c = np.zeros((n, n), np.float32)
    snap = record_call(matmul_libs["naive"], "kp_matmul", [a, b, c, np.int32(n)],
                       tmp_path / "s", names=["a", "b", "c", "n"])
    h = create_harness(snap.root, tmp_path / "h", opt=matmul_libs["fast"])
    r = run_json(h.root, QUICK)
    assert r["status"] == "pass", summarize(r)
    timed = r["trust"]["timed_outputs"]["finding"]
    assert timed["launches"] > 1 and timed["input_variants"] == 1, timed


def test_a_memo_that_redoes_only_what_changed_gains_nothing(suite):
    """ref's own loop for the outputs that the elements changed since the last call can reach,
    the last answer for the rest: never wrong. With a fresh input of 4 changed elements per
    range it redid one row and four columns of 64 (2.8x "faster" on the host); a fresh
    input now changes a run in every 256 bytes, every row of A: it redoes everything."""
    r = suite("deltamemo", "exact")
    assert r["status"] == "pass", summarize(r)
    assert r["speed"]["speedup"] < 2.0, summarize(r)


def test_a_fresh_input_changes_a_few_elements_in_every_window():
    rng = np.random.default_rng(3)
    values = rng.standard_normal(1000).astype(np.float32)
    p = Mutation("x", "float32", "sparse").patch(values.tobytes(), rng)
    runs = -(-4000 // PATCH_WINDOW)
    assert p.size == 16 and len(p.offsets) == runs and len(p.data) == runs * 16
    assert (p.offsets % 4 == 0).all() and (np.diff(p.offsets) >= 16).all()
    window = 1000 // runs * 4                      # one run inside each window of elements
    assert all(w * window <= o <= (w + 2) * window for w, o in enumerate(p.offsets))
    new = np.frombuffer(p.data, np.float32)
    assert set(new) <= set(values)                 # floats: values taken from the range
    old = np.concatenate([values[o // 4:o // 4 + 4] for o in p.offsets])
    assert (new != old).any()
    idx = np.arange(100, dtype=np.int64).tobytes()   # indices: each run's own, reordered
    p = Mutation("i", "int64", "sparse", start=80).patch(idx, rng)
    assert p.offsets[0] >= 80
    for at, run in p.writes():
        assert sorted(np.frombuffer(run, np.int64)) == list(np.frombuffer(idx[at:at + 32],
                                                                          np.int64))
    assert Mutation("z", "int32", "sparse").patch(bytes(64), rng) is None   # nothing to change
    big = Mutation("b", "uint8", "sparse").patch(bytes(range(256)) * (1 << 16), rng)
    assert len(big.offsets) == PATCH_RUNS          # 16 MiB: wider windows, not more runs
    # the host writes the runs straight into the region, as one write each would
    from kpair.backends.host import HostDevice

    region = ctypes.create_string_buffer(bytes(range(256)) * 64)
    p = Mutation("r", "uint16", "sparse").patch(region.raw, rng)
    want = bytearray(region.raw)
    for at, run in p.writes():
        want[at:at + len(run)] = run
    HostDevice().scatter([(ctypes.addressof(region), p)])
    assert region.raw == bytes(want) != bytes(range(256)) * 64


@pytest.mark.parametrize(("opt", "policy"), [("fast", "exact"), ("fast", "cosine"),
                                             ("honest_split", "cosine")])
def test_honest_opt_passes_every_check(suite, opt, policy):
    r = suite(opt, policy)
    assert r["status"] == "pass" and r["correct"] is True, summarize(r)
    trust = r["trust"]
    assert set(trust) == set(CHECKS)
    assert not [k for k, v in trust.items() if v["passed"] is False]
    ran = {k for k, v in trust.items() if v["ran"]}
    assert ran >= {"baseline_determinism", "guard_bands", "input_integrity", "poisoned_outputs",
                   "opt_determinism", "differential", "timing_integrity", "impossible_speed",
                   "noop", "timed_outputs", "ref_integrity"}
    poison = trust["poisoned_outputs"]["finding"]
    assert poison["regions"] == {"c": {"bytes": N * N * 4, "runs": 1}}
    assert poison["opt_runs_poisoned"] == 7    # 3 opt runs + 2 differential + 2 sparse runs
    assert trust["input_integrity"]["finding"]["inputs"] == ["a", "b"]
    assert trust["noop"]["finding"]["noop"] and "note" in trust["noop"]["finding"]
    assert all(row["changed_output"] for row in trust["differential"]["finding"]["runs"])
    assert r["checks"]["enabled"] and "trust:poison" in r["stage_s"]
    if policy == "cosine":
        assert trust["bias"]["passed"] is True
        rows = trust["differential"]["finding"]["runs"]
        assert all(len(row["mean_signed_rel_err"]) == 1 for row in rows)
    saved = json.loads((Path(r["harness"]) / "result.json").read_text())
    assert saved["trust"] == trust


@pytest.mark.parametrize("opt", ["stale", "hardcode"])
def test_default_policy_derives_mutations_and_catches_specialised_opts(suite, opt):
    """Users do not declare mutations: with the default policy kpair derives them from the
    regions ref only reads, and a cached or hard-coded answer fails them."""
    r = suite(opt, "default")
    assert r["status"] == "fail" and r["correctness"]["failed_check"] == "differential"
    found = r["trust"]["differential"]["finding"]
    assert found["source"] == "derived"
    assert found["mutations"] == ["resample a as float32", "resample b as float32"]
    assert "wrong on a mutated input" in summarize(r)


def test_default_policy_passes_honest_opts_and_an_empty_list_turns_mutations_off(suite):
    r = suite("fast", "default")
    assert r["status"] == "pass", summarize(r)
    d = r["trust"]["differential"]
    assert d["passed"] is True and d["finding"]["source"] == "derived"
    # small inputs: four whole-region runs, then two sparse ones (the timed launches' inputs)
    runs = d["finding"]["runs"]
    assert len(runs) == 6 and all(x["changed_output"] for x in runs)
    assert all(m.startswith("sparse") == (i >= 4) for i, x in enumerate(runs)
               for m in x["mutated"])
    off = suite("stale", "off")  # the stale answer is caught by nothing else
    assert off["status"] == "pass" and off["trust"]["differential"]["ran"] is False
    assert any("mutations" in w and "[]" in w for w in off["warnings"]), off["warnings"]


@pytest.mark.parametrize(("opt", "policy"), [("fast", "exact"), ("honest_split", "cosine"),
                                             ("deferred", "exact")])
def test_timing_integrity_holds_under_load(suite, cpu_hogs, opt, policy):
    """Busy processes on every core: the honest opts still pass timing_integrity (host
    timing reads CPU time, which preemption does not inflate), and work handed to a thread is
    still caught or charged (as in test_work_handed_to_a_thread_gains_nothing)."""
    r = suite(opt, policy)
    ti = r["trust"]["timing_integrity"]
    if opt == "deferred":
        assert r["status"] == "fail" or r["speed"]["difference"] != "faster", summarize(r)
    else:
        assert ti["passed"] is True, (summarize(r), ti["finding"])
        assert r["status"] == "pass", summarize(r)


def test_without_checks_the_output_buffer_fools_the_harness(suite):
    """Why poisoning matters: the output already held the answer, so a kernel that does
    nothing is "correct" unless the buffer is poisoned first."""
    r = suite("nowrite", options=RunOptions(**{**QUICK.__dict__, "checks": False}))
    assert r["status"] == "pass" and r["checks"] == {"enabled": False} and "trust" not in r
    r = suite("oob", options=RunOptions(**{**QUICK.__dict__, "skip_checks": ("guard_bands",)}))
    assert r["status"] == "pass" and r["trust"]["guard_bands"]["ran"] is False


def test_nondeterministic_baseline_fails_then_policy_suggest_fixes_it(suite, capsys):
    d, libs = suite.dir, suite.libs
    h = create_harness(d / "snap", d / "nondet-ref", ref=libs["nondet"], opt=libs["fast"])
    r = run_json(h.root, QUICK)
    assert r["status"] == "fail" and r["correctness"]["failed_check"] == "baseline_determinism"
    assert "baseline nondeterministic" in summarize(r) and "kpair policy suggest" in summarize(r)
    assert kpair(["policy", "suggest", str(h.root), "-o", str(d / "suggested.json"),
                  "--runs", "4"]) == 0
    assert "1 byte(s) vary over 4 ref runs" in capsys.readouterr().err
    suggested = Policy.from_json(json.loads((d / "suggested.json").read_text()))
    assert [(t.region, t.start, t.end, t.criterion) for t in suggested.tolerances] == \
        [("c", 0, 4, "scalar_rtol")]
    assert [m.region for m in suggested.mutations] == ["a", "b"]
    h2 = create_harness(d / "snap", d / "nondet-ref-2", ref=libs["nondet"], opt=libs["fast"],
                        policy=d / "suggested.json")
    r = run_json(h2.root, QUICK)
    assert r["status"] == "pass", summarize(r)
    assert r["trust"]["baseline_determinism"]["finding"]["differing_bytes"] == {"c": 1}


def test_noop_dispatch_passes_with_a_warning(suite):
    d = suite.dir
    x = np.arange(16, dtype=np.int32)
    record_call(suite.libs["nowrite"], "kp_nothing", [x, np.int32(16)], d / "noop",
                names=["x", "n"])
    h = create_harness(d / "noop", d / "noop-h", opt=suite.libs["nowrite"])
    r = run_json(h.root, QUICK)
    assert r["status"] == "pass"
    assert r["trust"]["noop"]["finding"]["noop"] is True
    assert r["warnings"] and "proves nothing" in r["warnings"][0]
    assert "WARNING noop" in summarize(r)
    assert "not known to hold floats" in r["trust"]["poisoned_outputs"]["finding"][
        "not_tested"]["x"]


def test_a_derived_mutation_ref_cannot_take_is_dropped_with_a_warning(tmp_path):
    """Permuting rowptr makes it decreasing somewhere, and ref aborts on that: the mutation
    says nothing about opt, so the run goes on without differential runs, and says so."""
    lib, snap = record_rowsum(tmp_path)
    h = create_harness(snap, tmp_path / "h", opt=lib)
    r = run_json(h.root, QUICK)
    assert r["status"] == "pass", summarize(r)
    assert r["trust"]["differential"]["ran"] is False
    assert any(w.startswith("differential: dropped, ref itself failed on a mutated input")
               and "SIGABRT" in w for w in r["warnings"]), r["warnings"]


def _masked_update(tmp_path, kernel: str, policy: Policy | None = None):
    """An A/A harness of tests/csrc/KERNEL.c (``kp_KERNEL(mask, g, out, n)``: out updated in
    place under a random mask over 4096 floats) and its mask."""
    lib = compile_shared(CSRC / f"{kernel}.c", tmp_path / f"{kernel}.so")
    n = 4096
    rng = np.random.default_rng(0)
    mask = (rng.random(n) < 0.5).astype(np.uint8)
    g = rng.standard_normal(n).astype(np.float32)
    out = rng.standard_normal(n).astype(np.float32)
    snap = record_call(lib, f"kp_{kernel}", [mask, g, out, np.int32(n)], tmp_path / "s",
                       names=["mask", "g", "out", "n"])
    return create_harness(snap.root, tmp_path / "h", opt=lib, policy=policy), mask


def test_write_only_bytes_that_a_mutated_input_reads_are_not_poisoned(tmp_path):
    """On the captured input the masked elements of out are write-only and get poison; a
    permuted mask makes the kernel read some of them. ref itself then changes its answer under
    poison, so opt's run on that input is not poisoned, and an honest opt passes."""
    h, mask = _masked_update(tmp_path, "relu_backward")
    r = run_json(h.root, QUICK)
    assert r["status"] == "pass", summarize(r)
    poison = r["trust"]["poisoned_outputs"]["finding"]
    assert poison["regions"]["out"]["bytes"] == int(mask.sum()) * 4   # the masked elements
    # Fragmented: launches take poison from two held copies in turn; ref's control ran on each.
    assert "under each of the 2 poisons" in poison["control"], poison["control"]
    runs = r["trust"]["differential"]["finding"]["runs"]
    unpoisoned = [row["run"] for row in runs if not row["poisoned"]]
    assert unpoisoned and all("not poisoned" in poison["not_tested"][k] for k in unpoisoned)


def test_bytes_ref_drops_only_while_they_hold_a_number_are_not_poisoned(tmp_path):
    """The masked elements of out become 0 for any number they held but keep a NaN. Two
    arbitrary fill words cannot tell them from write-only bytes, and a control run under one
    poisoned copy can miss the other (a quiet-NaN word): then ref itself, as opt, failed under
    poison. The first fill is a quiet NaN, so they are read, and ref against itself passes."""
    h, _ = _masked_update(tmp_path, "nan_keep")
    for seed in (1, 2, 3):
        r = run_json(h.root, dataclasses.replace(QUICK, seed=seed))
        assert r["status"] == "pass", summarize(r)
        poison = r["trust"]["poisoned_outputs"]["finding"]
        assert "out" not in poison["regions"], poison


def test_opt_is_never_judged_under_a_poison_that_changes_refs_own_answer(tmp_path):
    """The masked elements of out become 0 unless they held a huge number: both discovery
    fills and every captured value leave them write-only, but about four arbitrary poison words
    in ten are huge. Every candidate's poisons are proven by ref's control before opt runs (a
    failing draw is replaced), and a mutated input's poison is checked on ref with the very
    words opt had: ref against itself passes under every seed, with the poison applied."""
    h, mask = _masked_update(tmp_path, "huge_keep")
    controls = set()
    for seed in range(1, 9):
        r = run_json(h.root, dataclasses.replace(QUICK, seed=seed))
        assert r["status"] == "pass", (seed, summarize(r))
        poison = r["trust"]["poisoned_outputs"]["finding"]
        assert poison["regions"]["out"]["bytes"] == int(mask.sum()) * 4, (seed, poison)
        assert poison["opt_runs_poisoned"] >= 3
        controls.add(poison["control"])
    assert len(controls) == 1 and "under each of the 2 poisons" in controls.pop()


def test_poison_an_honest_kernel_keeps_within_a_tolerance_is_not_held_against_it(tmp_path):
    """A masked fill in place under a cosine tolerance: on a mutated mask some write-only
    elements are kept, poison and all, by ref as by opt, and the run still passes the policy.
    Whole poison words left where ref's answer differs fail ``poisoned_outputs``, so such a
    run is checked on ref under the same poison and, where ref leaves it too, runs again
    unpoisoned: ref against itself passes under every seed."""
    n = 4096
    policy = Policy((Tolerance("out", 0, 4 * n, "float32", "cosine", min_cosine=0.999),))
    h, _ = _masked_update(tmp_path, "masked_fill", policy)
    for seed in range(1, 9):
        r = run_json(h.root, dataclasses.replace(QUICK, seed=seed))
        assert r["status"] == "pass", (seed, summarize(r))
        assert r["trust"]["poisoned_outputs"]["finding"]["left"] == []


def test_timed_outputs_are_judged_once_per_bytes_object_and_input(monkeypatch):
    """Timed launches on the captured input (a harness without mutations), judged under a
    tolerance: outputs the replay matched on the device to bytes it holds come back as the
    same host object and keep their verdict; other bytes, or the same bytes for another
    input, are judged."""
    from kpair.policy import Policy
    from kpair.trust import audit as audit_mod

    judged = []

    def fake_check(policy, want, got, dtype_hints=None):
        judged.append(got["y"])
        ok = got["y"] == want["y"]
        return SimpleNamespace(passed=ok, summary=lambda: "FAIL: y differs")

    good, bad = b"\x01" * 8, b"\x02" * 8
    reads = iter([good, good, bad, good, good])
    replay = SimpleNamespace(read_back=lambda names: {"y": next(reads)})
    a = audit_mod.Audit.__new__(audit_mod.Audit)
    a.replay, a.policy, a.hints, a._judged = replay, Policy(), {}, []
    monkeypatch.setattr(audit_mod, "check", fake_check)
    monkeypatch.setattr(audit_mod, "passes", lambda *args: False)   # every judging counted
    want = {"y": good}
    assert a._judge_timed(0, ["y"], want) is None
    assert a._judge_timed(0, ["y"], want) is None          # same object: not judged again
    assert a._judge_timed(0, ["y"], want) == "FAIL: y differs"
    assert a._judge_timed(1, ["y"], want) is None          # another input: judged
    assert a._judge_timed(0, ["y"], want) is None
    assert judged == [good, bad, good]


def _in_place(tmp_path, kernel: str, opt_kernel: str):
    """A harness of tests/csrc/inplace.c: ``kernel`` recorded on 4096 floats it updates in
    place (its only region), paired with ``opt_kernel`` of the same build."""
    lib = compile_shared(CSRC / "inplace.c", tmp_path / "inplace.so")
    x = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    snap = record_call(lib, kernel, [x, np.int32(x.size)], tmp_path / "s", names=["x", "n"])
    return create_harness(snap.root, tmp_path / "h", opt=lib, opt_kernel=opt_kernel)


def test_a_buffer_updated_in_place_is_mutated_like_an_input(tmp_path):
    """No region is read-only, so before in-place inputs were mutated there were no
    differential runs and no fresh timed inputs: a memo keyed on sampled elements passed
    (2,000x "faster"). Its pre-state is an input: the memo fails, the honest opt passes."""
    h = _in_place(tmp_path / "memo", "kp_inplace", "kp_inplace_memo")
    r = run_json(h.root, QUICK)
    assert r["status"] == "fail", summarize(r)
    failed = [name for name, c in r["trust"].items() if c.get("passed") is False]
    assert failed and failed[0] in ("differential", "timed_outputs"), summarize(r)
    h = _in_place(tmp_path / "honest", "kp_inplace", "kp_inplace2")
    r = run_json(h.root, QUICK)
    assert r["status"] == "pass", summarize(r)
    diff = r["trust"]["differential"]
    assert diff["ran"] and diff["finding"]["source"] == "derived", diff
    assert any(m.startswith("x ") or " x " in m for m in diff["finding"]["mutations"]), diff
    assert not any(w.startswith("differential") for w in r.get("warnings", ())), r


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_an_in_place_relu_against_itself_passes(tmp_path, seed):
    """x = max(x, 0) in place drops a negative element and keeps a positive one. Two fills
    that are both non-positive (a quiet NaN and a negative number) took the negative elements
    for write-only; an arbitrary poison word that happened to be positive stayed, and ref
    against itself failed poisoned_outputs under some seeds. The second fill is positive."""
    h = _in_place(tmp_path, "kp_relu", "kp_relu")
    r = run_json(h.root, dataclasses.replace(QUICK, seed=seed))
    assert r["status"] == "pass", summarize(r)
    assert "x" not in r["trust"]["poisoned_outputs"]["finding"].get("regions", {})
