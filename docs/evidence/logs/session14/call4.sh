#!/bin/bash
# Session 14, call 4: the batched check kernels (kp_fill, table kp_diff; 8efd16e) on a GPU:
# the check/trust/hostile GPU tests, trust overhead (repeat 5), then the --inductor-baseline
# GPU test with what time is left.
set -u; T0=$(date +%s)
. .gpu_tmp/setup.sh; cd /tmp/k; cat .head; echo
KPAIR_EVIDENCE=$OUT/gpu-tests.jsonl timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short \
  tests/gpu/test_cuda_checks.py tests/gpu/test_cuda_trust.py tests/gpu/test_cuda_hostile.py \
  "tests/gpu/test_cuda_replay.py::test_replay_reproduces_the_captured_post_state_byte_exact[gemm_tiled]" \
  > $OUT/pytest.log 2>&1; echo "pytest rc $?"; tail -n 25 $OUT/pytest.log | cut -c1-400
timeout 130 python3 benchmarks/trust_overhead.py --backend cuda --repeat 5 --case axpbyz_3x16M --case axpy_8M --out $OUT/trust_overhead.json > $OUT/overhead.log 2>&1
echo "overhead rc $?"; grep -E '"(axpy_8M|axpbyz_3x16M)"|checked_over' $OUT/trust_overhead.json
echo "at $(( $(date +%s) - T0 )) s"
left=$(( 440 - ($(date +%s) - T0) ))
if [ $left -gt 60 ]; then
  timeout $left python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short \
    tests/gpu/test_optimize.py::test_inductor_baseline_is_measured_beside_the_search > $OUT/baseline.log 2>&1
  echo "baseline test rc $?"; tail -n 30 $OUT/baseline.log | cut -c1-600
fi
echo "done at $(( $(date +%s) - T0 )) s"
