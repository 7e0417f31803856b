#!/bin/bash
# Session 12, call 1: GPU tests at HEAD (session 11's renewal spacer, 2d01a21, has never run on
# a GPU), trust overhead (axpbyz and axpy, repeat 5: the issue-19 goal), a profile of one
# checked run, then the reproduce driver in the background (publish + 6 verifies +
# replicate_structure: is the alternation of replicates gone with the spacer?). Follow at once
# with `bash .gpu_tmp/wait.sh 470 REPRO_DONE`, then `bash .gpu_tmp/wait.sh 160 DONE`.
set -u; T0=$(date +%s)
. .gpu_tmp/setup.sh; cd /tmp/k; cat .head; echo
mkdir -p /tmp/box
KPAIR_EVIDENCE=$OUT/gpu-tests.jsonl timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short \
  tests/gpu/test_cuda_checks.py tests/gpu/test_cuda_trust.py tests/gpu/test_cuda_hostile.py tests/gpu/test_cuda_demo.py \
  "tests/gpu/test_cuda_replay.py::test_replay_reproduces_the_captured_post_state_byte_exact[gemm_tiled]" \
  > $OUT/pytest.log 2>&1; echo "pytest rc $?"; tail -n 25 $OUT/pytest.log | cut -c1-400
timeout 120 python3 benchmarks/trust_overhead.py --backend cuda --repeat 5 --case axpbyz_3x16M --case axpy_8M --out $OUT/trust_overhead.json > $OUT/overhead.log 2>&1
echo "overhead rc $?"; grep -E '"(axpy_8M|axpbyz_3x16M)"|checked_over' $OUT/trust_overhead.json
timeout 90 python3 /tmp/k/.gpu_tmp/profile_split.py > $OUT/profile_split.txt 2>&1; echo "profile rc $?"; head -n 40 $OUT/profile_split.txt | cut -c1-200
echo "tests done at $(( $(date +%s) - T0 )) s"
setsid nohup bash .gpu_tmp/driver.sh > /tmp/box/driver.out 2>&1 < /dev/null &
bash .gpu_tmp/wait.sh $(( 585 - ($(date +%s) - T0) )) DONE
