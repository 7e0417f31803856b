#!/bin/bash
# Session 10, call 4: trust overhead at the commit whose fresh float patches take a slice.
set -u; T0=$(date +%s)
. .gpu_tmp/setup.sh; cd /tmp/k; cat .head; echo
timeout 150 python3 benchmarks/trust_overhead.py --backend cuda --repeat 3 --case axpbyz_3x16M --case axpy_8M --out $OUT/trust_overhead.json > $OUT/overhead.log 2>&1
echo "overhead rc $?"; grep -E '"(axpy_8M|axpbyz_3x16M)"|checked_over|"measure"|"control"' $OUT/trust_overhead.json
echo "done at $(( $(date +%s) - T0 )) s"
