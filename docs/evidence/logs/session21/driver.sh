#!/bin/bash
# Session 21 (device budget cut by failed starts): GPU tests, a committed release re-verified
# x6 on this freshly started machine, a profile of one checked run.
cd /tmp/k; B=/tmp/box; mkdir -p $B
s() { echo "$(date -u +%T) $*" >> $B/driver.log; [ -n "${OUT:-}" ] && cp -r $B/. $OUT/ 2>/dev/null; }
G="$(nvidia-smi --query-gpu=name,uuid --format=csv,noheader | head -n 1)"
s "gpu $G"
s tests; KPAIR_EVIDENCE=$B/gpu-tests.jsonl timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short \
  tests/gpu/test_cuda_checks.py tests/gpu/test_cuda_trust.py tests/gpu/test_cuda_hostile.py > $B/pytest.log 2>&1
s "tests rc $? $(tail -n 1 $B/pytest.log)"
case "$G" in *H200*) SRC=benchmarks/results/reproduce_small_h200;; *) SRC=benchmarks/results/reproduce_small_h100_session20;; esac
rm -rf /tmp/rel; cp -a $SRC /tmp/rel
s "fresh $SRC"; timeout 400 python3 benchmarks/reproduce.py verify /tmp/rel --times 6 --out $B/reproduce_small_fresh.json > $B/fresh.log 2>&1
s "fresh rc $?"
s done; touch $B/DONE
