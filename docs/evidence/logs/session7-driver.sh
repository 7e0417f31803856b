#!/bin/bash
# Session 7 lease 1 driver: publish a release with the current defaults (6 replicates, each on
# renewed pages), re-verify it six times, re-verify the committed compact release twice.
cd /tmp/k; B=/tmp/box; mkdir -p $B
s() { echo "$(date -u +%T) $*" >> $B/driver.log; }
s publish; python3 benchmarks/reproduce.py publish --backend cuda -o /tmp/rel --top 12 --triton-limit 6 --keep 1 > $B/publish.log 2>&1
s verify; python3 benchmarks/reproduce.py verify /tmp/rel --times 6 --out $B/reproduce_h200.json > /tmp/verify.log 2>&1
s small; cp -r benchmarks/results/reproduce_small_h200 /tmp/small
python3 benchmarks/reproduce.py verify /tmp/small --times 2 --out $B/reproduce_small.json > /tmp/small_verify.log 2>&1
s pack; (cd /tmp/rel && find . \( -name '*.json' -o -name '*.md' -o -name '*.jsonl' \) -not -path '*/capture/*' | tar czf $B/rel_meta.tar.gz -T -)
s done; touch /tmp/DONE
