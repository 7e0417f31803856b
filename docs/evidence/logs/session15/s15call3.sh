#!/bin/bash
# Session 15, call 3: GPU tests of checks/trust/hostile/replay and trust overhead (repeat 5;
# issue 19) at HEAD, then the committed compact release re-verified on this card (issue 20).
set -u; T0=$(date +%s)
. .gpu_tmp/setup.sh; cd /tmp/k; cat .head; echo
KPAIR_EVIDENCE=$OUT/gpu-tests.jsonl timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short \
  tests/gpu/test_cuda_checks.py tests/gpu/test_cuda_trust.py tests/gpu/test_cuda_hostile.py \
  "tests/gpu/test_cuda_replay.py::test_replay_reproduces_the_captured_post_state_byte_exact[gemm_tiled]" \
  > $OUT/pytest.log 2>&1; echo "pytest rc $?"; tail -n 6 $OUT/pytest.log | cut -c1-400
timeout 120 python3 benchmarks/trust_overhead.py --backend cuda --repeat 5 --case axpbyz_3x16M --case axpy_8M --out $OUT/trust_overhead.json > $OUT/overhead.log 2>&1
echo "overhead rc $?"; grep -E '"(axpy_8M|axpbyz_3x16M)"|checked_over' $OUT/trust_overhead.json
echo "at $(( $(date +%s) - T0 )) s"
left=$(( 200 - ($(date +%s) - T0) ))
[ $left -gt 40 ] && timeout $left python3 benchmarks/reproduce.py verify benchmarks/results/reproduce_small_h200 --times 1 --out $OUT/reproduce_small.json > $OUT/small.log 2>&1
echo "small rc $?"; grep -E '"coverage"|"inside"|"compared"' $OUT/reproduce_small.json 2>/dev/null
echo "done at $(( $(date +%s) - T0 )) s"
