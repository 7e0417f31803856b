#!/bin/bash
# Issue 44's GPU evidence in one device call: every GPU test (the CUDA forms of the timed-only
# scale and of the memo of a region the declared mutations leave out are in
# tests/gpu/test_cuda_trust.py), then what the trust checks cost (benchmarks/trust_overhead.py
# --backend cuda; the goal: checked_over_unchecked <= 1.5 for >= 48 MiB of regions).
#
#   OUT=DIR bash benchmarks/gpu_issue44.sh [WHEELS]      # from the repository root
#
# WHEELS (default .whl, carried): kpair's dependencies the image may lack (zstandard,
# msgspec, pyelftools, pyseccomp), installed with pip --no-index into a --target folder put
# on PYTHONPATH, only when one of them is missing.
# Environment: OUT (required: what comes back), BLOCKS and REPEAT (trust_overhead.py's
# --blocks and --repeat, default 32 and 3), CASES (trust_overhead.py cases, default all of
# cuda's, e.g. "axpy_8M axpbyz_3x16M"), TESTS (default tests/gpu), PYTHON (python3).
# Back in $OUT (6 files): env.txt (the GPU, driver, versions), gpu-tests.log and
# gpu-tests.jsonl (KPAIR_EVIDENCE: one JSON line of facts per test), trust_overhead.json,
# trust_overhead.log, and run.log (this script's progress and exit statuses).
# First run (helper H4, 2026-12-07 13:46 UTC, H100 GPU-89d467d7, tests/gpu/test_cuda_trust.py
# only): 26 passed; benchmarks/results/gpu_issue44_h100_h4.json.
set -u
OUT=${OUT:?set OUT to the folder that comes back}
PY=${PYTHON:-python3}
WHEELS=${1:-.whl}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
export PYTHONUNBUFFERED=1
if ! "$PY" -c 'import zstandard, msgspec, elftools, pyseccomp' 2>/dev/null; then
  [ -d "$WHEELS" ] || { echo "kpair's dependencies are missing and no $WHEELS was carried"; exit 2; }
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/kpair-site "$WHEELS"/*.whl > /tmp/kpair-pip.log 2>&1 \
    || { tail -20 /tmp/kpair-pip.log; exit 3; }
  export PYTHONPATH=/tmp/kpair-site
fi
export PYTHONPATH=$ROOT/src${PYTHONPATH:+:$PYTHONPATH}
{ date -u; nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv,noheader
  "$PY" --version; nvcc --version | tail -1; nproc; } > "$OUT/env.txt" 2>&1
# (no git here: a device's copy of the tree need not carry its history; record the commit
# from the machine that sent it)
echo "$(date -u +%T) GPU tests: ${TESTS:-tests/gpu}"
# shellcheck disable=SC2086 - TESTS may list several files
KPAIR_EVIDENCE=$OUT/gpu-tests.jsonl "$PY" -m pytest -q -m gpu -p no:cacheprovider \
  ${TESTS:-tests/gpu} > "$OUT/gpu-tests.log" 2>&1
tests=$?
tail -3 "$OUT/gpu-tests.log"
echo "$(date -u +%T) pytest exit $tests; trust overhead"
cases=()
for c in ${CASES:-}; do cases+=(--case "$c"); done
"$PY" benchmarks/trust_overhead.py --backend cuda --blocks "${BLOCKS:-32}" \
  --repeat "${REPEAT:-3}" "${cases[@]}" --out "$OUT/trust_overhead.json" \
  > "$OUT/trust_overhead.log" 2>&1
bench=$?
"$PY" - "$OUT/trust_overhead.json" <<'PY' 2>/dev/null
import json, sys
doc = json.load(open(sys.argv[1]))
for name, case in doc["cases"].items():
    print(f"{name}: checked_over_unchecked {case.get('checked_over_unchecked')}")
PY
echo "$(date -u +%T) trust_overhead exit $bench"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
