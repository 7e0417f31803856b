#!/bin/bash
# Session 7, lease 2, call 1: the two GPU tests that failed in lease 1 (each alone, full
# tracebacks), trust overhead and a profile, then the MCP run in the background.
set -u; T0=$(date +%s); W=$PWD
. .gpu_tmp/setup.sh; cd /tmp/k; cat .head; echo
timeout 45 python3 -m pytest -q -m gpu -p no:cacheprovider -rA --tb=long \
  "tests/gpu/test_cuda_replay.py::test_replay_reproduces_the_captured_post_state_byte_exact[gemm_tiled]" \
  > $OUT/pytest_gemm.log 2>&1; echo "gemm rc $?"; tail -5 $OUT/pytest_gemm.log | cut -c1-300
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider -rA --tb=long -s \
  tests/gpu/test_cuda_demo.py > $OUT/pytest_demo.log 2>&1; echo "demo rc $?"; tail -5 $OUT/pytest_demo.log | cut -c1-300
echo "tests done at $(( $(date +%s) - T0 )) s"
timeout 120 python3 benchmarks/trust_overhead.py --backend cuda --repeat 3 --out $OUT/trust_overhead.json 2>&1 | grep -E "checked_over|axpbyz" | head -8
echo "overhead done at $(( $(date +%s) - T0 )) s"
timeout 30 python3 $W/.gpu_tmp/profile_checked.py > $OUT/profile.txt 2>&1; head -2 $OUT/profile.txt | cut -c1-400
echo "profile done at $(( $(date +%s) - T0 )) s"
cp $W/.gpu_tmp/driver8.sh /tmp/driver.sh; rm -f /tmp/DONE; rm -rf /tmp/box
setsid nohup bash /tmp/driver.sh > /tmp/driver.out 2>&1 < /dev/null & disown
sleep 5
. $W/.gpu_tmp/wait8.sh
