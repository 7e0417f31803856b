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
# 'mcp>=2,<3'`), installed with pip --no-index into a --target folder put on PYTHONPATH;
# kpair's own dependencies missing from the image (zstandard, msgspec, pyelftools) are
# installed the same way from any of the folders given.
#
# Environment: OUT (required; what comes back), BUDGET_S (seconds for the agent's loop,
# default 420: exploring stops in time to confirm and publish), AGENT_ARGS (more agent
# options, e.g. "--top 4 --per-operator 8"), PYTHON (default python3), SITE and W (the
# install and work folders, under /tmp), BACKEND (default cuda; host runs the same script
# on a machine without a GPU).
#
# $OUT gets mcp_agent.json (the agent's summary: every candidate's verdict and seconds, the
# median seconds per candidate after setup, the full runs, what was published), agent.log
# (its progress and the server's), pip.log and mcp_work.tgz (attempts.jsonl and result.json
# of every evaluation, the release's index and report, the capture summary; no blobs, no
# samples, no candidate binaries).
set -u
OUT=${OUT:?set OUT to the folder that comes back}
[ $# -ge 1 ] || { echo "usage: OUT=DIR $0 WHEELS [MORE_WHEELS ...]" >&2; exit 2; }
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-420}
SITE=${SITE:-/tmp/kpair-mcp-site}
W=${W:-/tmp/kpair-mcp-work}
BACKEND=${BACKEND:-cuda}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
links=()
for d in "$@"; do
  [ -d "$d" ] || { echo "no wheel folder $d" >&2; exit 2; }
  links+=(--find-links "$(cd "$d" && pwd)")
done
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"

install() {  # pip install --no-index from the wheel folders into $SITE
  "$PY" -m pip install --no-index "${links[@]}" --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$@" >> "$OUT/pip.log" 2>&1
}
date -u
"$PY" --version
install 'mcp>=2,<3' || { echo "pip could not install mcp from $*:"; tail -n 20 "$OUT/pip.log"
                         exit 3; }
missing=$("$PY" - <<'EOF'
import importlib.util
need = {"zstandard": "zstandard", "msgspec": "msgspec", "elftools": "pyelftools"}
print(" ".join(p for m, p in need.items() if importlib.util.find_spec(m) is None))
EOF
)
if [ -n "$missing" ]; then
  echo "kpair's dependencies missing from the image: $missing (installing from the wheels)"
  # shellcheck disable=SC2086  # one package a word
  install $missing || { echo "pip could not install $missing:"; tail -n 20 "$OUT/pip.log"
                        exit 3; }
fi
export PYTHONPATH="$ROOT/src:$SITE${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c 'import mcp, kpair, importlib.metadata as m; print("mcp", m.version("mcp"), "kpair",
kpair.__file__)' || exit 3
if [ "$BACKEND" = cuda ]; then
  nvidia-smi --query-gpu=name,driver_version,utilization.gpu --format=csv,noheader
  "$PY" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
fi
echo "installed in $(( SECONDS ))s; agent budget ${BUDGET_S}s"

rm -rf "$W" && mkdir -p "$W"
# The agent stops exploring in time; the timeout is the backstop (its JSON is written even
# when it is cut short by an error).
# shellcheck disable=SC2086  # AGENT_ARGS: several words
timeout -k 10 $(( BUDGET_S + 120 )) "$PY" "$ROOT/benchmarks/mcp_agent.py" --backend "$BACKEND" \
  --work "$W" --json "$OUT/mcp_agent.json" --budget-s "$BUDGET_S" ${AGENT_ARGS:-} \
  > /dev/null 2> "$OUT/agent.log"
rc=$?
echo "agent exit status $rc after $(( SECONDS ))s"

files=()
for f in "$W"/mcp/*/evaluations "$W"/release "$W"/capture/capture.json \
         "$W"/capture/profile.json "$W"/capture/*/snapshot.json "$W"/mcp/logs; do
  [ -e "$f" ] && files+=("${f#"$W"/}")
done
[ ${#files[@]} -gt 0 ] && tar czf "$OUT/mcp_work.tgz" -C "$W" --exclude=blobs \
  --exclude=samples.npz --exclude='*.lock' "${files[@]}"
"$PY" - "$OUT/mcp_agent.json" <<'EOF'
import json, sys
try:
    s = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    sys.exit(f"no agent summary: {e}")
keys = ("error", "setup_s", "candidates_submitted", "operators_with_candidates",
        "ptx_candidates", "verdicts", "judged_by", "median_s_per_candidate", "median_build_s",
        "median_judge_s", "median_s_per_full_candidate", "total_s")
print(json.dumps({k: s.get(k) for k in keys if k in s}, indent=1))
print("published:", [(p["operator"], p.get("published"), p.get("summary") or p.get("error"))
                     for p in s.get("published", [])])
EOF
grep -v '^kpair mcp:' "$OUT/agent.log" | tail -n 25
exit $rc
