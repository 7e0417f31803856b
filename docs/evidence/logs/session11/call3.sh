#!/bin/bash
# Session 11, call 3: trust overhead at HEAD on another card (repeat 5), the committed small
# release re-verified once more on a card that did not publish it, a checked-run profile.
set -u; T0=$(date +%s)
. .gpu_tmp/setup.sh; cd /tmp/k; cat .head; echo
timeout 100 python3 benchmarks/trust_overhead.py --backend cuda --repeat 5 --case axpbyz_3x16M --case axpy_8M --out $OUT/trust_overhead.json > $OUT/overhead.log 2>&1
echo "overhead rc $?"; grep -E '"(axpy_8M|axpbyz_3x16M)"|checked_over' $OUT/trust_overhead.json
timeout 60 python3 benchmarks/reproduce.py verify benchmarks/results/reproduce_small_h200 --times 1 --out $OUT/reproduce_small_fresh7_h200.json > $OUT/small.log 2>&1
echo "small rc $?"; grep -E '"coverage"|"inside"|"compared"' $OUT/reproduce_small_fresh7_h200.json | head -3
timeout 30 python3 .gpu_tmp/profile_checked.py > $OUT/profile.txt 2>&1; echo "profile rc $?"; sed -n 1,5p $OUT/profile.txt | cut -c1-300
echo "done at $(( $(date +%s) - T0 )) s"
