#!/bin/bash
# Session 18, first machine: the trust overhead, publish with
# reproduce.py (--top 12: >= 10 operators of llama and resnet18, + 4 identical pairs) under the
# run-level rule, re-verify six times, the replicate structure, then a compact release of the
# smallest harnesses for call 2 to re-verify on a machine started afresh; last, the CUDA trust
# tests. Results in /tmp/box.
cd /tmp/k; B=/tmp/box; mkdir -p $B
s() { echo "$(date -u +%T) $*" >> $B/driver.log; }
s overhead; timeout 130 python3 benchmarks/trust_overhead.py --backend cuda --repeat 4 --case axpbyz_3x16M --case axpy_8M --out $B/trust_overhead.json > $B/overhead.log 2>&1
s "overhead rc $?"
s publish; timeout 700 python3 benchmarks/reproduce.py publish --backend cuda -o /tmp/rel --top 12 --triton-limit 5 --keep 1 > $B/publish.log 2>&1
s "publish rc $?"
s verify; timeout 400 python3 benchmarks/reproduce.py verify /tmp/rel --times 6 --out $B/reproduce.json > $B/verify.log 2>&1
s "verify rc $?"
timeout 60 python3 benchmarks/replicate_structure.py /tmp/rel --out $B/replicate_structure.json > $B/structure.log 2>&1; s "structure rc $?"
s compact; timeout 200 python3 benchmarks/reproduce.py compact /tmp/rel -o /tmp/small --max-mb 16 > $B/compact.log 2>&1
s "compact rc $?"; touch $B/COMPACTED
s tests; KPAIR_EVIDENCE=$B/gpu-tests.jsonl timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short \
  tests/gpu/test_cuda_checks.py tests/gpu/test_cuda_trust.py tests/gpu/test_cuda_hostile.py > $B/pytest.log 2>&1
s "tests rc $? $(tail -n 1 $B/pytest.log)"
s done; touch $B/DONE
