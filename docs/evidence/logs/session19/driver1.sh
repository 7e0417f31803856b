#!/bin/bash
# Session 19, one machine. On an H100 (not the one that published it: session 18's was given
# back), first re-verify the committed compact release published on an H100 under the run-level
# rule; on an H200, publish and compact one instead, for a second machine to re-verify. Then the
# trust overhead with the worker's allocator setting and without it (GLIBC_TUNABLES=
# glibc.malloc.hugetlb=0 is kept by kpair.isolation._worker_env), in turn, twice; publish
# --top 13 (aims at 4-5 us kernels), verify six times, the replicate structure, the GPU tests.
cd /tmp/k; B=/tmp/box; mkdir -p $B
s() { echo "$(date -u +%T) $*" >> $B/driver.log; }
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1); s "gpu $GPU"
if [[ "$GPU" == *H100* ]]; then
  s fresh; timeout 300 python3 benchmarks/reproduce.py verify benchmarks/results/reproduce_small_h100_session18 --times 6 --out $B/reproduce_small_fresh.json > $B/fresh.log 2>&1
  s "fresh rc $?"
fi
for i in 1 2; do
  s "overhead on $i"; timeout 130 python3 benchmarks/trust_overhead.py --backend cuda --repeat 4 --case axpbyz_3x16M --case axpy_8M --out $B/trust_overhead_on_$i.json > $B/overhead_on_$i.log 2>&1
  s "overhead off $i"; GLIBC_TUNABLES=glibc.malloc.hugetlb=0 timeout 130 python3 benchmarks/trust_overhead.py --backend cuda --repeat 4 --case axpbyz_3x16M --case axpy_8M --out $B/trust_overhead_off_$i.json > $B/overhead_off_$i.log 2>&1
done
s "overhead done"
python3 benchmarks/worker_alloc.py --out $B/worker_alloc.json > /dev/null 2>&1; s "worker_alloc rc $?"
s publish; timeout 700 python3 benchmarks/reproduce.py publish --backend cuda -o /tmp/rel --top 13 --triton-limit 5 --keep 1 > $B/publish.log 2>&1
s "publish rc $?"
if [[ "$GPU" != *H100* ]]; then
  s compact; timeout 200 python3 benchmarks/reproduce.py compact /tmp/rel -o /tmp/small --max-mb 16 > $B/compact.log 2>&1
  s "compact rc $?"; touch $B/COMPACTED
fi
s verify; timeout 400 python3 benchmarks/reproduce.py verify /tmp/rel --times 6 --out $B/reproduce.json > $B/verify.log 2>&1
s "verify rc $?"
timeout 60 python3 benchmarks/replicate_structure.py /tmp/rel --out $B/replicate_structure.json > $B/structure.log 2>&1; s "structure rc $?"
s tests; KPAIR_EVIDENCE=$B/gpu-tests.jsonl timeout 220 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short \
  tests/gpu/test_cuda_checks.py tests/gpu/test_cuda_trust.py tests/gpu/test_cuda_hostile.py > $B/pytest.log 2>&1
s "tests rc $? $(tail -n 1 $B/pytest.log)"
s done; touch $B/DONE
