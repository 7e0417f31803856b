"""A KernelBench-style harness of >= 4 GiB of regions, published on one machine as a release
that packs into one small file, and re-verified from that file alone on another (issue 48).

    python benchmarks/big_release.py publish -o OUTDIR [--backend cuda|host] [--gib 4]
        [--deadline S] [--time-cap S] [--replicates N] [--work DIR] [--seed N]
    python benchmarks/big_release.py verify RELEASE_TAR -o OUTDIR [--deadline S]
        [--time-cap S] [--replicates N]

The problem (KernelBench Level 2 style, written here, no KernelBench file needed):
``y = hardtanh(x * scale + bias).sum(dim=1)`` over ``x`` of ``--gib`` GiB (rows x ``--cols``
float32), ``scale`` and ``bias`` one value per column. On ``cuda`` it is a PyTorch module:
``x`` from ``torch.randn`` under ``--seed``, ``scale`` and ``bias`` from ``nn.init.uniform_``
(the module's initialisers), all made on the GPU, so ``kpair capture`` stores them as the
kernels that made them (regenerable regions) and not as their bytes. On ``host`` the same
forward is a few C functions built here, its inputs filled by a seeded generator in the
Recorder's setup calls (so they regenerate too), at a small size (8 MiB by default).

``publish`` runs, each step timed and bounded by ``--deadline``:

1. capture: the eager forward (ref: multiply, add, hardtanh, row sum; two whole-size
   intermediates as scratch) and the ``torch.compile`` forward (one fused reduction) of the
   same module on the same tensors, as two ranges of one process (``kpair capture --range
   eager --range compiled``; on host, two ``kpair.record.Recorder`` ranges over the same
   arrays, the candidate one fused C function summing in eight lanes). Refused (exit 1) when
   the eager range's regions are under ``--gib``, or when what it stores is already over
   the packed release's limit (a region stored as bytes, not as a chain).
2. pair: ``kpair pair EAGER --opt-capture COMPILED --policy P``, P declared here: ``allclose``
   with KernelBench's own tolerance (atol = rtol = 1e-2) on the forward's output, byte-exact
   everywhere else; the differential run resamples the first ``--mutate-mib`` (64) of ``x``.
   The harness is packed once on its own: over the limit, it is refused before any run.
3. run: ``kpair run`` of the harness (its verdict, speedup and re-run interval), given at
   most half the time left: cut off, it is recorded as timed out and the publish goes on.
4. publish: ``kpair release add`` (a fresh judged run; published only on a pass whose
   interval lies above 1.0), then ``kpair report --markdown-only``.
5. pack: the release directory into one tar, ``OUTDIR/release.tar.zst`` (zstd; ``--tar
   PATH`` names another, a plain tar unless it ends in ``.zst``), written through a temporary
   file and a rename, refused (exit 1, no file left) past ``--max-tar-mib`` (16).

It prints one JSON document (also ``OUTDIR/publish.json``): region bytes, stored bytes (the
published harness's blob files), release bytes on disk, the tar's bytes, seconds of each
step, the run's and the publication's speedup and interval. A step whose output is already in
``--work`` (default ``OUTDIR/work``) is not run again, so a call cut off by its deadline
resumes. ``--work-tar FILE`` packs that folder at the end, finished or not (small: the
regions are chains), and ``--resume FILE`` starts from it on a machine started afresh.

``verify`` unpacks the tar into a fresh directory (the machine "started afresh": nothing of
the publish travels but the tar) and runs ``kpair verify`` there; its JSON (also
``OUTDIR/verify.json``, beside the re-verified ``index.json``) says per operator whether the
re-run's speedup lies inside the published interval, the re-run's speedup and interval, and
the wall time. Exit status: publish 0 published and packed, 1 refused (regions too small,
release add refused, over the packed limit), 2 usage (an existing tar without ``--force``),
5 a step failed or the deadline passed (a failing kpair step's own code where it is 2, 3 or
4); verify as ``kpair verify`` (0 every operator passes, 1 some fail, 5 some could not be
run), 3 a missing tar or one that is no packed release.

On GPUs, two device calls through ``benchmarks/gpu_call.sh`` (the packed files must come
back as files of their own: that script keeps only ``back.tgz`` unless it spares them), the
second on a machine started afresh that gets nothing but the tar::

    'publish:560:python3 benchmarks/big_release.py publish -o $OUT/big
        --tar $OUT/release.tar.zst --work-tar $OUT/work.tar.zst --deadline 520'
    'verify:560:python3 benchmarks/big_release.py verify RELEASE.tar.zst -o $OUT/verify
        --time-cap 10 --deadline 520'

A publish cut off by its deadline goes on in another call with ``--resume WORK.tar.zst``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = "kpair.big-release"
GIB = 1 << 30
MIB = 1 << 20
TAR = "release.tar.zst"
#: The zstd frame's first four bytes: a packed release is read as .tar.zst when it has them.
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
LEVEL, NAME = 2, "ScaleBiasHardtanhSum"
#: KernelBench's own tolerance on the forward's output.
ATOL = RTOL = 1e-2
#: Columns per backend: the output (one float per row) stays small beside the input.
COLS = {"cuda": 8192, "host": 1024}
GIB_DEFAULT = {"cuda": 4.0, "host": 1 / 128}
TIME_CAP = {"cuda": 10.0, "host": 1.0}


class Stop(Exception):
    """The publish or verify ends here: ``code`` its exit status, ``message`` one line."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code, self.message = code, message


# --------------------------------------------------------------------------- the program

#: The host forward (C, built with -ffp-contract=off): seeded inputs, the eager-like sequence
#: and the fused candidate, which sums each row in eight lanes (so it rounds differently).
HOST_SOURCE = r"""
#include <stdint.h>

static uint64_t splitmix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* a[i] uniform in [lo, hi): a pure function of (seed, i) */
void bk_uniform(float *a, int64_t n, uint64_t seed, float lo, float hi) {
    for (int64_t i = 0; i < n; i++)
        a[i] = lo + (hi - lo) * ((float)(splitmix64(seed + (uint64_t)i) >> 40)
                                 * (1.0f / 16777216.0f));
}

void bk_mul_cols(float *out, const float *x, const float *s, int32_t rows, int32_t cols) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) out[r * cols + c] = x[r * cols + c] * s[c];
}

void bk_add_cols(float *out, const float *x, const float *b, int32_t rows, int32_t cols) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) out[r * cols + c] = x[r * cols + c] + b[c];
}

void bk_hardtanh(float *out, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = x[i] < -1.0f ? -1.0f : x[i] > 1.0f ? 1.0f : x[i];
}

void bk_rowsum(float *out, const float *x, int32_t rows, int32_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        float s = 0.0f;
        for (int64_t c = 0; c < cols; c++) s += x[r * cols + c];
        out[r] = s;
    }
}

void bk_fused(float *out, const float *x, const float *s, const float *b, int32_t rows,
              int32_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * cols;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t c = 0;
        for (; c + 8 <= cols; c += 8)
            for (int k = 0; k < 8; k++) {
                float v = row[c + k] * s[c + k] + b[c + k];
                acc[k] += v < -1.0f ? -1.0f : v > 1.0f ? 1.0f : v;
            }
        float t = 0.0f;
        for (int k = 0; k < 8; k++) t += acc[k];
        for (; c < cols; c++) {
            float v = row[c] * s[c] + b[c];
            t += v < -1.0f ? -1.0f : v > 1.0f ? 1.0f : v;
        }
        out[r] = t;
    }
}
"""

#: The CUDA program ``kpair capture`` runs (``program`` below): the module and its input made
#: on the GPU under the seed, both forwards run once uncaptured (compile, autotune), then each
#: once inside its ``kpair.mark`` range with its output declared.
def program(rows: int, cols: int, seed: int, stats: Path) -> int:
    import torch
    import torch.nn.functional as F
    from torch import nn

    import kpair

    class Model(nn.Module):
        """KernelBench Level 2 style: x * scale + bias, Hardtanh, sum over the last dim."""

        def __init__(self, features: int):
            super().__init__()
            self.scale = nn.Parameter(torch.empty(features))
            self.bias = nn.Parameter(torch.empty(features))
            nn.init.uniform_(self.scale, 0.5, 1.5)
            nn.init.uniform_(self.bias, -0.5, 0.5)

        def forward(self, x):
            return F.hardtanh(x * self.scale + self.bias).sum(dim=1)

    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = Model(cols)
        x = torch.randn(rows, cols)
    compiled = torch.compile(model)
    t0 = time.monotonic()
    with torch.no_grad():
        for fn in (model, compiled, compiled):
            fn(x)
        torch.cuda.synchronize()
        warm_s = time.monotonic() - t0
        with kpair.mark("eager") as m:
            y = model(x)
            m.outputs(y)
            torch.cuda.synchronize()
        with kpair.mark("compiled") as m:
            y2 = compiled(x)
            m.outputs(y2)
            torch.cuda.synchronize()
        diff = (y - y2).abs().max().item()
    stats.write_text(json.dumps({
        "x_bytes": x.nbytes, "output_bytes": y.nbytes, "rows": rows, "cols": cols,
        "seed": seed, "warm_up_s": round(warm_s, 3), "max_abs_diff": diff,
        "output_std": y.std().item(), "torch": torch.__version__}))
    return 0


def record_host(cap: Path, rows: int, cols: int, seed: int) -> dict:
    """The host forward recorded as two ranges over the same arrays: ``cap/eager`` and
    ``cap/compiled`` (their directories, as ``kpair capture`` names them)."""
    import numpy as np

    from kpair.record import Recorder
    from kpair.toolchain import compile_shared

    cap.mkdir(parents=True, exist_ok=True)
    (cap / "program.c").write_text(HOST_SOURCE)
    lib = compile_shared(cap / "program.c", cap / "program.so",
                         flags=("-O2", "-g", "-ffp-contract=off"))
    x = np.zeros((rows, cols), np.float32)
    scale, bias = np.zeros(cols, np.float32), np.zeros(cols, np.float32)
    t1, t2 = np.zeros_like(x), np.zeros_like(x)
    y, y2 = np.zeros(rows, np.float32), np.zeros(rows, np.float32)
    R, C = np.int32(rows), np.int32(cols)

    def setup(r: Recorder) -> None:
        # Every input starts zeroed, so the setup calls are what write it (its chain).
        for a in (x, scale, bias):
            a[...] = 0
        r.call(lib, "bk_uniform", [x, np.int64(x.size), np.uint64(seed), np.float32(-2.0),
                                   np.float32(2.0)])
        r.call(lib, "bk_uniform", [scale, np.int64(cols), np.uint64(seed + 1),
                                   np.float32(0.5), np.float32(1.5)])
        r.call(lib, "bk_uniform", [bias, np.int64(cols), np.uint64(seed + 2),
                                   np.float32(-0.5), np.float32(0.5)])

    inputs = {"x": x, "scale": scale, "bias": bias}
    with Recorder(cap / "eager", names={**inputs, "y": y, "t1": t1, "t2": t2},
                  outputs=[y], scratch=[t1, t2]) as r:
        setup(r)
        with r.range("eager"):
            r.call(lib, "bk_mul_cols", [t1, x, scale, R, C])
            r.call(lib, "bk_add_cols", [t2, t1, bias, R, C])
            r.call(lib, "bk_hardtanh", [t1, t2, np.int64(x.size)])
            r.call(lib, "bk_rowsum", [y, t1, R, C])
    with Recorder(cap / "compiled", names={**inputs, "y": y2}, outputs=[y2]) as r:
        setup(r)
        with r.range("compiled"):
            r.call(lib, "bk_fused", [y2, x, scale, bias, R, C])
    return {"x_bytes": x.nbytes, "output_bytes": y.nbytes, "rows": rows, "cols": cols,
            "seed": seed, "max_abs_diff": float(np.abs(y - y2).max()),
            "output_std": float(y.std())}


# --------------------------------------------------------------------------- helpers

def _kpair(*args: str, timeout: float) -> dict:
    """``kpair ARGS`` with its exit code, stdout, stderr's tail and seconds (never raises)."""
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-m", "kpair", *args], capture_output=True,
                           text=True, timeout=max(1.0, timeout))
        code, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        code, err = 124, f"timed out after {timeout:.0f} s"
    return {"exit_code": code, "stdout": out, "stderr": err[-3000:],
            "s": round(time.monotonic() - t0, 3)}


def _doc(run: dict) -> dict:
    try:
        doc = json.loads(run["stdout"])
    except (TypeError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _why(run: dict) -> str:
    """A failed kpair step's one-line reason: its JSON error, else stderr's last line."""
    err = _doc(run).get("error")
    if isinstance(err, dict):
        err = err.get("message")
    lines = [s for s in run["stderr"].strip().splitlines() if s.strip()]
    return str(err or (lines[-1] if lines else f"exit {run['exit_code']}"))[:600]


def _write_json(doc: dict, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


def _tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()
               and p.name != ".kpair-release.lock")


def _stop(e: Exception, doc: dict) -> Stop:
    """``e`` as a Stop: itself, or exit 5 with its one-line message (its traceback in
    ``doc``, where the JSON keeps it)."""
    if isinstance(e, Stop):
        return e
    import traceback

    doc["traceback"] = traceback.format_exc()[-3000:]
    return Stop(5, (f"{type(e).__name__}: {e}".splitlines() or [""])[0][:600])


def _largest(root: Path, n: int = 8) -> list[list]:
    """The ``n`` largest files under ``root``: [relative path, bytes]."""
    files = [(p.stat().st_size, str(p.relative_to(root))) for p in root.rglob("*")
             if p.is_file()]
    return [[name, size] for size, name in sorted(files, reverse=True)[:n]]


def _device_line(backend: str) -> str:
    if backend == "cuda":
        try:
            return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,uuid",
                                   "--format=csv,noheader"], capture_output=True, text=True,
                                  timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return "cuda (nvidia-smi unavailable)"
    import platform
    return f"host {platform.machine()} ({os.cpu_count()} CPUs)"


def _tree() -> str | None:
    try:
        p = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                           capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() or None


def _speed(result: dict | None) -> dict:
    """Verdict, speedup, reported interval and slot bias of a result.json or index row."""
    if not result:
        return {}
    speed = result.get("speed") or result.get("harness") or {}
    correctness = result.get("correctness")
    label = correctness.get("summary") or correctness.get("mode") \
        if isinstance(correctness, dict) else correctness
    return {"status": result.get("status"), "correctness": label,
            "speedup": speed.get("speedup"),
            "ci95": speed.get("combined_ci95") or speed.get("ci95"),
            "slot_bias": speed.get("slot_bias"), "blocks": speed.get("blocks")}


def pack(release: Path, out: Path, limit: int, root: str = "release") -> int:
    """``release`` (a directory) as one tar at ``out`` (zstd-compressed when its name ends
    in ``.zst``), its files under ``root/``, written through a temporary file in ``out``'s
    folder and one rename: ``out`` is either the whole file or as it was. Refused (Stop 1,
    the temporary removed, ``out`` untouched) when it would exceed ``limit`` bytes. Returns
    its size."""
    import zstandard

    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            sink = f
            if out.name.endswith(".zst"):   # level 12 on every core: ~20 MB/s, level 19 ~1.5
                sink = zstandard.ZstdCompressor(level=12, threads=-1).stream_writer(
                    f, closefd=False)
            with tarfile.open(fileobj=sink, mode="w|") as tar:
                for path in sorted(release.rglob("*")):
                    if path.name == ".kpair-release.lock" or not (path.is_file()
                                                                   or path.is_dir()):
                        continue
                    tar.add(path, arcname=f"{root}/{path.relative_to(release)}",
                            recursive=False)
            if sink is not f:
                sink.close()
        size = tmp.stat().st_size
        if size > limit:
            raise Stop(1, f"the packed {root} is {size} bytes ({size / MIB:.2f} MiB), over "
                          f"the limit of {limit} bytes ({limit / MIB:.2f} MiB): not written")
        os.replace(tmp, out)
        return size
    finally:
        tmp.unlink(missing_ok=True)


def unpack(tar_path: Path, into: Path, root: str = "release",
           marker: str = "index.json") -> Path:
    """Extract ``tar_path`` (a tar, or a zstd-compressed one) into the new directory ``into``
    (files and folders only, nothing outside it); the folder ``root`` inside, which must
    hold ``marker``."""
    import zstandard

    into.mkdir(parents=True)
    plain = into / f".{root}.tar"
    try:
        with open(tar_path, "rb") as f:
            zstd = f.read(4) == ZSTD_MAGIC
        if zstd:
            with open(tar_path, "rb") as f, open(plain, "wb") as g:
                zstandard.ZstdDecompressor().copy_stream(f, g)
        with tarfile.open(plain if zstd else tar_path) as tar:
            members = tar.getmembers()
            bad = [m.name for m in members if not (m.isfile() or m.isdir())]
            if bad:
                raise Stop(3, f"{tar_path}: not a packed {root}: {bad[0]!r} is neither a "
                              "file nor a folder")
            tar.extractall(into, filter="data")
    except (tarfile.TarError, OSError, EOFError, zstandard.ZstdError) as e:
        raise Stop(3, f"{tar_path}: cannot unpack the {root}: {e}") from e
    finally:
        plain.unlink(missing_ok=True)
    folder = into / root
    if not (folder / marker).is_file():
        raise Stop(3, f"{tar_path}: no {root}/{marker} inside: not a packed {root}")
    return folder


# --------------------------------------------------------------------------- publish

class Publish:
    """One publish: its steps, the JSON document they fill, the deadline they share."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.backend = args, args.backend
        self.out = Path(args.out)
        self.work = Path(args.work) if args.work else self.out / "work"
        self.deadline = time.monotonic() + args.deadline
        self.gib = args.gib if args.gib is not None else GIB_DEFAULT[self.backend]
        self.cols = args.cols or COLS[self.backend]
        self.rows = args.rows or max(1, -(-int(self.gib * GIB) // (4 * self.cols)))
        self.time_cap = args.time_cap if args.time_cap is not None else TIME_CAP[self.backend]
        self.doc: dict = {
            "schema": SCHEMA, "verb": "publish", "backend": self.backend,
            "device": _device_line(self.backend), "tree": _tree(),
            "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "problem": {"forward": "hardtanh(x * scale + bias).sum(dim=1)",
                        "rows": self.rows, "cols": self.cols, "requested_gib": self.gib,
                        "seed": args.seed},
            "operator": f"level{LEVEL}/{NAME}", "seconds": {}, "resumed": [],
            "status": "running"}

    def remaining(self, step: str, least: float = 5.0) -> float:
        left = self.deadline - time.monotonic()
        if left < least:
            raise Stop(5, f"the deadline ({self.args.deadline:.0f} s) passed before {step} "
                          f"({left:.0f} s left); run publish again with the same -o to resume")
        return left

    def step(self, name: str, run: dict) -> dict:
        self.doc["seconds"][name] = run["s"]
        if run["exit_code"] != 0:
            self.doc["failed_step"] = {"step": name, "exit_code": run["exit_code"],
                                       "stderr": run["stderr"][-1500:]}
            # 1 from a step is a crash here (the captured program's own status), not a
            # verdict: only kpair's input and backend codes pass through.
            code = run["exit_code"] if run["exit_code"] in (2, 3, 4) else 5
            raise Stop(code, f"{name} failed (exit {run['exit_code']}): {_why(run)}")
        return run

    def run_options(self) -> list[str]:
        extra = ["--time-cap", str(self.time_cap)]
        if self.args.replicates:
            extra += ["--replicates", str(self.args.replicates)]
        return extra

    # -- the steps

    def capture(self) -> tuple[Path, Path]:
        cap = self.work / "cap"
        done = cap / "done.json"
        if done.is_file():
            self.doc["resumed"].append("capture")
            info = json.loads(done.read_text())
        else:
            shutil.rmtree(cap, ignore_errors=True)
            cap.mkdir(parents=True)
            t0 = time.monotonic()
            if self.backend == "host":
                self.remaining("capture")
                stats = record_host(cap, self.rows, self.cols, self.args.seed)
                ranges = {"eager": "eager", "compiled": "compiled"}
                records: list = []
            else:
                stats_path = cap / "program.json"
                # Every region the eager range names counts against --max-region-bytes, its
                # whole-size scratch blocks (two or three) too.
                limit = int(5 * self.gib * GIB) + GIB
                run = self.step("capture", _kpair(
                    "capture", "--range", "eager", "--range", "compiled",
                    "--max-region-bytes", str(limit), "-o", str(cap / "out"), "-q", "--",
                    sys.executable, str(Path(__file__).resolve()), "program",
                    "--rows", str(self.rows), "--cols", str(self.cols),
                    "--seed", str(self.args.seed), "--stats", str(stats_path),
                    timeout=self.remaining("capture")))
                self.doc["capture_stderr"] = run["stderr"][-1500:]
                summary = json.loads((cap / "out" / "capture.json").read_text())
                records = summary.get("ranges") or []
                bad = [r for r in records if r.get("status") != "captured"]
                if bad or len(records) != 2:
                    raise Stop(5, "capture: ranges not captured: " + "; ".join(
                        f"{r.get('name')}: {r.get('status')} ({r.get('reason')})"
                        for r in bad) if bad else f"capture: {len(records)} range(s), not 2")
                ranges = {r["name"]: f"out/{r['snapshot']}" for r in records}
                stats = json.loads(stats_path.read_text()) if stats_path.is_file() else {}
            info = {"ranges": ranges, "program": stats, "s": round(time.monotonic() - t0, 3),
                    "records": [{k: r.get(k) for k in (
                        "name", "ops", "kernels", "memsets", "copies", "roles",
                        "region_bytes", "scratch_bytes", "state_bytes", "stored_bytes",
                        "regenerated", "capture_s", "notes") if k in r} for r in records]}
            _write_json(info, done)
        self.doc["seconds"]["capture"] = info["s"]
        self.doc["program"] = info["program"]
        if info["records"]:
            self.doc["capture_ranges"] = info["records"]
        eager, compiled = (cap / info["ranges"][n] for n in ("eager", "compiled"))
        self.doc["region_bytes"] = self.regions(eager)
        want = int(self.gib * GIB)
        if self.doc["region_bytes"] < want:
            raise Stop(1, f"the eager range's regions are {self.doc['region_bytes']} bytes, "
                          f"under the requested {self.gib:g} GiB ({want} bytes): not published")
        limit = int(self.args.max_tar_mib * MIB)
        if self.doc["snapshot_stored_bytes"] > limit:   # no run can make it fit: stop now
            big = [f"{r['name']} ({r['bytes']} bytes)" for r in self.doc["regions"]
                   if r["made_by"] is None and r["bytes"] > MIB]
            raise Stop(1, f"the eager range stores {self.doc['snapshot_stored_bytes']} bytes, "
                          f"over the packed release's limit ({limit} bytes) before anything "
                          "else is added; stored as bytes, not as chains: "
                          + (", ".join(big) or "no region over 1 MiB (its code objects)"))
        return eager, compiled

    def regions(self, snapshot: Path) -> int:
        from kpair.snapshot import Snapshot

        snap = Snapshot.open(snapshot)
        m = snap.manifest
        self.doc["regions"] = [
            {"name": r.name, "bytes": r.size, "role": r.role,
             "made_by": [op.label[:80] for op in r.regen.ops] if r.regen is not None else None}
            for r in m.regions]
        self.doc["scratch_bytes"] = sum(s.size for s in m.scratch_regions)
        self.doc["regenerable_bytes"] = snap.regenerable_bytes()
        self.doc["snapshot_stored_bytes"] = snap.stored_bytes()
        return snap.region_bytes()

    def policy(self, eager: Path) -> Path:
        manifest = json.loads((eager / "snapshot.json").read_text())
        tolerances = [{"region": r["name"], "range": [0, r["size"]], "dtype": "float32",
                       "criterion": "allclose", "atol": ATOL, "rtol": RTOL}
                      for r in manifest["regions"]
                      if r.get("role") == "out" and r["size"] % 4 == 0]
        if not tolerances:
            raise Stop(5, f"{eager}: the eager range has no declared output to judge")
        note = (f"KernelBench's own tolerance (atol={ATOL}, rtol={RTOL}) on the forward's "
                "output; every other byte exact.")
        policy = {"schema": "kpair.validation_policy", "schema_version": 1,
                  "default": "byte-exact", "tolerances": tolerances}
        mutate = int(self.args.mutate_mib * MIB)
        inputs = [r for r in manifest["regions"] if r.get("role") == "in"]
        if mutate and inputs:
            # The differential run resamples the first --mutate-mib of the largest input (x)
            # instead of all of it: a host-side resample of 4 GiB costs about a minute per
            # run. kpair adds its derived whole-region mutations of every other input.
            x = max(inputs, key=lambda r: r["size"])
            end = min(x["size"], mutate) // 4 * 4
            policy["mutations"] = [{"region": x["name"], "dtype": "float32",
                                    "method": "resample", "count": 1, "range": [0, end]}]
            if end < x["size"]:
                note += (f" The differential run resamples {x['name']}[0:{end}) (the first "
                         f"{end / MIB:g} MiB of {x['size'] / MIB:g} MiB), not all of it; the "
                         "timed blocks' fresh inputs change the same range.")
        policy["note"] = note
        path = self.work / "policy.json"
        _write_json(policy, path)
        self.doc["policy"] = policy
        return path

    def pair(self, eager: Path, compiled: Path) -> Path:
        harness = self.work / "harness"
        policy = self.policy(eager)
        if (harness / "harness.json").is_file():
            self.doc["resumed"].append("pair")
            return harness
        shutil.rmtree(harness, ignore_errors=True)
        run = self.step("pair", _kpair(
            "pair", str(eager), "--opt-capture", str(compiled), "--policy", str(policy),
            "-o", str(harness), "--json", "-q", timeout=self.remaining("pair")))
        doc = _doc(run)
        self.doc["pair"] = {k: doc.get(k) for k in ("range_ops", "plan_launches", "policy")}
        return harness

    def probe(self, harness: Path) -> None:
        """Pack the harness alone before any run: what is published holds it, so a harness
        over the limit is refused before minutes of runs are spent on it."""
        probe = self.work / "harness-probe.tar.zst"
        t0 = time.monotonic()
        try:
            self.doc["harness_packed_bytes"] = pack(harness, probe,
                                                    int(self.args.max_tar_mib * MIB),
                                                    root="harness")
        except Stop as e:
            self.doc["largest_files"] = _largest(harness)
            raise Stop(1, f"{e.message} (the harness alone, before any run)") from None
        finally:
            probe.unlink(missing_ok=True)
            self.doc["seconds"]["probe"] = round(time.monotonic() - t0, 3)

    def run(self, harness: Path) -> None:
        out = self.work / "run.json"
        if out.is_file():
            self.doc["resumed"].append("run")
        else:
            # At most half of what is left: the publication (release add judges the harness
            # again) must not lose its time to this run.
            left = self.remaining("run")
            run = _kpair("run", str(harness), "-o", str(self.work / ".run.json"), "--force",
                         "--json", "-q", *self.run_options(), timeout=max(60.0, left / 2))
            self.doc["seconds"]["run"] = run["s"]
            if run["exit_code"] == 124:
                self.doc["run"] = {"status": "timed out", "s": run["s"]}
                return
            if run["exit_code"] not in (0, 1):   # a fail verdict is a result, not a crash
                self.step("run", run)
            os.replace(self.work / ".run.json", out)
        result = json.loads(out.read_text())
        self.doc["run"] = {**_speed(result), "stage_s": result.get("stage_s"),
                           "wall_s": result.get("wall_s")}

    def publish(self, harness: Path) -> Path:
        from kpair.release import load_index

        release = self.work / "release"
        key = f"level{LEVEL}/{NAME}"
        rows = {f"level{r.level}/{r.name}": r for r in load_index(release).operators} \
            if (release / "index.json").is_file() else {}
        if key in rows:
            self.doc["resumed"].append("publish")
        else:
            run = _kpair("release", "add", str(release), str(harness), "--level", str(LEVEL),
                         "--name", NAME, "--json", "-q", *self.run_options(),
                         timeout=self.remaining("publish"))
            self.doc["seconds"]["publish"] = run["s"]
            if run["exit_code"] not in (0, 1):
                self.step("publish", run)
            rows = {f"level{r.level}/{r.name}": r for r in load_index(release).operators}
        row = rows.get(key)
        if row is None:
            excluded = release / "excluded" / f"level{LEVEL}" / NAME / "result.json"
            self.doc["published"] = _speed(json.loads(excluded.read_text())) \
                if excluded.is_file() else None
            raise Stop(1, f"release add refused {key}: see {excluded}")
        self.doc["published"] = {**_speed({"status": row.status,
                                           "correctness": row.correctness.label,
                                           "harness": _row_speed(row)}),
                                 "region_bytes": row.region_bytes,
                                 "stored_bytes": row.stored_bytes}
        self.doc["stored_bytes"] = row.stored_bytes
        report = _kpair("report", str(release), "--markdown-only",
                        timeout=min(120.0, self.remaining("report")))
        self.doc["seconds"]["report"] = report["s"]
        return release

    def main(self) -> int:
        t0 = time.monotonic()
        tar = Path(self.args.tar) if self.args.tar else self.out / TAR
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            self.work.mkdir(parents=True, exist_ok=True)
            if tar.exists() and not self.args.force:
                raise Stop(2, f"{tar} exists: a finished publish (--force to publish again)")
            if self.args.resume:
                self.resume(Path(self.args.resume))
            eager, compiled = self.capture()
            harness = self.pair(eager, compiled)
            self.probe(harness)
            self.run(harness)
            release = self.publish(harness)
            self.doc["release_bytes"] = _tree_bytes(release)
            self.doc["largest_files"] = _largest(release)
            t1 = time.monotonic()
            self.doc["tar_bytes"] = pack(release, tar, int(self.args.max_tar_mib * MIB))
            self.doc["seconds"]["pack"] = round(time.monotonic() - t1, 3)
            self.doc["tar"] = str(tar)
            self.doc["status"] = "published"
            code = 0
        except Exception as e:  # noqa: BLE001 - every failure ends as one line and the JSON
            stop = _stop(e, self.doc)
            self.doc["status"] = "refused" if stop.code == 1 else "error"
            self.doc["error"] = stop.message
            print(f"big_release publish: {stop.message}", file=sys.stderr)
            code = stop.code
        self.doc["wall_s"] = round(time.monotonic() - t0, 3)
        if self.work.is_dir():
            _write_json(self.doc, self.work / "publish.json")
            if self.args.work_tar:
                self.pack_work(Path(self.args.work_tar))
        if self.out.is_dir():
            _write_json(self.doc, self.out / "publish.json")
        print(json.dumps(self.doc, indent=1))
        return code

    def resume(self, work_tar: Path) -> None:
        """Start from the work folder an earlier publish packed (``--work-tar``), on this
        machine or another: its finished steps are not run again."""
        if (self.work / "cap" / "done.json").is_file():
            raise Stop(2, f"--resume: {self.work} already holds a capture; resume from it "
                          "without --resume, or name another --work")
        if not work_tar.is_file():
            raise Stop(3, f"{work_tar}: no such work tar (--resume)")
        landing = Path(tempfile.mkdtemp(prefix=".resume-", dir=self.work.parent))
        try:
            shutil.rmtree(landing)
            got = unpack(work_tar, landing, root="work", marker="cap/done.json")
            shutil.rmtree(self.work)   # nothing finished was in it (checked above)
            os.replace(got, self.work)
        finally:
            shutil.rmtree(landing, ignore_errors=True)
        earlier = self.work / "publish.json"
        if earlier.is_file():
            old = json.loads(earlier.read_text())
            self.doc["earlier"] = {k: old.get(k) for k in ("device", "when", "tree",
                                                           "seconds", "status", "error")}
        self.doc["resumed_from"] = str(work_tar)

    def pack_work(self, path: Path) -> None:
        """The work folder (captures, harness, results, release: no GiB of regions, they
        are chains) as one file a later publish can ``--resume`` from, on another machine."""
        try:
            self.doc["work_tar_bytes"] = pack(self.work, path, int(self.args.max_tar_mib * MIB),
                                              root="work")
            self.doc["work_tar"] = str(path)
        except Stop as e:
            self.doc["work_tar"] = f"not written: {e.message}"


def _row_speed(row) -> dict:
    h = row.harness
    return {"speedup": h.speedup, "ci95": list(h.ci95), "slot_bias": h.slot_bias,
            "blocks": h.blocks} if h else {}


# --------------------------------------------------------------------------- verify

def _stages(release: Path, result: str | None) -> dict:
    """The re-run's seconds per stage and in all, from its result.json (where it was kept)."""
    try:
        doc = json.loads((release / result).read_text()) if result else {}
    except (OSError, ValueError):
        return {}
    return {"stage_s": doc.get("stage_s"), "run_wall_s": doc.get("wall_s")}


def verify(args: argparse.Namespace) -> int:
    from kpair.release import load_index
    from kpair.release.index import latest
    from kpair.release.store import release_backend

    t0 = time.monotonic()
    tar_path, out = Path(args.tar), Path(args.out)
    doc: dict = {"schema": SCHEMA, "verb": "verify", "tar": str(tar_path),
                 "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                 "tree": _tree(), "status": "running"}
    code = 0
    try:
        if not tar_path.is_file():
            raise Stop(3, f"{tar_path}: no such release tar")
        out.mkdir(parents=True, exist_ok=True)
        doc["tar_bytes"] = tar_path.stat().st_size
        fresh = Path(tempfile.mkdtemp(prefix="fresh-", dir=args.fresh_dir or out))
        shutil.rmtree(fresh)   # unpack makes it: a directory nothing was ever in
        release = unpack(tar_path, fresh)
        doc["unpacked_into"] = str(fresh)
        doc["unpack_s"] = round(time.monotonic() - t0, 3)
        backend = release_backend(release)
        if args.backend and args.backend != backend:
            raise Stop(2, f"{tar_path}: a {backend} release, not {args.backend} (--backend)")
        doc["backend"], doc["device"] = backend, _device_line(backend)
        extra = []
        if args.time_cap is not None:
            extra += ["--time-cap", str(args.time_cap)]
        if args.replicates:
            extra += ["--replicates", str(args.replicates)]
        run = _kpair("verify", str(release), "--json", "-q", *extra,
                     timeout=args.deadline - (time.monotonic() - t0))
        doc["verify_s"] = run["s"]
        doc["verify_exit_code"] = run["exit_code"]
        if run["exit_code"] not in (0, 1, 5) or not (release / "index.json").is_file():
            raise Stop(run["exit_code"] if run["exit_code"] in (2, 3, 4) else 5,
                       f"kpair verify failed (exit {run['exit_code']}): {_why(run)}")
        index = load_index(release)
        vrun = index.verifications[-1] if index.verifications else None
        if vrun is None:
            raise Stop(5, f"kpair verify recorded no verification: {_why(run)}")
        operators = []
        for row in index.operators:
            v = latest(row, vrun.run)
            operators.append({
                "key": f"level{row.level}/{row.name}",
                "published_speedup": row.harness.speedup if row.harness else None,
                "published_ci95": list(v.published_ci95) if v and v.published_ci95 else None,
                "verdict": v.verdict if v else None, "outcome": v.outcome if v else None,
                "inside": v.inside if v else None,
                "speedup": v.speedup if v else None,
                "ci95": list(v.ci95) if v and v.ci95 else None,
                "reason": v.reason if v else None,
                "region_bytes": row.region_bytes, "stored_bytes": row.stored_bytes,
                **_stages(release, v.result if v else None)})
        doc["operators"] = operators
        doc["reproduced"], doc["compared"], doc["rate"] = vrun.reproduced, vrun.compared, \
            vrun.rate
        doc["inside"] = sum(bool(o["inside"]) for o in operators)
        shutil.copyfile(release / "index.json", out / "index.json")
        doc["status"] = "verified"
        code = run["exit_code"]
    except Exception as e:  # noqa: BLE001 - every failure ends as one line and the JSON
        stop = _stop(e, doc)
        doc["status"], doc["error"] = "error", stop.message
        print(f"big_release verify: {stop.message}", file=sys.stderr)
        code = stop.code
    doc["wall_s"] = round(time.monotonic() - t0, 3)
    if out.is_dir():
        _write_json(doc, out / "verify.json")
    print(json.dumps(doc, indent=1))
    return code


# --------------------------------------------------------------------------- main

def _number(convert, kind: str, ok, need: str):
    """An argparse ``type``: ``convert(text)`` (else "not KIND"), kept where ``ok`` (else
    "must be NEED")."""
    def parse(text: str):
        try:
            v = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {kind}: {text!r}") from None
        if not ok(v):
            raise argparse.ArgumentTypeError(f"must be {need}, not {text!r}")
        return v
    return parse


_positive = _number(float, "a number", lambda v: 0 < v < float("inf"), "positive and finite")
_count = _number(int, "an integer", lambda v: v >= 1, "1 or more")
_at_least_zero = _number(float, "a number", lambda v: 0 <= v < float("inf"),
                         "0 or more and finite")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="big_release.py", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("publish", help="capture, pair, run, publish and pack the release")
    p.add_argument("-o", "--out", required=True,
                   help=f"output folder ({TAR}, publish.json)")
    p.add_argument("--backend", choices=("cuda", "host"), default="cuda")
    p.add_argument("--gib", type=_positive, help="GiB of x (cuda: 4, host: 1/128)")
    p.add_argument("--cols", type=_count, help="columns of x (cuda 8192, host 1024)")
    p.add_argument("--rows", type=_count,
                   help="rows of x (default: as many as --gib takes; fewer are refused)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deadline", type=_positive, default=540.0,
                   help="seconds for the whole publish (default 540)")
    p.add_argument("--time-cap", type=_positive,
                   help="kpair's --time-cap of the run and of release add (cuda 10, host 1)")
    p.add_argument("--replicates", type=_count, help="kpair's --replicates (default its own)")
    p.add_argument("--max-tar-mib", type=_positive, default=16.0,
                   help="refuse a packed release over this many MiB (default 16)")
    p.add_argument("--mutate-mib", type=_at_least_zero, default=64.0,
                   help="MiB of x the policy's differential run resamples (default 64; 0: "
                   "kpair's derived mutations, every input whole)")
    p.add_argument("--work", help="working folder (default OUTDIR/work; resumed from)")
    p.add_argument("--work-tar", help="also pack the working folder into this file at the "
                   "end, finished or not (a .tar.zst under --max-tar-mib), for --resume")
    p.add_argument("--resume", help="start from a --work-tar an earlier publish wrote (here "
                   "or on another machine): its finished steps are kept")
    p.add_argument("--tar", help=f"the packed release (default OUTDIR/{TAR}; a name not "
                   "ending in .zst: a plain tar)")
    p.add_argument("--force", action="store_true", help="publish again over the packed release")
    v = sub.add_parser("verify", help="unpack a release tar afresh and kpair verify it")
    v.add_argument("tar", help=f"the packed release publish wrote ({TAR} or a plain tar)")
    v.add_argument("-o", "--out", required=True, help="output folder (verify.json)")
    v.add_argument("--backend", choices=("cuda", "host"),
                   help="the backend the release must be of (default: the release's own)")
    v.add_argument("--deadline", type=_positive, default=540.0)
    v.add_argument("--time-cap", type=_positive, help="kpair verify's --time-cap")
    v.add_argument("--replicates", type=_count, help="kpair verify's --replicates")
    v.add_argument("--fresh-dir", help="where the fresh folder is made (default OUTDIR)")
    c = sub.add_parser("program", help="(internal) the CUDA program kpair capture runs")
    c.add_argument("--rows", type=_count, required=True)
    c.add_argument("--cols", type=_count, required=True)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--stats", type=Path, required=True)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.verb == "program":
        return program(args.rows, args.cols, args.seed, args.stats)
    if args.verb == "verify":
        return verify(args)
    if Path(args.out).exists() and not Path(args.out).is_dir():
        print(f"big_release publish: {args.out} is not a folder", file=sys.stderr)
        return 2
    return Publish(args).main()


if __name__ == "__main__":
    sys.exit(main())
