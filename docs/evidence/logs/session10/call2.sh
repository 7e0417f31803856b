#!/bin/bash
# Session 10, call 3: the GPU tests and the trust overhead at the commit with spread fresh
# inputs (one upload + one kp_copy launch per mutated range per launch).
set -u; T0=$(date +%s)
. .gpu_tmp/setup.sh; cd /tmp/k; cat .head; echo
KPAIR_EVIDENCE=$OUT/gpu-tests.jsonl timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short \
  tests/gpu/test_cuda_checks.py tests/gpu/test_cuda_trust.py tests/gpu/test_cuda_hostile.py tests/gpu/test_cuda_demo.py \
  "tests/gpu/test_cuda_replay.py::test_replay_reproduces_the_captured_post_state_byte_exact[gemm_tiled]" \
  > $OUT/pytest.log 2>&1; echo "pytest rc $?"; tail -n 25 $OUT/pytest.log | cut -c1-400
timeout 120 python3 benchmarks/trust_overhead.py --backend cuda --repeat 3 --case axpbyz_3x16M --case axpy_8M --out $OUT/trust_overhead.json > $OUT/overhead.log 2>&1
echo "overhead rc $?"; grep -E '"(axpy_8M|axpbyz_3x16M)"|checked_over' $OUT/trust_overhead.json
echo "done at $(( $(date +%s) - T0 )) s"
