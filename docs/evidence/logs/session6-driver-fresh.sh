#!/bin/bash
# Fresh machine (session 6, second lease): re-verify the committed compact release, then
# publish and verify a new release with the current defaults. Results gathered in /tmp/box.
cd /tmp/k; B=/tmp/box; mkdir -p $B
s() { echo "$(date -u +%T) $*" >> $B/driver.log; }
s small-verify; cp -r benchmarks/results/reproduce_small_h200 /tmp/small
python3 benchmarks/reproduce.py verify /tmp/small --times 6 --out $B/reproduce_small_fresh_h200.json > /tmp/small_verify.log 2>&1
cp /tmp/small/index.json $B/small_index.json
s publish; python3 benchmarks/reproduce.py publish --backend cuda -o /tmp/rel --top 12 --triton-limit 6 --keep 1 > $B/publish.log 2>&1
s verify; python3 benchmarks/reproduce.py verify /tmp/rel --times 6 --out $B/reproduce_h200.json > /tmp/verify.log 2>&1
s pack; (cd /tmp/rel && find . \( -name '*.json' -o -name '*.md' -o -name '*.jsonl' \) -not -path '*/capture/*' | tar czf $B/rel_meta.tar.gz -T -)
s done; touch /tmp/DONE
