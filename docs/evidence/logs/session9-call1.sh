#!/bin/bash
# Session 9, call 1: the write-ordering benchmark, GPU check/trust/hostile tests, then the
# background driver (reproduce publish + six verifies), waited for until this call's end.
set -u; T0=$(date +%s)
. .gpu_tmp/setup.sh; cd /tmp/k; cat .head; echo
mkdir -p /tmp/box
timeout 60 python3 benchmarks/htod_order.py --mib 64 --rounds 40 --out $OUT/htod_order.json > $OUT/htod_order.log 2>&1
echo "htod rc $?"; grep -A3 '"legacy"\|"replay_stream"' $OUT/htod_order.json | head -12
KPAIR_EVIDENCE=$OUT/gpu-tests.jsonl timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short \
  tests/gpu/test_cuda_checks.py tests/gpu/test_cuda_trust.py tests/gpu/test_cuda_hostile.py \
  "tests/gpu/test_cuda_replay.py::test_replay_reproduces_the_captured_post_state_byte_exact[gemm_tiled]" \
  > $OUT/pytest.log 2>&1; echo "pytest rc $?"; tail -n 15 $OUT/pytest.log | cut -c1-400
echo "tests done at $(( $(date +%s) - T0 )) s"
setsid nohup bash .gpu_tmp/driver.sh > /tmp/box/driver.out 2>&1 < /dev/null &
bash .gpu_tmp/wait.sh $(( 585 - ($(date +%s) - T0) )) DONE
