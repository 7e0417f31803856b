#!/bin/bash
# Session 8 driver: waits for call 1's tests, then publishes a release with reproduce.py,
# re-verifies it six times, then one KernelBench call (benchmarks/kernelbench_device_run.sh).
cd /tmp/k; B=/tmp/box; mkdir -p $B
s() { echo "$(date -u +%T) $*" >> $B/driver.log; }
s waiting; while [ ! -f $B/GO ]; do sleep 2; done
s publish; timeout 660 python3 benchmarks/reproduce.py publish --backend cuda -o /tmp/rel --top 15 --triton-limit 5 --keep 1 > $B/publish.log 2>&1
s "publish rc $?"
s verify; timeout 300 python3 benchmarks/reproduce.py verify /tmp/rel --times 6 --out $B/reproduce_h200.json > $B/verify.log 2>&1
s "verify rc $?"
s pack; (cd /tmp/rel && find . \( -name '*.json' -o -name '*.md' -o -name '*.jsonl' \) -not -path '*/capture/*' -not -path '*/blobs/*' | tar czf $B/rel_meta.tar.gz -T -)
touch $B/REPRO_DONE
s kernelbench; mkdir -p /tmp/kbout; OUT=/tmp/kbout timeout 420 bash benchmarks/kernelbench_device_run.sh ${KBDEADLINE:-300} > $B/kb.out 2>&1
s "kernelbench rc $?"
(cd /tmp/kbout && tar czf $B/kb.tgz --exclude=release.tgz . ); cp /tmp/kbout/release.tgz $B/ 2>/dev/null
s done; touch $B/DONE
