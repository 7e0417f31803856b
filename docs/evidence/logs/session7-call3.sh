#!/bin/bash
# Session 7, lease 3 (one call): the gemm replay test with its reason, trust overhead after
# the host-side fixes, the CUDA demo test, then issue 22's MCP run again for its files.
set -u; T0=$(date +%s); W=$PWD
. .gpu_tmp/setup.sh; cd /tmp/k; cat .head; echo
timeout 30 python3 -m pytest -q -m gpu -p no:cacheprovider -rA --tb=short \
  "tests/gpu/test_cuda_replay.py::test_replay_reproduces_the_captured_post_state_byte_exact[gemm_tiled]" \
  > $OUT/pytest_gemm.log 2>&1; echo "gemm rc $?"; grep -E "^E " $OUT/pytest_gemm.log | head -8 | cut -c1-600
echo "gemm done at $(( $(date +%s) - T0 )) s"
timeout 70 python3 benchmarks/trust_overhead.py --backend cuda --repeat 3 --out $OUT/trust_overhead.json 2>&1 | grep -E "checked_over" | head -8
echo "overhead done at $(( $(date +%s) - T0 )) s"
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider -rA --tb=short -s \
  tests/gpu/test_cuda_demo.py > $OUT/pytest_demo.log 2>&1; echo "demo rc $?"
grep -E "^\[|published|refused|passed|failed" $OUT/pytest_demo.log | head -14 | cut -c1-300
echo "demo done at $(( $(date +%s) - T0 )) s"
mkdir -p /tmp/mcpout
OUT=/tmp/mcpout timeout 130 bash benchmarks/mcp_device_run.sh .mcp-wheels .whl > $OUT/mcp_run.out 2>&1
echo "mcp rc $?"; cp /tmp/mcpout/mcp_agent.json /tmp/mcpout/agent.log /tmp/mcpout/mcp_work.tgz $OUT/ 2>/dev/null
grep -E "median_s_per_candidate\"|candidates_submitted|ptx_judged|published:" $OUT/mcp_run.out | head
ls $OUT; echo "call ends at $(( $(date +%s) - T0 )) s"
