#!/bin/bash
# Wait (at most $1 s) for /tmp/box/$2, then hand back what the driver has so far; the compact
# release (/tmp/small) comes back as a file of its own once it is made.
set -u; T0=$(date +%s); lim=${1:-560}; flag=${2:-DONE}
while [ ! -f /tmp/box/$flag ] && [ $(( $(date +%s) - T0 )) -lt $lim ]; do sleep 3; done
date -u; cat /tmp/box/driver.log; tail -n 3 /tmp/box/pytest.log 2>/dev/null | cut -c1-300
grep -E '"coverage"|"inside"|"compared"|median_half|wall_per' /tmp/box/reproduce.json 2>/dev/null | head
grep -h checked_over /tmp/box/trust_overhead_*.json 2>/dev/null; grep -E "\"coverage\"|\"inside\"|\"device\"" /tmp/box/reproduce_small_fresh.json 2>/dev/null | head
tail -n 4 /tmp/box/verify.log 2>/dev/null | cut -c1-300
[ -d /tmp/rel ] && (cd /tmp/rel && find . \( -name '*.json' -o -name '*.md' \) -not -path '*/capture/*' -not -path '*/blobs/*' | tar czf /tmp/box/rel_meta_now.tar.gz -T -)
[ -f /tmp/box/COMPACTED ] && tar czf $OUT/small.tgz -C /tmp small
cd /tmp/box && tar czf $OUT/box.tgz . ; ls -la $OUT
