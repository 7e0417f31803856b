# sourced from the tree's root: copy the tree to /tmp/k once per commit, install wheels, paths
if [ ! -f /tmp/k/.head ] || [ "$(cat /tmp/k/.head)" != "$(cat .gpu_tmp/head)" ]; then
  rm -rf /tmp/k && mkdir -p /tmp/k && cp -a . /tmp/k/ && cp .gpu_tmp/head /tmp/k/.head
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/k/.whl/*.whl || exit 3
fi
export PYTHONPATH=/tmp/site:/tmp/k/src PYTHONUNBUFFERED=1
date -u; nvidia-smi --query-gpu=name,driver_version,uuid,utilization.gpu --format=csv,noheader
nvidia-smi --query-compute-apps=pid,name --format=csv,noheader
