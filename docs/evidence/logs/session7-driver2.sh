#!/bin/bash
# Session 7 lease 2 driver: issue 22's run through MCP only (benchmarks/mcp_device_run.sh).
cd /tmp/k; B=/tmp/box; mkdir -p $B /tmp/mcpout
s() { echo "$(date -u +%T) $*" >> $B/driver.log; }
s mcp; OUT=/tmp/mcpout BUDGET_S=${BUDGET_S:-340} bash benchmarks/mcp_device_run.sh .mcp-wheels .whl > $B/mcp_run.out 2>&1
s "mcp rc $?"; cp /tmp/mcpout/* $B/ 2>/dev/null
s done; touch /tmp/DONE
