"""The code stays clean by the project's ruff settings (pyproject.toml)."""

import shutil
import subprocess
import sys

import pytest


def test_ruff_finds_nothing():
    if shutil.which("ruff") is None:
        pytest.fail("ruff is part of the test extra: pip install -e '.[test]'")
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "scalekit", "tests", "benchmarks", "tools", "scripts"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
