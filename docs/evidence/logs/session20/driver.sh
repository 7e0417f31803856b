#!/bin/bash
# Session 20, call 1 (prepared in session 19; the GPU tests now include the masked held copies). Start it as call1.sh does (copy it
# to .gpu_tmp/driver.sh), then follow with `bash .gpu_tmp/wait.sh 560 DONE`.
# 1. The GPU tests first: session 19's fix (every candidate's poisons proven by ref's control;
#    fresh timed inputs written after held poison) has run only on the CPU; the CUDA twin is
#    tests/gpu/test_cuda_trust.py::test_cuda_opt_is_never_judged_under_a_poison_that_changes_refs_own_answer.
# 2. The trust overhead with the fix (session 19's H100 numbers were before it).
# 3. publish --top 13 and verify x6: in session 19, resnet18.0013 failed 2 of 6 re-runs and the
#    optimizer rejected 12 honest resnet18 batch-norm candidates, all from the bug; count them
#    again in publish.log (grep -c 'fail: FAIL \[opt_determinism\]').
cd /tmp/k; B=/tmp/box; mkdir -p $B
s() { echo "$(date -u +%T) $*" >> $B/driver.log; }
s "gpu $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
s tests; KPAIR_EVIDENCE=$B/gpu-tests.jsonl timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short \
  tests/gpu/test_cuda_checks.py tests/gpu/test_cuda_trust.py tests/gpu/test_cuda_hostile.py > $B/pytest.log 2>&1
s "tests rc $? $(tail -n 1 $B/pytest.log)"
for i in 1 2; do
  s "overhead $i"; timeout 130 python3 benchmarks/trust_overhead.py --backend cuda --repeat 4 --case axpbyz_3x16M --case axpy_8M --out $B/trust_overhead_$i.json > $B/overhead_$i.log 2>&1
done
s publish; timeout 700 python3 benchmarks/reproduce.py publish --backend cuda -o /tmp/rel --top 13 --triton-limit 5 --keep 1 > $B/publish.log 2>&1
s "publish rc $? opt_determinism $(grep -c 'fail: FAIL \[opt_determinism\]' $B/publish.log) differential $(grep -c 'fail: FAIL \[differential\]' $B/publish.log)"
s compact; timeout 200 python3 benchmarks/reproduce.py compact /tmp/rel -o /tmp/small --max-mb 16 > $B/compact.log 2>&1
s "compact rc $?"; touch $B/COMPACTED
s verify; timeout 400 python3 benchmarks/reproduce.py verify /tmp/rel --times 6 --out $B/reproduce.json > $B/verify.log 2>&1
s "verify rc $?"
timeout 60 python3 benchmarks/replicate_structure.py /tmp/rel --out $B/replicate_structure.json > $B/structure.log 2>&1; s "structure rc $?"
s done; touch $B/DONE
