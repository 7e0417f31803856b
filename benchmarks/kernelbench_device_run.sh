#!/bin/bash
# One H200 call of the KernelBench run of issue 23 (benchmarks/kernelbench.py run): resume
# from what earlier calls decided, capture/replay/optimize until DEADLINE seconds, hand back
# the results. Each call starts on a bare machine, so everything the next call needs comes
# back in $OUT and travels again through `carry`.
#
#   bash benchmarks/kernelbench_device_run.sh [DEADLINE_S]     # default 450; timeout_s=600
#
# From the repository root, carry [".kb", ".whl"]:
#   .kb/KernelBench/level1, level2   the problems (git archive of ScalingIntelligence/KernelBench)
#   .kb/COMMIT                       its commit
#   .kb/run/results.jsonl            what earlier calls decided (absent before the first call)
#   .whl/                            wheels of kpair's dependencies the image lacks (zstandard,
#                                    pyelftools, ...; device README), installed when missing
# Back in $OUT: results.jsonl (copy it to .kb/run/results.jsonl for the next call),
# fidelity.json (the table so far), scaling.json, run.log, env.txt, and release.tgz when
# OPTIMIZE is set (the call's release without snapshot blobs and raw samples: the blobs of a
# KernelBench-size harness do not fit what comes back).
# Settings (environment): MODES (default eager,compiled), OPTIMIZE=1, OPTIMIZE_MAX (default
# 1GiB), JOBS (replays at a time, default 4), KB (the .kb folder, default ./.kb: an absolute
# path when a wrapper runs this from another folder), RATES (JSON: planning rates measured by
# earlier calls, `kernelbench.py run --rates`), W (work folder, default /tmp/kbwork).
#
# How many calls (`python benchmarks/kernelbench.py plan --sizes
# benchmarks/results/kernelbench_sizes_cpu.json --deadline 450 [--modes ...] [--optimize]`, by
# the assumed Rates, before any GPU measurement): eager 11, compiled 20, both 31 (~12,300 s of
# work); with OPTIMIZE on operators up to 1 GiB 62, up to 256 MiB 40. Each call also costs a
# machine start (1-2 min of device time). Recompute with --rates from the first calls' batch
# lines in results.jsonl.
set -u
OUT=${OUT:?set OUT to the folder that comes back}
deadline=${1:-450}
W=${W:-/tmp/kbwork}
KB=$(realpath -m "${KB:-.kb}")
export PYTHONUNBUFFERED=1
if ! python3 -c 'import zstandard, msgspec, elftools, pyseccomp' 2>/dev/null; then
  [ -d .whl ] || { echo "kpair's dependencies are missing and no .whl was carried"; exit 2; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 3
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
[ -d "$KB/KernelBench/level1" ] || { echo "no $KB/KernelBench/level1: carry .kb"; exit 2; }
rm -rf "$W" && mkdir -p "$W"
[ -f "$KB/run/results.jsonl" ] && cp "$KB/run/results.jsonl" "$OUT/results.jsonl"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', \
torch.version.cuda, 'triton', triton.__version__)"
  df -h "$W"; nproc; free -g; } > "$OUT/env.txt" 2>&1
opt=()
if [ -n "${OPTIMIZE:-}" ]; then
  opt=(--optimize --optimize-max-bytes "${OPTIMIZE_MAX:-1GiB}" --optimize-timeout 180
       --optimize-arg=--triton-limit=12 --optimize-arg=--keep=2
       --optimize-arg=--prune-max-blocks=12 --optimize-arg=--prune-time-cap=0.5
       --optimize-arg=--time-cap=2 --optimize-arg=--timeout=60 --optimize-arg=--seed=1)
fi
# The driver starts nothing expected to end after the deadline; `timeout` is the backstop
# (SIGTERM: the driver kills the capture or replay it started, then exits).
timeout -k 15 $((deadline + 90)) python3 benchmarks/kernelbench.py run --kernelbench "$KB" \
  -o "$OUT" --work "$W/work" --release "$W/release" \
  --sizes benchmarks/results/kernelbench_sizes_cpu.json --deadline "$deadline" \
  --modes "${MODES:-eager,compiled}" --jobs "${JOBS:-4}" ${RATES:+--rates "$RATES"} \
  "${opt[@]}" > "$OUT/run.log" 2>&1
echo "kernelbench.py rc=$? at $(date -u +%T); df: $(df -h "$W" | tail -n 1)" >> "$OUT/run.log"
if [ -d "$W/release" ]; then
  tar czf "$OUT/release.tgz" -C "$W" --exclude=blobs --exclude=samples.npz --exclude='*.lock' \
    release
fi
rm -f "$OUT"/.*.tmp
tail -n 30 "$OUT/run.log"
