#!/bin/bash
# Session 22, call 2, on a machine started afresh: session 20's committed H100 release, six re-runs.
set -u; REL=benchmarks/results/reproduce_small_h100_session20
. .gpu_tmp/setup.sh; cd /tmp/k; cat .head; echo
timeout 240 python3 benchmarks/reproduce.py verify $REL --times 6 --out $OUT/reproduce_small_fresh2.json > $OUT/small.log 2>&1
echo "small rc $?"; grep -E '"coverage"|"inside"|"compared"|"device"' $OUT/reproduce_small_fresh2.json 2>/dev/null | head
tail -n 3 $OUT/small.log | cut -c1-300
