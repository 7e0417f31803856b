#!/bin/bash
# Session 18, call 2, on a machine started afresh (not the one call 1 published on): the compact
# release call 1 made under the run-level rule ($1, committed under benchmarks/results/)
# re-verified six times.
set -u; T0=$(date +%s); REL=$1
. .gpu_tmp/setup.sh; cd /tmp/k; cat .head; echo
timeout 420 python3 benchmarks/reproduce.py verify $REL --times 6 --out $OUT/reproduce_small.json > $OUT/small.log 2>&1
echo "small rc $?"; grep -E '"coverage"|"inside"|"compared"|"device"' $OUT/reproduce_small.json 2>/dev/null
tail -n 3 $OUT/small.log | cut -c1-300
echo "verify done at $(( $(date +%s) - T0 )) s"
echo "done at $(( $(date +%s) - T0 )) s"
