#!/bin/bash
# Next session, call 1: GPU tests, trust overhead and a fresh-process profile of the checks
# (profile_fresh.py, axpy) at HEAD, then driver.sh in the background;
# follow at once with `bash .gpu_tmp/wait.sh 585 DONE` (again until DONE), then, on a machine
# started afresh, `reproduce.py verify` of the compact release from small_release.tar.gz.
set -u; T0=$(date +%s)
. .gpu_tmp/setup.sh; cd /tmp/k; cat .head; echo
KPAIR_EVIDENCE=$OUT/gpu-tests.jsonl timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short \
  tests/gpu/test_cuda_checks.py tests/gpu/test_cuda_trust.py tests/gpu/test_cuda_hostile.py \
  "tests/gpu/test_cuda_replay.py::test_replay_reproduces_the_captured_post_state_byte_exact[gemm_tiled]" \
  > $OUT/pytest.log 2>&1; echo "pytest rc $?"; tail -n 6 $OUT/pytest.log | cut -c1-400
timeout 120 python3 benchmarks/trust_overhead.py --backend cuda --repeat 5 --case axpbyz_3x16M --case axpy_8M --out $OUT/trust_overhead.json > $OUT/overhead.log 2>&1
echo "overhead rc $?"; grep -E '"(axpy_8M|axpbyz_3x16M)"|checked_over' $OUT/trust_overhead.json
timeout 100 python3 .gpu_tmp/profile_fresh.py axpy_8M --pairs 3 > $OUT/profile_fresh.txt 2>&1
echo "profile rc $?"; sed -n '/== stages/,/== driver wall/p' $OUT/profile_fresh.txt | head -16
mkdir -p /tmp/box
setsid nohup bash .gpu_tmp/driver.sh > /tmp/box/driver.out 2>&1 < /dev/null &
bash .gpu_tmp/wait.sh $(( 585 - ($(date +%s) - T0) )) DONE
