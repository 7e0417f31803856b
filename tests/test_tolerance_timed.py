"""Tolerance policies judge every timed launch as fully as a check run (issue 44, item 6), and
no secret reaches a candidate (item 3): cheating kp_matmul kernels of tests/csrc/adversarial.c
against a cosine policy on the host backend.

- TIMEDSCALE (KP_CHEAT 18): exact on every check run, the exact result times (1 + 2^-10) on
  the fresh inputs of its timed launches. Cosine cannot see a scale; the one-sided-error test
  (``bias``) now runs on every timed launch whose outputs differ from ref's.
- MEMOB (KP_CHEAT 19): takes B for a constant (rounds it to bf16 at its first call and keeps
  that copy) while the declared mutations name only A. Read-only regions the declared
  mutations leave out get the derived ones as well, unless the policy opts out
  (``mutations_exact`` with a note), which the result says.
- SNOOP (KP_CHEAT 17): reads the command line and environment of every process above its
  executor at load, looking for the run's --seed.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

from conftest import CSRC, run_json, summarize
from kpair.errors import PolicyError
from kpair.harness import create_harness
from kpair.pipeline import RunOptions
from kpair.policy import Mutation, Policy, Tolerance
from kpair.record import record_call
from kpair.toolchain import compile_shared

N = 64
QUICK = RunOptions(time_cap_s=1.0, min_blocks=4, max_blocks=8, seed=7, timeout_s=120,
                   device_options={"flush_bytes": 4 << 20})
#: A seed no command line holds by chance.
SEED = 8675309123457
COSINE = (Tolerance("c", 0, N * N * 4, "float32", "cosine", min_cosine=0.9999),)
ONLY_A = (Mutation("a", "float32", "permute", 2),)
BOTH = (Mutation("a", "float32", "permute", 2), Mutation("b", "float32", "resample", 2))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """One snapshot of kp_matmul (n=64, naive ref); ``pair(opt, policy)`` runs a harness of
    it with that opt (a library, or a name of ``pair.libs``) and returns result.json."""
    d = tmp_path_factory.mktemp("tolerance_timed")
    naive = compile_shared(CSRC / "matmul.c", d / "naive.so", defines={"KP_VARIANT": 0})
    fast = compile_shared(CSRC / "matmul.c", d / "fast.so", defines={"KP_VARIANT": 1})
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((N, N), dtype=np.float32) for _ in range(2))
    record_call(naive, "kp_matmul", [a, b, np.zeros((N, N), np.float32), np.int32(N)],
                d / "snap", names=["a", "b", "c", "n"])
    count = iter(range(1000))

    def run(opt, policy: Policy, options: RunOptions = QUICK) -> dict:
        lib = run.libs.get(opt, opt)
        h = create_harness(d / "snap", d / f"h{next(count)}", opt=lib, policy=policy)
        return run_json(h.root, options)

    def build(name: str, cheat: int, **defines) -> Path:
        run.libs[name] = compile_shared(CSRC / "adversarial.c", d / f"{name}.so",
                                        flags=("-O2",), defines={"KP_CHEAT": cheat,
                                                                 **defines})
        return run.libs[name]

    run.libs = {"fast": fast, "naive": naive,
                "honest_split": compile_shared(CSRC / "adversarial.c", d / "split.so",
                                               defines={"KP_CHEAT": 0})}
    run.build, run.dir = build, d
    return run


#: Correct on every check run; from call KP_FROM on (opt's first timing window) it also
#: scribbles on A after computing (the next launch's restore undoes it: nothing else notices).
SCRIBBLE = """#include <stdint.h>
void kp_matmul(const float *a, const float *b, float *c, int32_t n) {
    static unsigned calls;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < n; j++) c[i * n + j] = 0.0f;
        for (int k = 0; k < n; k++)
            for (int j = 0; j < n; j++) c[i * n + j] += a[i * n + k] * b[k * n + j];
    }
    if (++calls >= KP_FROM) ((float *)a)[5] = 0.0f;
}
"""


def _failed(r: dict) -> str:
    assert r["status"] == "fail" and r["correct"] is False and r["speed"] is None, \
        r.get("error")
    return r["correctness"]["failed_check"]


# ---------------------------------------------------------------- timed launches, fully judged


def test_a_kernel_scaled_only_on_its_timed_inputs_fails_bias(pair):
    """Exact on every check run (the captured input, the differential runs: its first
    KP_FROM - 1 calls), (1 + 2^-10) x the answer on every fresh timed input after that.
    Cosine passes every one of those launches; the sign test on the timed launches does not."""
    honest = pair("fast", Policy(COSINE, mutations=BOTH))
    assert honest["status"] == "pass", summarize(honest)
    d = len(honest["trust"]["differential"]["finding"]["runs"])
    pair.build("timedscale", 18, KP_FROM=4 + d)
    r = pair("timedscale", Policy(COSINE, mutations=BOTH))
    line = summarize(r)
    assert _failed(r) == "bias", line
    assert line.startswith("FAIL [bias]") and "one-sided systematic error" in line, line
    assert "timing window 1" in line, line      # its first launch on a fresh input
    finding = r["trust"]["bias"]["finding"]
    assert finding["timed_launches_judged"] >= 1
    flagged = [s for s in finding["ranges"] if s["flagged"]]
    assert flagged and all(s["run"].startswith(("timing window", "timed launch"))
                           for s in flagged), flagged
    assert abs(flagged[0]["mean_signed_rel_err"] - 2 ** -10) < 1e-4, flagged[0]
    # Every check run was exact: the differential runs and opt's own runs all passed.
    assert r["trust"]["differential"]["passed"] is True
    assert r["trust"]["opt_determinism"]["passed"] is True


def test_honest_tolerance_candidates_pass_with_every_timed_launch_judged(pair):
    """A summation order that differs from ref's in the last bits: no one-sided error on any
    timed launch, inputs untouched after every one."""
    r = pair("honest_split", Policy(COSINE, mutations=BOTH))
    assert r["status"] == "pass", summarize(r)
    trust = r["trust"]
    timed = trust["timed_outputs"]["finding"]
    assert trust["bias"]["passed"] is True
    # Every timed launch of opt on a fresh input differs from ref's in the last bits: each
    # was sign-tested, the timing windows included.
    assert trust["bias"]["finding"]["timed_launches_judged"] >= timed["launches"]
    integrity = trust["input_integrity"]["finding"]
    assert integrity["timed_launches_checked"] == timed["launches"] + timed["windows_checked"]
    assert integrity["modified"] == []


def test_a_kernel_that_writes_its_input_only_when_timed_fails_input_integrity(pair, tmp_path):
    """Correct on every check run, and from its first timing window on it scribbles on A
    after computing (the next launch restores A, so nothing else notices)."""
    src = tmp_path / "scribble.c"
    src.write_text(SCRIBBLE)
    honest = pair("fast", Policy(COSINE, mutations=BOTH))
    d = len(honest["trust"]["differential"]["finding"]["runs"])
    lib = compile_shared(src, tmp_path / "scribble.so", defines={"KP_FROM": 4 + d})
    r = pair(lib, Policy(COSINE, mutations=BOTH))
    line = summarize(r)
    assert _failed(r) == "input_integrity", line
    assert "modified input region a" in line and "timing window 1" in line, line


# ---------------------------------------------------------------- declared mutations, completed


def test_a_read_only_region_the_declared_mutations_leave_out_is_mutated_too(pair):
    """MEMOB treats B as a constant weight (bf16 to nearest: within cosine, no one-sided
    error). The policy's mutations name only A; B gets kpair's derived mutation as well, and
    the stale copy of B fails on it."""
    pair.build("memob", 19)
    r = pair("memob", Policy(COSINE, mutations=ONLY_A))
    line = summarize(r)
    assert _failed(r) in ("differential", "timed_outputs"), line
    diff = r["trust"]["differential"]["finding"]
    assert diff["source"] == "declared"
    assert diff["derived_for"] == ["b"]
    assert "resample b as float32" in diff["mutations"], diff["mutations"]
    assert "permute a as float32" in diff["mutations"][0], diff["mutations"]


def test_mutations_exact_keeps_the_declared_list_and_says_so(pair):
    """A policy may keep its mutations exactly as written only with a note saying why; the
    result then names the read-only regions left unvaried (and MEMOB passes: what the opt-out
    costs)."""
    with pytest.raises(PolicyError) as info:
        Policy(COSINE, mutations=ONLY_A, mutations_exact=True)
    assert info.value.field == "note"
    with pytest.raises(PolicyError):
        Policy(COSINE, mutations_exact=True, note="b is a weight")   # nothing declared
    policy = Policy(COSINE, note="b holds fixed weights the model never changes",
                    mutations=ONLY_A, mutations_exact=True)
    assert Policy.from_json(policy.to_json()) == policy
    assert policy.to_json()["mutations_exact"] is True
    pair.build("memob", 19)
    r = pair("memob", policy)
    assert r["status"] == "pass", summarize(r)
    diff = r["trust"]["differential"]["finding"]
    assert diff["mutations_exact"] == {"note": policy.note, "unvaried": ["b"]}
    assert "derived_for" not in diff
    assert any("mutations_exact" in w and "b" in w for w in r["warnings"]), r["warnings"]


def test_honest_opts_pass_with_the_completed_mutations(pair):
    for opt in ("fast", "honest_split"):
        r = pair(opt, Policy(COSINE, mutations=ONLY_A))
        assert r["status"] == "pass", summarize(r)
        assert r["trust"]["differential"]["finding"]["derived_for"] == ["b"]


# ---------------------------------------------------------------- no secret for the candidate


def test_a_candidate_reading_the_command_lines_above_it_finds_no_seed(pair):
    """SNOOP reads /proc/PID/cmdline and /proc/PID/environ of its executor's parent (the
    worker) and every process above it at load, for the run's --seed: it finds nothing (and
    so computes honestly). The worker's options come over its stdin, never its argv."""
    pair.build("snoop", 17, KP_SECRET=f'"{SEED}"')
    r = pair("snoop", Policy(), dataclasses.replace(QUICK, seed=SEED))
    log = (Path(r["harness"]) / r["log"]).read_text()
    said = re.findall(r"kp-snoop: (\d+) files read, secret (\w+)", log)
    assert said and all(found == "absent" for _, found in said), log[-2000:]
    # It did read them (read-only opens are allowed while a code object loads): at least
    # the worker's command line, the one that used to carry the seed.
    assert all(int(n) >= 1 for n, _ in said), said
    assert r["status"] == "pass", summarize(r)
    assert r["checks"]["seed"] == SEED


def test_the_device_side_input_check_catches_what_the_read_back_does(pair, tmp_path,
                                                                     monkeypatch):
    """The path a GPU takes (``compares_in_place``: each block's input held as a device copy
    made from the held pre-state and the block's patch, compared where the memory is after
    every timed launch of opt), run in-process on the host backend, whose held copies and
    compares are the base Device's: an honest opt passes with every timed launch checked,
    one that scribbles on A from its first timing window on fails input_integrity, and the
    timed-only scale fails bias."""
    from kpair.backends.host import HostDevice
    from kpair.pipeline import Candidate, Facts, close, evaluate, prepare

    monkeypatch.setattr(HostDevice, "compares_in_place", True)
    honest = pair("fast", Policy(COSINE, mutations=BOTH))
    d = len(honest["trust"]["differential"]["finding"]["runs"])
    src = tmp_path / "scribble.c"
    src.write_text(SCRIBBLE)
    libs = {"fast": pair.libs["fast"],
            "scribble": compile_shared(src, tmp_path / "s.so", defines={"KP_FROM": 4 + d}),
            "timedscale": pair.build("timedscale", 18, KP_FROM=4 + d)}
    seen = {}
    for name, lib in libs.items():
        h = create_harness(pair.dir / "snap", tmp_path / f"h-{name}", opt=lib,
                           policy=Policy(COSINE, mutations=BOTH))
        run, failed = prepare(h.root, QUICK, facts=Facts(harness=str(h.root), started="now"))
        try:
            assert failed is None, failed.summary()
            assert run.replay.device.compares_in_place
            o = run.harness.opt
            result, _ = evaluate(run, Candidate(run.harness.binary(o), o.kernel, o.format,
                                                o.launch_override, o.binary))
        finally:
            close(run)
        seen[name] = result.to_json()
    fast = seen["fast"]
    assert fast["status"] == "pass", summarize(fast)
    timed = fast["trust"]["timed_outputs"]["finding"]
    assert fast["trust"]["input_integrity"]["finding"]["timed_launches_checked"] == \
        timed["launches"] + timed["windows_checked"]
    line = summarize(seen["scribble"])
    assert _failed(seen["scribble"]) == "input_integrity", line
    assert "modified input region a" in line and "timing window 1" in line, line
    assert _failed(seen["timedscale"]) == "bias", summarize(seen["timedscale"])
