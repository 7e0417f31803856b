#!/bin/bash
# Session 22, call 2, on a machine started afresh (not call 1's c9dfc996 H100).
# H100: session 20's committed H100 release, six re-runs. H200: the committed H200 release, six
# re-runs; then publish --top 8 and verify x6 on this H200 (the H200 figures).
cd /tmp/k; B=/tmp/box; mkdir -p $B
s() { echo "$(date -u +%T) $*" >> $B/driver.log; [ -n "${OUT:-}" ] && cp -r $B/. $OUT/ 2>/dev/null; }
G="$(nvidia-smi --query-gpu=name,uuid --format=csv,noheader | head -n 1)"
s "gpu $G"
case "$G" in *H200*) SRC=benchmarks/results/reproduce_small_h200;; *) SRC=benchmarks/results/reproduce_small_h100_session20;; esac
rm -rf /tmp/fresh; cp -a $SRC /tmp/fresh
s "fresh $SRC"; timeout 240 python3 benchmarks/reproduce.py verify /tmp/fresh --times 6 --out $B/reproduce_small_fresh2.json > $B/fresh2.log 2>&1
s "fresh rc $?"
BIG=$(du -s /tmp/fresh/level2/*/harness 2>/dev/null | sort -n | tail -n 1 | cut -f2)
s "profile $BIG"; [ -n "$BIG" ] && timeout 120 python3 .gpu_tmp/profile_run.py "$BIG" > $B/profile.log 2>&1; s "profile rc $? $(head -n 1 $B/profile.log | cut -c1-200)"
case "$G" in *H200*)
s publish; timeout 280 python3 benchmarks/reproduce.py publish --backend cuda -o /tmp/rel --top 8 --triton-limit 5 --keep 1 > $B/publish.log 2>&1
s "publish rc $? opt_determinism $(grep -c 'fail: FAIL \[opt_determinism\]' $B/publish.log) differential $(grep -c 'fail: FAIL \[differential\]' $B/publish.log)"
s verify; timeout 190 python3 benchmarks/reproduce.py verify /tmp/rel --times 6 --out $B/reproduce.json > $B/verify.log 2>&1
s "verify rc $?"
timeout 60 python3 benchmarks/replicate_structure.py /tmp/rel --out $B/replicate_structure.json > $B/structure.log 2>&1; s "structure rc $?";;
esac
s done; touch $B/DONE
