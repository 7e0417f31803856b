#!/bin/bash
# Prepared in session 15 for the next session's first device call (run from /tmp/k):
# publish with reproduce.py (the spacer drawn from 1-256 granules), compact the smallest
# operators into a release small enough to commit (published afresh by `release add`), then
# re-verify the whole release six times and read the replicate structure. Every step leaves
# its result in /tmp/box; wait.sh also packs /tmp/rel's index with every call, so a machine
# lost midway keeps what it had.
cd /tmp/k; B=/tmp/box; mkdir -p $B
s() { echo "$(date -u +%T) $*" >> $B/driver.log; }
s publish; timeout 600 python3 benchmarks/reproduce.py publish --backend cuda -o /tmp/rel --top 15 --triton-limit 5 --keep 1 > $B/publish.log 2>&1
s "publish rc $?"
s compact; timeout 240 python3 benchmarks/reproduce.py compact /tmp/rel -o /tmp/small --max-mb 24 > $B/compact.log 2>&1
s "compact rc $?"; (cd /tmp && tar czf $B/small_release.tar.gz small)
s verify; timeout 400 python3 benchmarks/reproduce.py verify /tmp/rel --times 6 --out $B/reproduce.json > $B/verify.log 2>&1
s "verify rc $?"
timeout 60 python3 benchmarks/replicate_structure.py /tmp/rel --out $B/replicate_structure.json > $B/structure.log 2>&1; s "structure rc $?"
s done; touch $B/DONE
