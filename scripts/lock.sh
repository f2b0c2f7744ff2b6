#!/usr/bin/env bash
# Regenerate requirements/lock.txt, the exact versions the test set-up and the course install (scripts/test.sh,
# .ci/run, binder/): every package that pyproject.toml's dependencies and extras (all of them) bring, and torch's
# CPU build (requirements/torch-cpu.in), resolved by pip-tools' pip-compile on Linux x86_64 and Python 3.11, the
# machines the suite runs on.
#
#   bash scripts/lock.sh                      # re-resolve everything to the newest releases
#   bash scripts/lock.sh --upgrade-package X  # move one package, keep the rest (any pip-compile option passes on)
#
# The package's own dependency ranges (pyproject.toml) stay open: a library does not cap its users; only the test
# and course set-up is locked.  pip-tools runs from a throwaway virtual environment, so nothing here changes.
set -euo pipefail
cd "$(dirname "$0")/.."
PIP_TOOLS_VERSION=7.7.0
venv="$(mktemp -d)"
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet "pip-tools==$PIP_TOOLS_VERSION"
# Without --upgrade, pip-compile keeps what the existing lock pins where it still satisfies the inputs.
# --allow-unsafe: setuptools too (torch requires it at run time), which pip-compile leaves out by default.
CUSTOM_COMPILE_COMMAND="bash scripts/lock.sh" "$venv/bin/pip-compile" --quiet --all-extras --strip-extras \
    --no-emit-index-url --no-emit-find-links --allow-unsafe --resolver backtracking \
    --output-file requirements/lock.txt "$@" pyproject.toml requirements/torch-cpu.in
# scalekit itself (its test extra names its other extras) is the project, installed editable: not a pin
sed -i '/^scalekit @ /d' requirements/lock.txt
