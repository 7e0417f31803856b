#!/bin/bash
# As run at 00:02 UTC (refused): KPAIR_DRIVER_END=200 KPAIR_TOP=3 KPAIR_FILTER='^triton_.*threshold_backward' bash .gpu_tmp/call1.sh
# Session 19, second machine (started afresh), after the fix that proves every candidate's
# poisons with ref's control and checks ref under the very poison opt had on a mutated input:
# the GPU trust tests (with the CUDA twin of the case, huge_keep), then kpair optimize on
# resnet18 alone with reproduce.py's flags (in the first machine's publish, 12 honest retunes
# of its batch-norm kernels were rejected as opt_determinism or differential), then verify
# with the time left.
cd /tmp/k; B=/tmp/box; mkdir -p $B; T0=$(date +%s); END=${KPAIR_DRIVER_END:-360}
s() { echo "$(date -u +%T) $*" >> $B/driver.log; }
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1); s "gpu $GPU"
s tests; KPAIR_EVIDENCE=$B/gpu-tests.jsonl timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short \
  tests/gpu/test_cuda_trust.py -k "fragmented or never_judged" > $B/pytest.log 2>&1
s "tests rc $? $(tail -n 1 $B/pytest.log)"
s optimize; timeout $(( END - 5 - ($(date +%s) - T0) )) python3 -m kpair optimize -o /tmp/rel --work /tmp/rel.work-resnet18. --prefix resnet18. --top ${KPAIR_TOP:-13} \
  --kernel-filter "${KPAIR_FILTER:-^triton_}" --strategy triton --triton-limit 5 --keep 1 --prune-max-blocks 12 --prune-time-cap 0.5 \
  --time-cap 2 --timeout 60 --seed 1 -- python3 benchmarks/programs/torchvision_model.py > $B/publish.log 2>&1
s "optimize rc $?"
LEFT=$(( END - ($(date +%s) - T0) ))
if [ $LEFT -gt 30 ]; then
  s verify; timeout $LEFT python3 benchmarks/reproduce.py verify /tmp/rel --times 6 --out $B/reproduce.json > $B/verify.log 2>&1
  s "verify rc $?"
fi
s done; touch $B/DONE
