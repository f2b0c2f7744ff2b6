#!/usr/bin/env bash
# Set up everything the test suite needs on a fresh Debian/Ubuntu machine, then run all of it:
# unit tests, the course notebooks under nbval, and the JupyterLab browser test in headless Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."

# CPU build of torch, pinned: an unpinned torch would pull a multi-GB CUDA build.
# Pinned in the same install as scalekit, so that no dependency (torchao, peft, transformers, ...) can move it.
python3 -m pip install --quiet "torch==2.13.0" -e ".[test]"

# The browser test drives Debian's Chromium through Playwright (no browser download).
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi

# Byte-compiled once here, as a non-editable pip install would: where PYTHONDONTWRITEBYTECODE is set (it is on
# these machines) every fresh interpreter the tests start (CLI runs, launched ranks, benchmarks) would otherwise
# compile scalekit's modules again, 0.2-0.3 s of CPU each.
python3 -m compileall -q -j 0 scalekit tests benchmarks tools >/dev/null

export SCALEKIT_CACHE="${SCALEKIT_CACHE:-$(mktemp -d)}"
# one worker per core (pytest-xdist), each test file and each notebook kept whole on one worker (a notebook's cells
# share one kernel), in the order collected: the forking test files go first, before anything in their worker imports
# bitsandbytes (xdist would otherwise send the files with the most tests first)
python3 -m pytest -n "${SCALEKIT_TEST_WORKERS:-auto}" --dist loadfile --no-loadscope-reorder --nbval-lax tests notebooks "$@"
