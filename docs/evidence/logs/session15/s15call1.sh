#!/bin/bash
# Session 15, call 1: GPU tests of checks/trust/hostile/replay at HEAD, trust overhead
# (repeat 5; issue 19), then run_level.py on the committed compact release's operators with
# ref <= 12 us (issue 20: is the run-level shift of short kernels a process-level effect?).
set -u; T0=$(date +%s)
. .gpu_tmp/setup.sh; cd /tmp/k; cat .head; echo
KPAIR_EVIDENCE=$OUT/gpu-tests.jsonl timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short \
  tests/gpu/test_cuda_checks.py tests/gpu/test_cuda_trust.py tests/gpu/test_cuda_hostile.py \
  "tests/gpu/test_cuda_replay.py::test_replay_reproduces_the_captured_post_state_byte_exact[gemm_tiled]" \
  > $OUT/pytest.log 2>&1; echo "pytest rc $?"; tail -n 8 $OUT/pytest.log | cut -c1-400
timeout 130 python3 benchmarks/trust_overhead.py --backend cuda --repeat 5 --case axpbyz_3x16M --case axpy_8M --out $OUT/trust_overhead.json > $OUT/overhead.log 2>&1
echo "overhead rc $?"; grep -E '"(axpy_8M|axpbyz_3x16M)"|checked_over' $OUT/trust_overhead.json
echo "at $(( $(date +%s) - T0 )) s"
left=$(( 580 - ($(date +%s) - T0) ))
timeout $left python3 benchmarks/run_level.py benchmarks/results/reproduce_small_h200 --max-ref-us 12 \
  --runs 4 --replicates 6 --out $OUT/run_level.json > $OUT/run_level.log 2>&1
echo "run_level rc $?"; tail -n 5 $OUT/run_level.log | cut -c1-300
python3 - <<'P' 2>/dev/null
import json,os; d=json.load(open(os.environ["OUT"]+"/run_level.json"))
for n,o in d["operators"].items(): print(n[:30], o["ref_us"], {k:(round(v,3) if isinstance(v,float) else v) for k,v in o.items() if k.startswith(("ratio","sd_","predicted"))})
P
echo "done at $(( $(date +%s) - T0 )) s"
