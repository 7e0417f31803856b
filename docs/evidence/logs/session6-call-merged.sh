#!/bin/bash
# Last call, a fresh machine: the merged tree's GPU tests, the compact release re-verified
# twice (replicates now renew the regions' pages), and a profile of one checked run.
set -u; T0=$(date +%s); W=$PWD
. .gpu_tmp/setup.sh; cd /tmp/k; cat .head; echo
KPAIR_EVIDENCE=$OUT/gpu-tests.jsonl timeout 115 python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/gpu/test_cuda_trust.py tests/gpu/test_cuda_replay.py tests/gpu/test_optimize.py 2>&1 | tail -25 | tee $OUT/pytest.log
echo "tests done at $(( $(date +%s) - T0 )) s"
cp -r benchmarks/results/reproduce_small_h200 /tmp/small
timeout 45 python3 benchmarks/reproduce.py verify /tmp/small --times 2 --no-identical --out $OUT/reproduce_small_renew.json 2>&1 | grep -E '^verify|coverage' 
cp /tmp/small/index.json $OUT/small_index.json
echo "verify done at $(( $(date +%s) - T0 )) s"
timeout 25 python3 $W/.gpu_tmp/profile_checked.py > $OUT/profile.txt 2>&1; head -3 $OUT/profile.txt | cut -c1-400
echo "call ends at $(( $(date +%s) - T0 )) s"
