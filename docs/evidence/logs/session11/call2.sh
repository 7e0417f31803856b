#!/bin/bash
# Session 11, call 2: GPU tests and trust overhead at HEAD (quick tolerance judge, control on
# the captured input), a profile of one checked run, then a KernelBench batch until ~590 s.
set -u; T0=$(date +%s); ROOT=$PWD
. .gpu_tmp/setup.sh; cd /tmp/k; cat .head; echo
KPAIR_EVIDENCE=$OUT/gpu-tests.jsonl timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short \
  tests/gpu/test_cuda_checks.py tests/gpu/test_cuda_trust.py tests/gpu/test_cuda_hostile.py tests/gpu/test_cuda_demo.py \
  "tests/gpu/test_cuda_replay.py::test_replay_reproduces_the_captured_post_state_byte_exact[gemm_tiled]" \
  > $OUT/pytest.log 2>&1; echo "pytest rc $?"; grep -v "kpair demo:" $OUT/pytest.log | tail -n 22 | cut -c1-300
timeout 120 python3 benchmarks/trust_overhead.py --backend cuda --repeat 5 --case axpbyz_3x16M --case axpy_8M --out $OUT/trust_overhead.json > $OUT/overhead.log 2>&1
echo "overhead rc $?"; grep -E '"(axpy_8M|axpbyz_3x16M)"|checked_over' $OUT/trust_overhead.json
timeout 40 python3 .gpu_tmp/profile_checked.py > $OUT/profile.txt 2>&1; echo "profile rc $?"; sed -n 1,5p $OUT/profile.txt | cut -c1-300
left=$(( 590 - ($(date +%s) - T0) - 105 ))
echo "tests done at $(( $(date +%s) - T0 )) s; KernelBench deadline $left s"
cd $ROOT; unset PYTHONPATH
[ $left -gt 60 ] && bash benchmarks/kernelbench_device_run.sh $left | tail -n 12 | cut -c1-250
echo "all done at $(( $(date +%s) - T0 )) s"
