#!/usr/bin/env bash
# The GPU reference run on the reference machine: install the wheels brought along (the machine has no
# network and lacks bitsandbytes, torchao, hqq and the widget libraries), then run the reference script.
#   bash benchmarks/gpu_reference.sh OUT_DIR [--sections ...]
# Bring the wheels as benchmarks/gpu_reference.py's docstring says, into ./wheels beside the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -d wheels ] && ls wheels/*.whl >/dev/null 2>&1; then
    # --no-deps: never let a wheel replace the machine's own torch
    python3 -m pip install --quiet --no-index --no-deps --find-links wheels wheels/*.whl || \
        echo "gpu_reference.sh: some wheels did not install; the sections that need them will say so" >&2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1
exec python3 benchmarks/gpu_reference.py "$@"
