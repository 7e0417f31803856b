"""Misuse of the library, issue 45: bounded memory, the host ABI, the report of a failed
verification, ``record_call``'s aliasing and out-of-bounds writes, and a full disk.

Each case asserts the exception type (or exit status), a one-line message naming the fault,
and that nothing existing changed (sha256 of every file before and after). Host backend,
small C kernels built with ``-g`` (their DWARF says what each function takes).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from conftest import file_state as state
from kpair.errors import AbiMismatch, DriverError, SymbolNotFound, WriteFailed
from kpair.harness import Harness, create_harness, write_manifest
from kpair.policy import Policy
from kpair.policy.suggest import Spread, suggest_policy
from kpair.record import record_call
from kpair.toolchain import compile_shared

SRC = Path(__file__).resolve().parent.parent / "src"
QUICK = ["--min-blocks", "4", "--max-blocks", "8", "--time-cap", "2", "--replicates", "1",
         "--no-control"]

KERNELS = r"""
#include <stdint.h>
typedef float real;
struct pair { int a; double b; };
enum mode { COPY, SCALE };
void kp_copy(const float *restrict x, real *y, int n) { for (int i = 0; i < n; i++) y[i] = x[i]; }
void kp_copy_fast(const float *x, float *y, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) { y[i] = x[i]; y[i+1] = x[i+1]; y[i+2] = x[i+2]; y[i+3] = x[i+3]; }
    for (; i < n; i++) y[i] = x[i];
}
void kp_five(const float *x, float *y, int n, double s, int64_t m) {
    for (int i = 0; i < n; i++) y[i] = x[i];
    (void)s; (void)m;
}
void kp_swapped(int n, const float *x, float *y) { for (int i = 0; i < n; i++) y[i] = x[i]; }
void kp_double_n(const float *x, float *y, double n) {
    for (int i = 0; i < (int)n; i++) y[i] = x[i];
}
void kp_struct(struct pair p, float *y, int n) { y[0] = (float)p.b; (void)n; }
void kp_kinds(enum mode m, unsigned char c, _Bool b, float *y) { y[0] = (float)(m + c + b); }
void kp_addto(const float *x, float *y, int n) { for (int i = 0; i < n; i++) y[i] += x[i]; }
void kp_oob_end(const float *x, float *y, int n) { for (int i = 0; i < n + 3; i++) y[i] = x[0]; }
void kp_oob_before(const float *x, float *y, int n) {
    y[-2] = 7.0f; for (int i = 0; i < n; i++) y[i] = x[i];
}
/* A ref whose answer varies by call (its own static state), as an unordered reduction's. */
void kp_noisy(const float *x, float *y, int n) {
    static unsigned calls;
    for (int i = 0; i < n; i++) y[i] = x[i];
    calls++;
    y[(calls * 7u) % (unsigned)n] += 1e-6f * (float)(calls % 5);
}
int kp_data = 3;
"""

N = 256


# ---------------------------------------------------------------------- helpers




def one_line(e: BaseException | str, *words: str) -> str:
    text = str(e)
    assert "\n" not in text.strip(), text
    for w in words:
        assert w.lower() in text.lower(), (w, text)
    return text


def kpair(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC),
                                                        os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "kpair", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def expect(proc: subprocess.CompletedProcess, code: int, *words: str) -> str:
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert proc.returncode == code, (proc.returncode, proc.stderr[-2000:])
    err = [line for line in proc.stderr.splitlines() if line.startswith("kpair")]
    assert err, proc.stderr
    one_line(err[-1], *words)
    return proc.stderr


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Path:
    """The kernels with DWARF (k.so) and without (stripped.so), a snapshot of kp_copy, and
    one of kp_noisy."""
    d = tmp_path_factory.mktemp("misuse_lib")
    (d / "k.c").write_text(KERNELS)
    compile_shared(d / "k.c", d / "k.so", flags=("-O2", "-g"))
    compile_shared(d / "k.c", d / "stripped.so", flags=("-O2",))
    subprocess.run(["strip", "--strip-debug", str(d / "stripped.so")], check=False)
    x = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    record_call(d / "k.so", "kp_copy", [x, np.zeros(N, np.float32), np.int32(N)], d / "snap",
                names=["x", "y", "n"])
    record_call(d / "k.so", "kp_noisy", [x, np.zeros(N, np.float32), np.int32(N)],
                d / "noisy", names=["x", "y", "n"])
    return d


# ---------------------------------------------------------------------- 2: the host ABI


@pytest.mark.parametrize("kernel, words", [
    ("kp_five", ["opt kernel 'kp_five'", "takes 5 parameters (DWARF)", "passes 3"]),
    ("kp_swapped", ["parameter 0 (n)", "4-byte integer", "passes a pointer"]),
    ("kp_double_n", ["parameter 2 (n) is double", "passes a 4-byte integer"]),
    ("kp_struct", ["parameter 0 (p)", "struct passed by value"]),
])
def test_pair_refuses_a_declared_layout_other_than_the_dispatchs(lab, kernel, words):
    before = state(lab / "snap", lab / "k.so")
    with pytest.raises(AbiMismatch) as e:
        create_harness(lab / "snap", lab / f"H_{kernel}", opt=lab / "k.so", opt_kernel=kernel)
    one_line(e.value, *words)
    assert not (lab / f"H_{kernel}").exists()
    assert state(lab / "snap", lab / "k.so") == before


def test_pair_refuses_a_symbol_that_is_not_a_function(lab):
    from kpair.elfabi import declared_params

    with pytest.raises(SymbolNotFound) as e:
        create_harness(lab / "snap", lab / "H_data", opt=lab / "k.so", opt_kernel="kp_data")
    one_line(e.value, "opt kernel 'kp_data'", "not exported")
    assert not (lab / "H_data").exists()
    with pytest.raises(SymbolNotFound) as e:   # what the library says of it, read directly
        declared_params((lab / "k.so").read_bytes(), "kp_data")
    one_line(e.value, "'kp_data' is not a function", "object")


def test_pair_cli_exits_4_naming_the_parameter(lab):
    before = state(lab / "snap")
    proc = kpair("pair", "snap", "--opt", "k.so", "--opt-kernel", "kp_swapped", "-o", "H_cli",
                 cwd=lab)
    expect(proc, 4, "parameter 0 (n)", "DWARF")
    assert not (lab / "H_cli").exists() and state(lab / "snap") == before


def test_a_matching_layout_and_a_stripped_object_pair(lab, tmp_path):
    """A compatible declaration pairs (typedef, restrict, const); a stripped object carries
    no layout, so the count cannot be checked: the README says so."""
    from kpair.elfabi import declared_params

    create_harness(lab / "snap", tmp_path / "ok", opt=lab / "k.so", opt_kernel="kp_copy_fast")
    stripped = (lab / "stripped.so").read_bytes()
    assert declared_params(stripped, "kp_five").params is None
    create_harness(lab / "snap", tmp_path / "blind", opt=lab / "stripped.so",
                   opt_kernel="kp_five")


def test_declared_kinds_of_typedefs_enums_bool_and_chars(lab):
    from kpair.elfabi import declared_params

    image = (lab / "k.so").read_bytes()
    got = declared_params(image, "kp_kinds").params
    assert [(p.name, p.kind) for p in got] == [("m", "int4"), ("c", "int1"), ("b", "int1"),
                                               ("y", "pointer")]
    copy = declared_params(image, "kp_copy").params
    assert [(p.kind, p.ctype) for p in copy] == [("pointer", "float *"),
                                                 ("pointer", "real *"), ("int4", "int")]


def test_a_harness_whose_opt_changed_is_refused_at_open_before_any_launch(lab, tmp_path):
    """A harness made before these checks (or by hand) with a wrong opt: ``Harness.open`` —
    every run's first step — refuses it; ``kpair run`` exits 4 and writes no result."""
    h = create_harness(lab / "snap", tmp_path / "H", opt=lab / "k.so").root
    shutil.copy(lab / "k.so", h / "opt.so")
    spec = json.loads((h / "harness.json").read_text())
    spec["opt"]["kernel"] = "kp_five"
    (h / "harness.json").write_text(json.dumps(spec))
    write_manifest(h)
    before = state(h)
    with pytest.raises(AbiMismatch) as e:
        Harness.open(h)
    one_line(e.value, "opt kernel 'kp_five' takes 5 parameters")
    proc = kpair("run", h, *QUICK, cwd=tmp_path)
    assert proc.returncode == 4 and "Traceback" not in proc.stderr + proc.stdout
    assert "ERROR (AbiMismatch): opt kernel 'kp_five' takes 5 parameters (DWARF), the " \
           "dispatch passes 3" in proc.stdout.splitlines()
    result = json.loads((h / "result.json").read_text())   # the run's error result
    assert result["status"] == "error" and "kp_five" in json.dumps(result)
    after = state(h)
    assert {k: v for k, v in after.items() if k in before} == before


def test_an_evaluated_candidate_is_checked_before_it_is_loaded(lab, tmp_path):
    """``kpair evaluate``: a candidate whose DWARF declares 5 parameters is an error verdict
    naming them (exit 4), the good one beside it still passes."""
    h = create_harness(lab / "snap", tmp_path / "H", opt=lab / "k.so").root
    before = state(h)
    shutil.copy(lab / "k.so", tmp_path / "five.so")
    proc = kpair("evaluate", h, tmp_path / "five.so", "--kernel", "kp_five", "-o",
                 tmp_path / "EV", *QUICK, cwd=tmp_path)
    assert proc.returncode == 4, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    attempts = [json.loads(line) for line in
                (tmp_path / "EV" / "attempts.jsonl").read_text().splitlines()]
    assert len(attempts) == 1
    assert "takes 5 parameters (DWARF), the dispatch passes 3" in json.dumps(attempts[0])
    assert state(h) == before


def test_record_call_refuses_arguments_the_function_does_not_take(lab, tmp_path):
    x, y = np.ones(8, np.float32), np.zeros(8, np.float32)
    with pytest.raises(AbiMismatch) as e:
        record_call(lab / "k.so", "kp_copy", [x, y, np.int64(8)], tmp_path / "s")
    one_line(e.value, "parameter 2", "4-byte integer", "passes an 8-byte integer")
    assert not (tmp_path / "s").exists() and not y.any()


def test_reproduce_checks_the_captured_object(lab, tmp_path):
    """``kpair replay`` of a snapshot whose code object declares another layout."""
    from kpair.backends import open_device
    from kpair.replay import reproduce
    from kpair.snapshot import Snapshot

    snap = Snapshot.open(lab / "snap")
    with open_device("host") as dev:
        assert reproduce(dev, snap, 2).status == "byte-exact"
    bad = tmp_path / "snap"
    shutil.copytree(lab / "snap", bad)
    doc = json.loads((bad / "snapshot.json").read_text())
    doc["code_object"]["kernel_name"] = "kp_swapped"
    (bad / "snapshot.json").write_text(json.dumps(doc))
    with open_device("host") as dev, pytest.raises(AbiMismatch) as e:
        reproduce(dev, Snapshot.open(bad), 2)
    one_line(e.value, "captured kernel 'kp_swapped'", "parameter 0")


# ---------------------------------------------------------------------- 4: record_call


def test_one_array_passed_twice_is_one_region(lab, tmp_path):
    a = np.arange(8, dtype=np.float32)
    snap = record_call(lab / "k.so", "kp_addto", [a, a, np.int32(8)], tmp_path / "s",
                       names=["x", "y", "n"])
    assert [r.name for r in snap.manifest.regions] == ["x"]
    x_ptr, y_ptr = struct.unpack_from("<QQ", snap.kernarg())
    assert x_ptr == y_ptr == snap.manifest.regions[0].address
    np.testing.assert_array_equal(a, 2 * np.arange(8, dtype=np.float32))  # y += x, x is y
    assert snap.post(0) == a.tobytes()


def test_overlapping_views_are_one_region_spanning_them(lab, tmp_path):
    buf = np.arange(16, dtype=np.float32)
    expected = buf.copy()
    for i in range(8):          # the C loop, in order, on the same memory
        expected[4 + i] += expected[i]
    snap = record_call(lab / "k.so", "kp_addto", [buf[0:8], buf[4:12], np.int32(8)],
                       tmp_path / "s", names=["x", "y", "n"])
    (region,) = snap.manifest.regions
    assert region.size == 12 * 4
    x_ptr, y_ptr = struct.unpack_from("<QQ", snap.kernarg())
    assert (x_ptr, y_ptr) == (region.address, region.address + 16)
    np.testing.assert_array_equal(buf, expected)
    assert snap.post(0) == expected[:12].tobytes()


def test_views_that_do_not_overlap_stay_two_regions(lab, tmp_path):
    buf = np.arange(16, dtype=np.float32)
    snap = record_call(lab / "k.so", "kp_copy", [buf[0:8], buf[8:16], np.int32(8)],
                       tmp_path / "s", names=["x", "y", "n"])
    assert [r.name for r in snap.manifest.regions] == ["x", "y"]
    np.testing.assert_array_equal(buf[8:], buf[:8])


@pytest.mark.parametrize("kernel, words", [
    ("kp_oob_end", ["wrote outside its arrays", "past the end of argument 1 (y)",
                    "12 byte(s)"]),
    ("kp_oob_before", ["wrote outside its arrays", "before the start of argument 1 (y)"]),
])
def test_a_kernel_that_writes_outside_its_arrays_is_refused(lab, tmp_path, kernel, words):
    x, y = np.ones(8, np.float32), np.zeros(8, np.float32)
    (tmp_path / "keep").write_text("earlier work")
    before = state(tmp_path)
    with pytest.raises(DriverError) as e:
        record_call(lab / "k.so", kernel, [x, y, np.int32(8)], tmp_path / "s",
                    names=["x", "y", "n"])
    one_line(e.value, *words)
    assert e.value.exit_code == 5
    assert state(tmp_path) == before          # no snapshot, no staging folder left
    assert not y.any()                        # the caller's arrays were not written


# ---------------------------------------------------------------------- 1: bounded memory


def old_suggest_policy(policy, runs, *, hints, pre, margin=4.0):
    """The suggestion as kpair computed it from every run held at once (before ``Spread``),
    kept here verbatim as the reference the running reduction must equal."""
    from kpair.dtypes import EPS
    from kpair.policy import FLOAT_DTYPES, Mutation, Tolerance, decode, dtype_size

    notes, new = [], []
    for name in runs[0]:
        x = np.stack([np.frombuffer(r[name], np.uint8) for r in runs])
        differ = np.flatnonzero((x != x[0]).any(axis=0))
        if not differ.size:
            continue
        dtype = hints.get(name)
        if dtype not in FLOAT_DTYPES:
            dtype = "float32" if len(runs[0][name]) % 4 == 0 else "float16"
            notes.append(f"region {name}: element type unknown, read as {dtype}: check it")
        size = dtype_size(dtype)
        start = int(differ[0]) // size * size
        end = min(-(-(int(differ[-1]) + 1) // size) * size, len(runs[0][name]) // size * size)
        vals = np.stack([decode(np.frombuffer(r[name], np.uint8)[start:end], dtype)
                         for r in runs])
        with np.errstate(invalid="ignore"):   # inf - inf, as before
            ref0, dev = vals[0], np.abs(vals - vals[0]).max(axis=0)
        scale = float(np.abs(ref0[np.isfinite(ref0)]).max(initial=0.0))
        small = np.abs(ref0) < 1e-3 * scale
        with np.errstate(all="ignore"):
            rtol = float(np.nan_to_num(dev[~small] / np.abs(ref0[~small])).max(initial=0.0))
        atol = float(np.nan_to_num(dev[small]).max(initial=0.0))
        rtol, atol = max(margin * rtol, 4 * EPS[dtype]), margin * atol
        if end - start == size:
            tol = Tolerance(name, start, end, dtype, "scalar_rtol", rtol=rtol,
                            **({"atol": atol} if atol else {}))
        else:
            tol = Tolerance(name, start, end, dtype, "allclose", atol=atol, rtol=rtol)
        new.append(tol)
        notes.append(f"region {name}: {int(differ.size)} byte(s) vary over {len(runs)} ref "
                     f"runs; {tol.describe()}")
    touched = {t.region for t in new}
    tols = tuple(t for t in policy.tolerances if t.region not in touched) + tuple(new)
    mutations = policy.mutations
    if not mutations:
        inputs = [n for n in pre if hints.get(n) in FLOAT_DTYPES
                  and all(r[n] == pre[n] for r in runs)]
        mutations = tuple(Mutation(n, hints[n], "permute", 2) for n in inputs)
        if inputs:
            notes.append("mutations: permute " + ", ".join(inputs) + " (float regions ref "
                         "only reads) in 2 differential runs")
    note = policy.note or "written by kpair policy suggest from the spread of repeated ref runs"
    return Policy(tols, note, mutations, policy.max_bias), notes


def synthetic_runs(seed: int, runs: int):
    """Runs of several regions: float32 noise with NaN, inf and zeros, a float16 region, an
    untyped one, a one-element one, a read-only input and one that never varies."""
    rng = np.random.default_rng(seed)
    base32 = rng.standard_normal(64).astype(np.float32)
    base32[[3, 9]] = np.nan
    base32[5] = np.inf
    base32[7] = 0.0
    base16 = rng.standard_normal(33).astype(np.float16)
    raw = rng.integers(0, 255, 40, dtype=np.uint8)
    pre = {"x": rng.standard_normal(16).astype(np.float32).tobytes(),
           "a": base32.tobytes(), "h": base16.tobytes(), "u": raw.tobytes(),
           "s": np.float64(2.5).tobytes(), "z": bytes(24)}
    out = []
    for _ in range(runs):
        a = base32.copy()
        idx = rng.integers(0, 64, 6)
        a[idx] += rng.standard_normal(6).astype(np.float32) * 1e-5
        if rng.random() < 0.3:
            a[11] = np.nan
        h = base16.copy()
        h[rng.integers(0, 33)] += np.float16(0.01)
        u = raw.copy()
        u[rng.integers(0, 40)] ^= 1
        s = np.float64(2.5 + rng.standard_normal() * 1e-9)
        out.append({"x": pre["x"], "a": a.tobytes(), "h": h.tobytes(), "u": u.tobytes(),
                    "s": s.tobytes(), "z": bytes(24)})
    return out, pre


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_running_reduction_equals_the_suggestion_from_every_run_held(seed):
    runs, pre = synthetic_runs(seed, 12)
    hints = {"x": "float32", "a": "float32", "h": "float16", "s": "float64", "z": "float32"}
    for policy in (Policy.byte_exact(), Policy((), "mine", ())):
        old, old_notes = old_suggest_policy(policy, runs, hints=hints, pre=pre, margin=3.0)
        new, new_notes = suggest_policy(policy, Spread.of(runs, hints=hints, pre=pre),
                                        margin=3.0)
        assert new.to_json() == old.to_json()
        assert new_notes == old_notes
    assert any(t.criterion == "scalar_rtol" for t in new.tolerances)  # "s" is one element


def test_spread_holds_one_run_whatever_the_run_count():
    """Memory of the reduction after 8 and after 80 runs of a 1 MiB region: the same."""
    rng = np.random.default_rng(0)
    base = rng.standard_normal(256 * 1024).astype(np.float32)
    pre = {"a": base.tobytes()}

    def peak(runs: int) -> int:
        tracemalloc.start()
        spread = Spread({"a": "float32"}, pre)
        for i in range(runs):
            a = base.copy()
            a[i % 1000] += 1e-3
            spread.add({"a": a.tobytes()})
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        assert spread.runs == runs
        return held

    small, large = peak(8), peak(80)
    assert large - small < 256 * 1024, (small, large)   # one run's region is 1 MiB


def test_policy_suggest_on_a_real_noisy_ref_equals_the_old_path(lab, tmp_path):
    """ref runs of a nondeterministic host kernel, reduced as they come, give the policy the
    old code gave from the same runs held in a list."""
    from kpair.backends import open_device
    from kpair.harness import ref_spread
    from kpair.replay import Replay

    h = create_harness(lab / "noisy", tmp_path / "H", opt=lab / "k.so",
                       opt_kernel="kp_copy")
    spread, current = ref_spread(h.root, 6)
    assert spread.runs == 6 and spread.regions["y"].mask is not None
    hints = {r.name: r.dtype for r in h.snapshot.manifest.regions if r.dtype}
    # The same kernel in a fresh executor repeats the same sequence of answers.
    with open_device("host") as dev:
        replay = Replay(dev, h.snapshot)
        ref = dev.load(h.binary(h.ref), h.ref.kernel, fmt=h.ref.format)
        runs = [replay.run(ref) for _ in range(6)]
        pre = dict(replay.pre)
    old, _ = old_suggest_policy(current, runs, hints=hints, pre=pre)
    new, notes = suggest_policy(current, spread)
    assert new.to_json() == old.to_json()
    assert any(t.region == "y" for t in new.tolerances), notes


def test_reproduce_reduces_runs_and_still_tells_nondeterminism(lab):
    from kpair.backends import open_device
    from kpair.replay import reproduce
    from kpair.snapshot import Snapshot

    with open_device("host") as dev:
        rep = reproduce(dev, Snapshot.open(lab / "noisy"), 5)
    assert rep.status == "nondeterministic" and rep.unstable_regions == ["y"]


# ---------------------------------------------------------------------- 3: the report


@pytest.fixture(scope="module")
def tampered(lab, tmp_path_factory) -> Path:
    """A one-operator host release whose published opt.so was tampered with, then verified."""
    d = tmp_path_factory.mktemp("tampered")
    create_harness(lab / "snap", d / "H", opt=lab / "k.so", opt_kernel="kp_copy_fast")
    create_harness(lab / "snap", d / "H2", opt=lab / "k.so", opt_kernel="kp_copy")
    expect_ok = kpair("release", "add", "REL", "H", "--level", "1", "--name", "copy",
                      "--allow-slower", *QUICK, cwd=d)
    assert expect_ok.returncode == 0, expect_ok.stderr
    ok = kpair("release", "add", "REL", "H2", "--level", "1", "--name", "same",
               "--allow-slower", *QUICK, cwd=d)
    assert ok.returncode == 0, ok.stderr
    so = d / "REL" / "level1" / "copy" / "harness" / "opt.so"
    data = bytearray(so.read_bytes())
    data[200] ^= 0xFF
    so.write_bytes(bytes(data))
    proc = kpair("verify", "REL", *QUICK, cwd=d)
    assert proc.returncode == 5, proc.stderr
    return d


def test_the_report_shows_a_tampered_operator_failed_everywhere(tampered):
    from kpair.release import load_index
    from kpair.report import render_html, render_markdown

    index = load_index(tampered / "REL")
    same = next(r for r in index.operators if r.name == "same")
    md, page = render_markdown(index), render_html(index)
    head = md.split("## Operators")[0]
    assert "FAILED VERIFICATION" in head and "level1/copy" in head
    assert "does not match its sha256" in head
    # geomean over the one operator left: exactly its speedup
    assert f"{same.harness.speedup:.4f}x over 1 passing" in head
    assert "1 pass" in head
    row = next(line for line in md.splitlines() if line.startswith("| 1 | copy |"))
    assert "failed kpair verify 1" in row and "withdrawn" in row and "| pass |" not in row
    excluded = md.split("## Excluded")[1]
    assert "copy" in excluded and "kpair verify 1: error" in excluded
    assert "FAILED VERIFICATION" in page
    assert '<td class="error">failed kpair verify 1' in page
    assert "over 1 passing operators" in page


def test_report_cli_writes_it_and_the_summary_leaves_it_out(tampered, tmp_path):
    from kpair.release import load_index, summarize

    index = load_index(tampered / "REL")
    before = state(tampered / "REL" / "index.json")
    proc = kpair("report", tampered / "REL", "-o", tmp_path / "out", "--markdown-only",
                 cwd=tampered)
    assert proc.returncode == 0, proc.stderr
    assert "FAILED VERIFICATION" in (tmp_path / "out" / "report.md").read_text()
    assert index.summary.harness_geomean_over == 1   # as kpair verify wrote index.json
    s = summarize(index.operators, index.refused)
    assert s == index.summary
    assert s.harness_geomean_over == 1 and s.counts.passed == 1 and s.counts.error == 1
    assert [(e.name, e.where) for e in s.excluded] == [("copy",
                                                       "published, fails verification")]
    assert state(tampered / "REL" / "index.json") == before


def test_a_later_passing_verification_brings_it_back(tampered):
    """Only the last verification counts: a harness restored and re-verified passes again."""
    from fake_release import fake_row
    from kpair.release import load_index, summarize
    from kpair.release.index import failed_verification

    index = load_index(tampered / "REL")
    copy = next(r for r in index.operators if r.name == "copy")
    failed = failed_verification(copy)
    assert failed is not None and failed.verdict == "error"
    again = copy.replace(verifications=[*copy.verifications, failed.replace(
        run=2, verdict="pass", reason=None, outcome="reproduced")])
    assert failed_verification(again) is None
    assert summarize([again], []).harness_geomean_over == 1
    other = fake_row(1, "other", 1.5).replace(verifications=[failed.replace(
        same_operator=False, outcome="different operator")])
    assert failed_verification(other) is None


# ---------------------------------------------------------------------- 5: a full disk


@pytest.fixture
def full_disk(tmp_path):
    """A 16 KiB tmpfs (root only): a disk that fills."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs",
                                            str(mnt)], capture_output=True).returncode:
        pytest.skip("mounting a small tmpfs needs root")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_pair_onto_a_full_disk_is_one_line_and_leaves_nothing(lab, full_disk):
    before = state(lab / "snap")
    with pytest.raises(WriteFailed) as e:
        create_harness(lab / "snap", full_disk / "H", opt=lab / "k.so")
    one_line(e.value, "no space left on device writing", str(full_disk / "H"))
    assert e.value.exit_code == 5
    assert list(full_disk.iterdir()) == [] and state(lab / "snap") == before


def test_pair_cli_onto_a_full_disk_exits_5(lab, full_disk):
    proc = kpair("pair", "snap", "--opt", "k.so", "-o", full_disk / "H", cwd=lab)
    expect(proc, 5, "no space left on device")
    assert list(full_disk.iterdir()) == []


def test_run_onto_a_full_disk_leaves_no_samples_or_log(lab, full_disk, tmp_path):
    h = create_harness(lab / "snap", tmp_path / "H", opt=lab / "k.so",
                       opt_kernel="kp_copy_fast").root
    before = state(h)
    # Fill it to the last page, so that nothing more fits.
    fd = os.open(full_disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        with pytest.raises(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)
    proc = kpair("run", h, "-o", full_disk / "r.json", *QUICK, cwd=tmp_path)
    expect(proc, 5, "no space left on device", str(full_disk))
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler"]
    assert state(h) == before

