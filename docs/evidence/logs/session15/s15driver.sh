#!/bin/bash
# Driver (session 15): publishes a release with reproduce.py, re-verifies it six times, reads
# the replicate structure (are consecutive replicates still alike?).
cd /tmp/k; B=/tmp/box; mkdir -p $B
s() { echo "$(date -u +%T) $*" >> $B/driver.log; }
s publish; timeout 600 python3 benchmarks/reproduce.py publish --backend cuda -o /tmp/rel --top 15 --triton-limit 5 --keep 1 > $B/publish.log 2>&1
s "publish rc $?"
s verify; timeout 400 python3 benchmarks/reproduce.py verify /tmp/rel --times 6 --out $B/reproduce.json > $B/verify.log 2>&1
s "verify rc $?"
timeout 60 python3 benchmarks/replicate_structure.py /tmp/rel --out $B/replicate_structure.json > $B/structure.log 2>&1; s "structure rc $?"
(cd /tmp/rel && find . \( -name '*.json' -o -name '*.md' -o -name '*.jsonl' \) -not -path '*/capture/*' -not -path '*/blobs/*' | tar czf $B/rel_meta.tar.gz -T -)
s done; touch $B/DONE
