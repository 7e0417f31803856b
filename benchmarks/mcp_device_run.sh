#!/bin/bash
# Issue 22's GPU run in one device call, through MCP only: the scripted agent
# (benchmarks/mcp_agent.py --backend cuda) starts `kpair mcp` over stdio, captures a
# torch.compile'd program with the `capture` tool, describes its Triton kernels, submits PTX
# and Triton candidates, confirms the best in full and publishes a winner.
#
#   OUT=DIR bash benchmarks/mcp_device_run.sh WHEELS [MORE_WHEELS ...]
#
# The device has no network: the MCP SDK and its dependencies come as wheels from WHEELS
# (e.g. .mcp-wheels, made with `pip download --only-binary=:all: --python-version 3.12 ...
# 'mcp>=2,<3'`), installed with pip --no-index into a --target folder put on PYTHONPATH
# (skipped when mcp 2.x is already importable); kpair's own dependencies missing from the
# image (zstandard, msgspec, pyelftools, pyseccomp) are installed the same way from any of
# the folders given (e.g. .whl).
#
# Environment: OUT (required; what comes back), BUDGET_S (seconds for the agent's loop,
# capture included, default 380: exploring stops in time to confirm and publish; the agent
# is killed at BUDGET_S + 70), AGENT_ARGS (more agent options, e.g. "--per-operator 8"),
# PYTHON (default python3), SITE and W (the install and work folders, under /tmp), BACKEND
# (default cuda; host runs the same script on a machine without a GPU).
#
# $OUT gets at most 5 files, each written as soon as its step ends (a later failure keeps
# them): run.log (this script's progress and the summary's key lines), mcp_agent.json (the
# agent's summary, rewritten after every step: each candidate's verdict and seconds, the
# median seconds per candidate after setup, the SOL check, the full runs, what was
# published, the issue's checks), agent.log (the agent's progress; the server's stderr),
# pip.log, mcp_work.tgz (attempts.jsonl and result.json of every evaluation, the release's
# index and report, the capture summary and logs; no blobs, no samples, no candidates).
set -u
OUT=${OUT:?set OUT to the folder that comes back}
[ $# -ge 1 ] || { echo "usage: OUT=DIR $0 WHEELS [MORE_WHEELS ...]" >&2; exit 2; }
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-380}
SITE=${SITE:-/tmp/kpair-mcp-site}
W=${W:-/tmp/kpair-mcp-work}
BACKEND=${BACKEND:-cuda}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
links=()
for d in "$@"; do
  [ -d "$d" ] || { echo "no wheel folder $d"; exit 2; }
  links+=(--find-links "$(cd "$d" && pwd)")
done
export PYTHONUNBUFFERED=1
say() { echo "[run $(date -u +%H:%M:%S) +$((SECONDS))s] $*"; }

install() {  # pip install --no-index from the wheel folders into $SITE (2 minutes at most)
  timeout -k 5 120 "$PY" -m pip install --no-index "${links[@]}" --no-compile --no-cache-dir \
    --upgrade --target "$SITE" "$@" >> "$OUT/pip.log" 2>&1
}
say "start; $("$PY" --version 2>&1); backend $BACKEND; budget ${BUDGET_S}s"
export PYTHONPATH="$ROOT/src:$SITE${PYTHONPATH:+:$PYTHONPATH}"
if "$PY" -c 'import sys, importlib.metadata as m; sys.exit(m.version("mcp").split(".")[0] != "2")' \
    2> /dev/null; then
  say "mcp 2.x is already installed"
else
  install 'mcp>=2,<3' || { say "pip could not install mcp from $*:"; tail -n 20 "$OUT/pip.log"
                           exit 3; }
fi
missing=$("$PY" - <<'PYEOF'
import importlib.util
need = {"zstandard": "zstandard", "msgspec": "msgspec", "elftools": "pyelftools",
        "pyseccomp": "pyseccomp"}
print(" ".join(p for m, p in need.items() if importlib.util.find_spec(m) is None))
PYEOF
)
if [ -n "$missing" ]; then
  say "kpair's dependencies missing from the image: $missing (installing from the wheels)"
  # shellcheck disable=SC2086  # one package a word
  install --no-deps $missing || { say "pip could not install $missing:"
                                  tail -n 20 "$OUT/pip.log"; exit 3; }
fi
timeout 60 "$PY" -c 'import mcp, kpair, elftools, zstandard, msgspec, importlib.metadata as m
print("mcp", m.version("mcp"), "kpair", kpair.__file__)' || exit 3
if [ "$BACKEND" = cuda ]; then
  timeout 30 nvidia-smi --query-gpu=name,driver_version,utilization.gpu --format=csv,noheader
  timeout 120 "$PY" -c 'import torch, triton; print("torch", torch.__version__, "triton", \
triton.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
  timeout 30 "$PY" -c 'from kpair.ptx import find_cuda_tools, tool_release
for t in ("ptxas", "cuobjdump", "nvdisasm"):
    print(t, [(p, tool_release(p)) for p in find_cuda_tools(t)])'
fi
say "installed"

rm -rf "$W" && mkdir -p "$W"
pack() {  # what the server wrote, small files only, into $OUT/mcp_work.tgz
  local files=() f
  for f in "$W"/mcp/*/evaluations "$W"/mcp/*/ref-ptx "$W"/release "$W"/capture/capture.json \
           "$W"/capture/profile.json "$W"/capture/*/snapshot.json "$W"/mcp/logs; do
    [ -e "$f" ] && files+=("${f#"$W"/}")
  done
  [ ${#files[@]} -gt 0 ] && timeout 60 tar czf "$OUT/mcp_work.tgz.tmp" -C "$W" \
    --exclude=blobs --exclude=samples.npz --exclude='*.lock' --exclude='*.cubin' \
    --exclude=__pycache__ "${files[@]}" && mv "$OUT/mcp_work.tgz.tmp" "$OUT/mcp_work.tgz"
}
# The agent stops exploring in time and writes its JSON after every step; the timeout is
# the backstop (SIGTERM: the agent writes its JSON once more and stops).
say "agent starts (log: agent.log; summary: mcp_agent.json)"
# shellcheck disable=SC2086  # AGENT_ARGS: several words
timeout -k 15 $(( BUDGET_S + 70 )) "$PY" "$ROOT/benchmarks/mcp_agent.py" --backend "$BACKEND" \
  --work "$W" --json "$OUT/mcp_agent.json" --budget-s "$BUDGET_S" ${AGENT_ARGS:-} \
  > /dev/null 2> "$OUT/agent.log"
rc=$?
say "agent exit status $rc"
pack
rm -f "$OUT/mcp_agent.json.tmp"
timeout 30 "$PY" - "$OUT/mcp_agent.json" <<'PYEOF'
import json, sys
try:
    s = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    sys.exit(f"no agent summary: {e}")
keys = ("error", "setup_s", "capture", "candidates_submitted", "operators_with_candidates",
        "operators_judged", "ptx_candidates", "ptx_judged", "triton_judged", "verdicts",
        "judged_by", "median_s_per_candidate", "median_s_per_candidate_by_form",
        "median_build_s", "median_judge_s", "median_s_per_full_candidate", "abi_check",
        "sol_check", "total_s", "issue_22")
print(json.dumps({k: s.get(k) for k in keys if k in s}, indent=1)[:6000])
for op, d in (s.get("describe") or {}).items():
    print("describe", op, {k: d.get(k) for k in ("kernel", "ref_time_us", "sol", "ptx_from",
                                                 "sass_from", "candidates_planned", "error")})
print("published:", [(p["operator"], p.get("label"), p.get("published"),
                      p.get("summary") or p.get("error")) for p in s.get("published", [])])
PYEOF
grep -v '^kpair mcp:' "$OUT/agent.log" | tail -n 30
say "done; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
exit $rc
