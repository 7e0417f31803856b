#!/bin/bash
# Driver (session 12): publishes a release with reproduce.py, re-verifies it six times, reads
# the replicate structure (alternation), then re-verifies the compact release committed in
# session 6 on this card (another H200 started afresh).
cd /tmp/k; B=/tmp/box; mkdir -p $B
s() { echo "$(date -u +%T) $*" >> $B/driver.log; }
s publish; timeout 600 python3 benchmarks/reproduce.py publish --backend cuda -o /tmp/rel --top 15 --triton-limit 5 --keep 1 > $B/publish.log 2>&1
s "publish rc $?"
s verify; timeout 400 python3 benchmarks/reproduce.py verify /tmp/rel --times 6 --out $B/reproduce_h200.json > $B/verify.log 2>&1
s "verify rc $?"
timeout 60 python3 benchmarks/replicate_structure.py /tmp/rel --out $B/replicate_structure.json > $B/structure.log 2>&1; s "structure rc $?"
(cd /tmp/rel && find . \( -name '*.json' -o -name '*.md' -o -name '*.jsonl' \) -not -path '*/capture/*' -not -path '*/blobs/*' | tar czf $B/rel_meta.tar.gz -T -)
touch $B/REPRO_DONE
s small; timeout 120 python3 benchmarks/reproduce.py verify benchmarks/results/reproduce_small_h200 --times 1 --out $B/reproduce_small_fresh8_h200.json > $B/small.log 2>&1; s "small rc $?"
s done; touch $B/DONE
