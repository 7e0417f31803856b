#!/bin/bash
# The H200 evidence run of issue 12: `kpair optimize` on two programs nobody on the project
# wrote the kernels of (benchmarks/programs/), both into one release. A device call lasts at
# most 10 minutes and the whole job takes longer, so the job runs in its own process session
# and each call waits on it for a while, then packs what exists so far into $OUT:
#
#   bash benchmarks/optimize_device_run.sh start SECONDS   # start the job, then wait
#   bash benchmarks/optimize_device_run.sh wait SECONDS    # wait again (the next call)
#
# $OUT gets release.tgz (the release without snapshot blobs and raw samples; each program's
# capture.json, profile.json and snapshot manifests; the first build errors, if any) and
# job.log. Set TOP, LIMIT for smaller runs.
set -u
OUT=${OUT:?set OUT to the folder that comes back}
W=${W:-/tmp/kopt}
mode=${1:?start or wait}
secs=${2:-540}
export PYTHONUNBUFFERED=1

job() {
  common=(--top "${TOP:-12}" --kernel-filter '^triton_' --strategy triton
          --triton-limit "${LIMIT:-16}" --keep 2 --prune-max-blocks 12 --prune-time-cap 0.5
          --time-cap 2 --timeout 60 --seed 1)
  date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton, transformers, torchvision as tv; print('torch', \
torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, \
'torchvision', tv.__version__)"
  python3 -m kpair optimize -o "$W/rel" --work "$W/work-llm" --prefix llama. "${common[@]}" \
    -- python3 benchmarks/programs/hf_causal_lm.py
  echo "llm rc=$?"; date -u
  python3 -m kpair optimize -o "$W/rel" --work "$W/work-vision" --prefix resnet18. \
    "${common[@]}" -- python3 benchmarks/programs/torchvision_model.py
  echo "vision rc=$?"; date -u
  touch "$W/done"
}

if [ "$mode" = start ]; then
  rm -rf "$W" && mkdir -p "$W"
  export -f job; export W TOP LIMIT 2>/dev/null
  setsid bash -c job > "$W/job.log" 2>&1 < /dev/null &
fi
end=$((SECONDS + secs))
while [ ! -f "$W/done" ] && [ $SECONDS -lt $end ]; do sleep 5; done
[ -f "$W/done" ] && echo "job finished" || echo "job still running"
cp "$W/job.log" "$OUT/job.log"
files=()
for d in "$W"/rel "$W"/work-*/capture/capture.json "$W"/work-*/capture/profile.json \
         "$W"/work-*/capture/*/snapshot.json \
         $(ls "$W"/work-*/ops/*/builds/triton/*.error.txt 2>/dev/null | head -n 4); do
  [ -e "$d" ] && files+=("${d#$W/}")
done
[ ${#files[@]} -gt 0 ] && tar czf "$OUT/release.tgz" -C "$W" --exclude=blobs \
  --exclude=samples.npz --exclude='*.lock' "${files[@]}"
tail -n 40 "$W/job.log"
