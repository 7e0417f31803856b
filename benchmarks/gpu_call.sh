#!/bin/bash
# One device call made of named steps, each under its own time limit, every output under $OUT.
#
#   OUT=DIR bash benchmarks/gpu_call.sh 'NAME:SECONDS:COMMAND' ...     # from the repository root
#
# Sets up what every step needs first: kpair's dependencies the image lacks (the wheels in a
# carried .whl/: zstandard, msgspec, pyelftools, pyseccomp; installed with pip --no-index into
# a --target folder on PYTHONPATH, only when one is missing), src/ on PYTHONPATH, and
# $OUT/env.txt (date, GPU name, UUID, driver, memory, Python, nvcc, torch). Then each step runs
# `bash -c COMMAND` with OUT exported, its output in $OUT/NAME.log, killed after SECONDS; a
# step's failure does not stop the next one. $OUT/steps.json lists each step's exit status
# and seconds; everything else comes back packed in $OUT/back.tgz. Examples:
#   'tests:300:bash benchmarks/gpu_tests.sh 75 tests/gpu/test_cuda_trust.py tests/test_plan_data_gpu.py'
#   'trust:150:ROUNDS=3 TESTS=none bash benchmarks/gpu_issue44.sh'
set -u
OUT=${OUT:?set OUT to the folder that comes back}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OUT
if ! python3 -c 'import zstandard, msgspec, elftools, pyseccomp' 2>/dev/null; then
  [ -d .whl ] || { echo "kpair's dependencies are missing and no .whl was carried"; exit 2; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/kpair-site .whl/*.whl > /tmp/kpair-pip.log 2>&1 \
    || { tail -20 /tmp/kpair-pip.log; exit 3; }
  export PYTHONPATH=/tmp/kpair-site
fi
export PYTHONPATH=$ROOT/src${PYTHONPATH:+:$PYTHONPATH}
{ date -u; nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv,noheader
  python3 --version; nvcc --version | tail -1
  python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
  python3 -c 'import triton; print("triton", triton.__version__)'; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
echo "[" > "$OUT/steps.json"
sep=""
for step in "$@"; do
  name=${step%%:*}; rest=${step#*:}; limit=${rest%%:*}; cmd=${rest#*:}
  echo "$(date -u +%T) step $name (at most ${limit} s): $cmd"
  t0=$(date +%s.%N)
  timeout -k 5 "$limit" bash -c "$cmd" > "$OUT/$name.log" 2>&1
  rc=$?
  s=$(python3 -c "import time; print(round(time.time() - $t0, 1))")
  tail -4 "$OUT/$name.log"
  echo "$(date -u +%T) step $name: exit $rc after $s s"
  printf '%s{"step": "%s", "exit": %d, "s": %s}\n' "$sep" "$name" "$rc" "$s" >> "$OUT/steps.json"
  sep=","
done
echo "]" >> "$OUT/steps.json"
# At most 8 files come back, 16 MiB each: every log and result (no snapshot blobs, nothing
# over 4 MiB) travels in one back.tgz beside env.txt and steps.json; a packed release
# (a top-level *.tar.zst, at most 16 MiB) comes back on its own.
(cd "$OUT" && find . -type f ! -name env.txt ! -name steps.json ! -name back.tgz \
   ! -path './*.tar.zst' ! -path '*/blobs/*' -size -4M -print0 \
   | tar -czf back.tgz --null -T - \
   && find . -mindepth 1 -maxdepth 1 ! -name env.txt ! -name steps.json ! -name back.tgz \
   ! -name '*.tar.zst' -exec rm -rf {} +)
ls -la "$OUT"
