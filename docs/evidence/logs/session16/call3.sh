#!/bin/bash
# Session 16, call 3: the same overhead on the same warm machine, with the audit before the
# in-place change (6983f3e's trust/audit.py), then again with HEAD's: what mutating axpy's y costs.
set -u
. .gpu_tmp/setup.sh
rm -rf /tmp/k2 && cp -a /tmp/k /tmp/k2 && cp .gpu_tmp/audit_old.py /tmp/k2/src/kpair/trust/audit.py
cd /tmp/k2 && PYTHONPATH=/tmp/site:/tmp/k2/src timeout 120 python3 benchmarks/trust_overhead.py --backend cuda --repeat 3 --case axpbyz_3x16M --case axpy_8M --out $OUT/trust_overhead_before.json > $OUT/overhead_before.log 2>&1
echo "before rc $?"; grep -E '"(axpy_8M|axpbyz_3x16M)"|checked_over' $OUT/trust_overhead_before.json
cd /tmp/k && timeout 120 python3 benchmarks/trust_overhead.py --backend cuda --repeat 3 --case axpbyz_3x16M --case axpy_8M --out $OUT/trust_overhead_after.json > $OUT/overhead_after.log 2>&1
echo "after rc $?"; grep -E '"(axpy_8M|axpbyz_3x16M)"|checked_over' $OUT/trust_overhead_after.json
