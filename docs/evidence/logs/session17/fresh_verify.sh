#!/bin/bash
# For a machine started afresh (not the one that published): the committed compact release
# benchmarks/results/reproduce_small_h200 re-verified six times. Prepared in session 17; it did
# not run there (too little device time was left to start a second machine).
set -u; T0=$(date +%s)
. .gpu_tmp/setup.sh; cd /tmp/k; cat .head; echo

timeout 420 python3 benchmarks/reproduce.py verify benchmarks/results/reproduce_small_h200 --times 6 --out $OUT/reproduce_small.json > $OUT/small.log 2>&1
echo "small rc $?"; grep -E '"coverage"|"inside"|"compared"|"device"' $OUT/reproduce_small.json 2>/dev/null
tail -n 3 $OUT/small.log | cut -c1-300
echo "done at $(( $(date +%s) - T0 )) s"
