#!/bin/bash
# Session 8, call 1: GPU cheat and hostile tests, the gemm replay test, trust overhead; then
# the background driver (reproduce publish + verify, then a KernelBench call).
set -u; T0=$(date +%s)
. .gpu_tmp/setup.sh; cd /tmp/k; cat .head; echo
mkdir -p /tmp/box
setsid nohup bash .gpu_tmp/driver.sh WAIT > /tmp/box/driver.out 2>&1 < /dev/null &
KPAIR_EVIDENCE=$OUT/gpu-tests.jsonl timeout 250 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short \
  tests/gpu/test_cuda_trust.py tests/gpu/test_cuda_hostile.py \
  "tests/gpu/test_cuda_replay.py::test_replay_reproduces_the_captured_post_state_byte_exact[gemm_tiled]" \
  > $OUT/pytest.log 2>&1; echo "pytest rc $?"; tail -n 25 $OUT/pytest.log | cut -c1-400
echo "tests done at $(( $(date +%s) - T0 )) s"
timeout 100 python3 benchmarks/trust_overhead.py --backend cuda --repeat 3 --out $OUT/trust_overhead.json > $OUT/overhead.log 2>&1
echo "overhead rc $?"; grep -E "checked_over|\"case\"" $OUT/overhead.log | head -12
echo "overhead done at $(( $(date +%s) - T0 )) s"
touch /tmp/box/GO   # the driver starts its timed work only now (nothing else on the GPU)
