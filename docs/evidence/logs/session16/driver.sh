#!/bin/bash
# Session 16 (device time short after refusals): publish with reproduce.py (extra replicates,
# spacer 1-256 granules), re-verify six times, the replicate structure, then the trust
# overhead; every step leaves its result in /tmp/box (wait.sh packs it with every call).
cd /tmp/k; B=/tmp/box; mkdir -p $B
s() { echo "$(date -u +%T) $*" >> $B/driver.log; }
s publish; timeout 450 python3 benchmarks/reproduce.py publish --backend cuda -o /tmp/rel --top 10 --triton-limit 5 --keep 1 > $B/publish.log 2>&1
s "publish rc $?"
s verify; timeout 300 python3 benchmarks/reproduce.py verify /tmp/rel --times 6 --out $B/reproduce.json > $B/verify.log 2>&1
s "verify rc $?"
timeout 60 python3 benchmarks/replicate_structure.py /tmp/rel --out $B/replicate_structure.json > $B/structure.log 2>&1; s "structure rc $?"
timeout 120 python3 benchmarks/trust_overhead.py --backend cuda --repeat 5 --case axpbyz_3x16M --case axpy_8M --out $B/trust_overhead.json > $B/overhead.log 2>&1
s "overhead rc $?"
s done; touch $B/DONE
