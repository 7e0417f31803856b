#!/bin/bash
# Issue 44's GPU evidence in one device call: every GPU test (the CUDA forms of the timed-only
# scale and of the memo of a region the declared mutations leave out are in
# tests/gpu/test_cuda_trust.py), then what the trust checks cost, ROUNDS times
# (benchmarks/trust_overhead.py --backend cuda --repeat 4 --case axpbyz_3x16M --case axpy_8M
# by default; the goal: checked_over_unchecked <= 1.5 for >= 48 MiB of regions).
#
#   OUT=DIR bash benchmarks/gpu_issue44.sh [WHEELS]      # from the repository root
#
# WHEELS (default .whl, carried): kpair's dependencies the image may lack (zstandard,
# msgspec, pyelftools, pyseccomp), installed with pip --no-index into a --target folder put
# on PYTHONPATH, only when one of them is missing.
# Environment: OUT (required: what comes back), BLOCKS and REPEAT (trust_overhead.py's
# --blocks and --repeat, default 32 and 4), CASES (trust_overhead.py cases, default
# "axpbyz_3x16M axpy_8M"; "all": every cuda case), ROUNDS (runs of trust_overhead.py, default
# 3), TESTS (default tests/gpu; "none": no tests), PYTHON (python3).
# Back in $OUT: env.txt (the GPU, driver, versions), gpu-tests.log and gpu-tests.jsonl
# (KPAIR_EVIDENCE: one JSON line of facts per test), trust_overhead_N.json and
# trust_overhead_N.log for N = 1..ROUNDS, trust_overhead.json (every round's
# checked_over_unchecked and per-stage overhead per case), and run.log (this script's progress
# and exit statuses).
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
tests=0
if [ "${TESTS:-tests/gpu}" != none ]; then
  echo "$(date -u +%T) GPU tests: ${TESTS:-tests/gpu}"
  # shellcheck disable=SC2086 - TESTS may list several files
  KPAIR_EVIDENCE=$OUT/gpu-tests.jsonl "$PY" -m pytest -q -m gpu -p no:cacheprovider \
    ${TESTS:-tests/gpu} > "$OUT/gpu-tests.log" 2>&1
  tests=$?
  tail -3 "$OUT/gpu-tests.log"
  echo "$(date -u +%T) pytest exit $tests"
fi
cases=()
if [ "${CASES:-}" != all ]; then
  for c in ${CASES:-axpbyz_3x16M axpy_8M}; do cases+=(--case "$c"); done
fi
bench=0
for round in $(seq 1 "${ROUNDS:-3}"); do
  echo "$(date -u +%T) trust overhead, round $round of ${ROUNDS:-3}"
  "$PY" benchmarks/trust_overhead.py --backend cuda --blocks "${BLOCKS:-32}" \
    --repeat "${REPEAT:-4}" "${cases[@]}" --out "$OUT/trust_overhead_$round.json" \
    > "$OUT/trust_overhead_$round.log" 2>&1 || bench=$?
done
"$PY" - "$OUT" "${ROUNDS:-3}" <<'PY'
import json, pathlib, sys
out, rounds = pathlib.Path(sys.argv[1]), int(sys.argv[2])
summary = {"benchmark": "trust_overhead", "rounds": []}
for i in range(1, rounds + 1):
    try:
        doc = json.loads((out / f"trust_overhead_{i}.json").read_text())
    except (OSError, ValueError) as e:
        summary["rounds"].append({"round": i, "error": str(e)})
        continue
    summary.setdefault("device", doc.get("device"))
    summary["rounds"].append({"round": i, "cases": {
        name: {"checked_over_unchecked": c.get("checked_over_unchecked"),
               "per_stage_overhead_s": c.get("overhead", {}).get("per_stage_s")}
        for name, c in doc["cases"].items()}})
for r in summary["rounds"]:
    for name, c in r.get("cases", {}).items():
        print(f"round {r['round']} {name}: checked_over_unchecked {c['checked_over_unchecked']}")
(out / "trust_overhead.json").write_text(json.dumps(summary, indent=1) + "\n")
PY
echo "$(date -u +%T) trust_overhead exit $bench"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
