#!/bin/bash
# Session 16, call 2 (about 400 device seconds left): the CUDA checks with in-place inputs
# mutated (axpy's y is updated in place) and the positive discovery fill, then the overhead.
set -u
. .gpu_tmp/setup.sh; cd /tmp/k; cat .head; echo
KPAIR_EVIDENCE=$OUT/gpu-tests.jsonl timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short \
  tests/gpu/test_cuda_checks.py tests/gpu/test_cuda_trust.py tests/gpu/test_cuda_hostile.py \
  > $OUT/pytest.log 2>&1; echo "pytest rc $?"; tail -n 8 $OUT/pytest.log | cut -c1-400
timeout 140 python3 benchmarks/trust_overhead.py --backend cuda --repeat 3 --case axpbyz_3x16M --case axpy_8M --out $OUT/trust_overhead.json > $OUT/overhead.log 2>&1
echo "overhead rc $?"; grep -E '"(axpy_8M|axpbyz_3x16M)"|checked_over|ratio' $OUT/trust_overhead.json | head -20; tail -3 $OUT/overhead.log
