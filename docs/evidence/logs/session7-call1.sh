#!/bin/bash
# Session 7, lease 1, call 1: the whole GPU suite (full tracebacks), trust overhead, a profile,
# then the reproduction driver in the background.
set -u; T0=$(date +%s); W=$PWD
. .gpu_tmp/setup.sh; cd /tmp/k; cat .head; echo
KPAIR_EVIDENCE=$OUT/gpu-tests.jsonl timeout 230 python3 -m pytest -q -m gpu -p no:cacheprovider \
  -rfE --tb=long tests/gpu > $OUT/pytest.log 2>&1; echo "pytest rc $?"
grep -E "passed|failed|^FAILED|^ERROR|Error:|error:" $OUT/pytest.log | tail -30 | cut -c1-300
echo "tests done at $(( $(date +%s) - T0 )) s"
timeout 150 python3 benchmarks/trust_overhead.py --backend cuda --repeat 3 --out $OUT/trust_overhead.json 2>&1 | tail -12 | cut -c1-300
echo "overhead done at $(( $(date +%s) - T0 )) s"
timeout 40 python3 $W/.gpu_tmp/profile_checked.py > $OUT/profile.txt 2>&1; head -3 $OUT/profile.txt | cut -c1-400
echo "profile done at $(( $(date +%s) - T0 )) s"
cp $W/.gpu_tmp/driver7.sh /tmp/driver.sh; rm -f /tmp/DONE
setsid nohup bash /tmp/driver.sh > /tmp/driver.out 2>&1 < /dev/null & disown
sleep 20; cat /tmp/box/driver.log; tail -3 /tmp/box/publish.log
echo "call ends at $(( $(date +%s) - T0 )) s"
