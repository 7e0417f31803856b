#!/bin/bash
# The H200 evidence run of docs/evidence/capture.md, in one device call: the must-show
# cases (captured with the Python API, replayed in fresh processes) run beside the coverage
# capture; the overhead timing runs alone afterwards; then the GPU tests. Each stage has its
# own time limit and log, so one failing stage does not hide the others.
set -u
OUT=${OUT:?set OUT to the folder that comes back}
W=${W:-/tmp/kcap}
rm -rf "$W" && mkdir -p "$W"
export PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  python3 -c "from kpair.capture.cupti import find_cupti; print('cupti', find_cupti(13))"
} > "$OUT/env.txt" 2>&1

( timeout 110 python3 benchmarks/capture_cases.py "$W/cases"; echo "capture_cases rc=$?"
  timeout 70 python3 benchmarks/replay_check.py "$W/cases" --jobs 6 \
      --json "$OUT/cases_replay.json"; echo "replay_check rc=$?"
  cp "$W/cases/cases.json" "$OUT/cases.json" ) > "$OUT/cases.log" 2>&1 &
CASES=$!

timeout 330 python3 benchmarks/capture_coverage.py --out "$W/cov" --phase coverage \
    --max "${MAXK:-160}" --jobs 10 --json "$OUT/coverage.json" > "$W/coverage.out" 2>&1
echo "coverage rc=$?" >> "$W/coverage.out"
wait $CASES

timeout 200 python3 benchmarks/capture_coverage.py --out "$W/ovh" --phase overhead \
    ${LAZY:+--lazy} --json "$OUT/overhead.json" > "$W/overhead.out" 2>&1
echo "overhead rc=$?" >> "$W/overhead.out"

timeout 100 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_capture.py -rs \
    > "$W/pytest.out" 2>&1; echo "pytest rc=$?" >> "$W/pytest.out"

cp "$W/cov/capture/capture.json" "$OUT/coverage_capture.json" 2>/dev/null
for f in coverage.out cov/capture.log overhead.out ovh/base.log ovh/one.log ovh/lazy.log \
         pytest.out; do
  [ -f "$W/$f" ] && { echo "==== $f"; tail -c 60000 "$W/$f"; }
done > "$OUT/logs.txt"
du -sh "$W"/cov/capture "$W"/cases >> "$OUT/logs.txt" 2>&1
