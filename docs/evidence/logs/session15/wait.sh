#!/bin/bash
# Wait (at most $1 s) for /tmp/box/$2, then hand back what the driver has so far.
set -u; T0=$(date +%s); lim=${1:-560}; flag=${2:-DONE}
while [ ! -f /tmp/box/$flag ] && [ $(( $(date +%s) - T0 )) -lt $lim ]; do sleep 3; done
date -u; cat /tmp/box/driver.log; tail -n 3 /tmp/box/publish.log 2>/dev/null | cut -c1-300
grep -E '"coverage"|"inside"|"compared"|median_half' /tmp/box/reproduce.json 2>/dev/null | head
grep -E "median_alternation|alternation_over_within" /tmp/box/replicate_structure.json 2>/dev/null | head -20
tail -n 4 /tmp/box/verify.log 2>/dev/null | cut -c1-300
# The release's index (published figures, each verification appended) comes back with every
# call: a machine lost before the driver ends keeps what it had (session 15 lost it).
[ -d /tmp/rel ] && (cd /tmp/rel && find . \( -name '*.json' -o -name '*.md' \) -not -path '*/capture/*' -not -path '*/blobs/*' | tar czf /tmp/box/rel_meta_now.tar.gz -T -)
cd /tmp/box && tar czf $OUT/box.tgz . ; ls -la $OUT
