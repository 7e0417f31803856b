#!/bin/bash
# Driver (sessions 9-10): publishes a release with reproduce.py, re-verifies it six times, makes
# the compact release to commit, re-verifies the compact release committed in session 6.
cd /tmp/k; B=/tmp/box; mkdir -p $B
s() { echo "$(date -u +%T) $*" >> $B/driver.log; }
s publish; timeout 600 python3 benchmarks/reproduce.py publish --backend cuda -o /tmp/rel --top 15 --triton-limit 5 --keep 1 > $B/publish.log 2>&1
s "publish rc $?"
s verify; timeout 400 python3 benchmarks/reproduce.py verify /tmp/rel --times 6 --out $B/reproduce_h200.json > $B/verify.log 2>&1
s "verify rc $?"
(cd /tmp/rel && find . \( -name '*.json' -o -name '*.md' -o -name '*.jsonl' \) -not -path '*/capture/*' -not -path '*/blobs/*' | tar czf $B/rel_meta.tar.gz -T -)
touch $B/REPRO_DONE
s compact; timeout 60 python3 benchmarks/reproduce.py compact /tmp/rel -o /tmp/small9 > $B/compact.log 2>&1; s "compact rc $?"
# the compact release is ~30 MB: too big to come back in one piece; split it if wanted
s small; timeout 90 python3 benchmarks/reproduce.py verify benchmarks/results/reproduce_small_h200 --times 1 --out $B/reproduce_small_fresh_h200.json > $B/small.log 2>&1; s "small rc $?"
s done; touch $B/DONE
