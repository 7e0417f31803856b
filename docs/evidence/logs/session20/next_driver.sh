#!/bin/bash
# Prepared in session 20 for the next GPU session (not run). Before the call, move
# benchmarks/results/reproduce_small_h200 and reproduce_small_h100_session18 out of the tree
# (the device tool refuses a working tree over 64 MiB; move them back after). Copy this file
# to .gpu_tmp/driver.sh and start it as .gpu_tmp/call1.sh does, then `bash .gpu_tmp/wait.sh 560 DONE`.
# 1. GPU tests: session 20's review fixes (a digest key per held copy, rows and counters
#    zeroed after each compare, pageable_memory_access in environment()) ran only on the CPU.
# 2. The compact release session 20 published on H100 GPU-de3942e6 re-verified six times on
#    this machine (started afresh: compare its UUID).
# 3. Trust overhead once more.
cd /tmp/k; B=/tmp/box; mkdir -p $B
s() { echo "$(date -u +%T) $*" >> $B/driver.log; }
s "gpu $(nvidia-smi --query-gpu=name,uuid --format=csv,noheader | head -n 1)"
s tests; KPAIR_EVIDENCE=$B/gpu-tests.jsonl timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short \
  tests/gpu/test_cuda_checks.py tests/gpu/test_cuda_trust.py tests/gpu/test_cuda_hostile.py > $B/pytest.log 2>&1
s "tests rc $? $(tail -n 1 $B/pytest.log)"
s fresh; timeout 300 python3 benchmarks/reproduce.py verify benchmarks/results/reproduce_small_h100_session20 --times 6 --out $B/reproduce_small_fresh.json > $B/fresh.log 2>&1
s "fresh rc $?"
s overhead; timeout 130 python3 benchmarks/trust_overhead.py --backend cuda --repeat 4 --case axpbyz_3x16M --case axpy_8M --out $B/trust_overhead_1.json > $B/overhead_1.log 2>&1
s done; touch $B/DONE
