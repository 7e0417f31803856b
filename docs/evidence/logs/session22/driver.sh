#!/bin/bash
# Prepared in session 21 for the next GPU session (not run: no machine started). Copy to
# .gpu_tmp/driver.sh (with profile_run.py beside it), start it as .gpu_tmp/call1.sh does, then
# `bash .gpu_tmp/wait.sh 560 DONE` until DONE. The tree must be under 64 MiB: move
# benchmarks/results/reproduce_small_h100_session18 out first (and back after).
# 1. GPU tests (session 20's review fixes have run only on the CPU).
# 2. publish --top 13 and verify x6 with blobs read on threads (session 21): wall per harness
#    against session 20's 4.15 s; a profile of one checked run of the largest harness.
# 3. A committed release re-verified x6 on this freshly started machine (the H200 release on an
#    H200, session 20's H100 release on an H100). 4. Trust overhead.
cd /tmp/k; B=/tmp/box; mkdir -p $B
s() { echo "$(date -u +%T) $*" >> $B/driver.log; [ -n "${OUT:-}" ] && cp -r $B/. $OUT/ 2>/dev/null; }
G="$(nvidia-smi --query-gpu=name,uuid --format=csv,noheader | head -n 1)"
s "gpu $G"
s tests; KPAIR_EVIDENCE=$B/gpu-tests.jsonl timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short \
  tests/gpu/test_cuda_checks.py tests/gpu/test_cuda_trust.py tests/gpu/test_cuda_hostile.py > $B/pytest.log 2>&1
s "tests rc $? $(tail -n 1 $B/pytest.log)"
s publish; timeout 700 python3 benchmarks/reproduce.py publish --backend cuda -o /tmp/rel --top 13 --triton-limit 5 --keep 1 > $B/publish.log 2>&1
s "publish rc $? opt_determinism $(grep -c 'fail: FAIL \[opt_determinism\]' $B/publish.log) differential $(grep -c 'fail: FAIL \[differential\]' $B/publish.log)"
s verify; timeout 500 python3 benchmarks/reproduce.py verify /tmp/rel --times 6 --out $B/reproduce.json > $B/verify.log 2>&1
s "verify rc $?"
timeout 60 python3 benchmarks/replicate_structure.py /tmp/rel --out $B/replicate_structure.json > $B/structure.log 2>&1; s "structure rc $?"
BIG=$(du -s /tmp/rel/level2/*/harness 2>/dev/null | sort -n | tail -n 1 | cut -f2)
s "profile $BIG"; [ -n "$BIG" ] && timeout 120 python3 .gpu_tmp/profile_run.py "$BIG" > $B/profile.log 2>&1; s "profile rc $?"
case "$G" in *H200*) SRC=benchmarks/results/reproduce_small_h200;; *) SRC=benchmarks/results/reproduce_small_h100_session20;; esac
rm -rf /tmp/fresh; cp -a $SRC /tmp/fresh
s "fresh $SRC"; timeout 400 python3 benchmarks/reproduce.py verify /tmp/fresh --times 6 --out $B/reproduce_small_fresh.json > $B/fresh.log 2>&1
s "fresh rc $?"
s overhead; timeout 130 python3 benchmarks/trust_overhead.py --backend cuda --repeat 4 --case axpbyz_3x16M --case axpy_8M --out $B/trust_overhead_1.json > $B/overhead_1.log 2>&1
s "overhead rc $?"
s done; touch $B/DONE
