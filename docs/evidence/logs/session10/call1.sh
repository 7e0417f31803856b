#!/bin/bash
# Next session, call 1 (prepared in session 9): the GPU tests at HEAD (fresh timed blocks have
# never run on CUDA), trust overhead, then the reproduce driver (publish + 6 verifies).
set -u; T0=$(date +%s)
. .gpu_tmp/setup.sh; cd /tmp/k; cat .head; echo
mkdir -p /tmp/box
KPAIR_EVIDENCE=$OUT/gpu-tests.jsonl timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short \
  tests/gpu/test_cuda_checks.py tests/gpu/test_cuda_trust.py tests/gpu/test_cuda_hostile.py tests/gpu/test_cuda_demo.py \
  "tests/gpu/test_cuda_replay.py::test_replay_reproduces_the_captured_post_state_byte_exact[gemm_tiled]" \
  > $OUT/pytest.log 2>&1; echo "pytest rc $?"; tail -n 25 $OUT/pytest.log | cut -c1-400
timeout 90 python3 benchmarks/trust_overhead.py --backend cuda --repeat 3 --case axpbyz_3x16M --case axpy_8M --out $OUT/trust_overhead.json > $OUT/overhead.log 2>&1
echo "overhead rc $?"; grep checked_over $OUT/trust_overhead.json
echo "tests done at $(( $(date +%s) - T0 )) s"
setsid nohup bash .gpu_tmp/driver.sh > /tmp/box/driver.out 2>&1 < /dev/null &
bash .gpu_tmp/wait.sh $(( 585 - ($(date +%s) - T0) )) DONE
