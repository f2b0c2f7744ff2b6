"""No test leaves a library's global state changed, and scalekit reads a library's state it did not expect
without raising.

pytest 9.2's `monkeypatch.setattr` deletes, on undo, an attribute that was not in the target's instance
`__dict__`; on torch's config proxies that deletion hides the setting for the rest of the process.  The suite
patches torch's config through torch's own `config.patch(...)`, and conftest's `_library_state_kept` fails any test
after which torch's configuration, precision or thread settings differ from before it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

AFTER_TEST_CXX = textwrap.dedent("""
    import shutil, sys
    import pytest
    exit_code = pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:xdist", "tests/project/test_cxx.py"])
    from scalekit.machine import cxx
    from scalekit.toggles import TOGGLES
    from tests.helpers import CPU
    import torch._inductor.config as inductor_config
    print("after test_cxx:", exit_code, inductor_config.cpp.cxx, TOGGLES["compile"].available(CPU))
    assert exit_code == 0
    assert inductor_config.cpp.cxx[-1] == "g++"
    if shutil.which("g++"):
        assert TOGGLES["compile"].available(CPU) == (True, "")
    # what an undo by deletion does to torch's config: the setting is hidden; scalekit reads inductor's default
    delattr(inductor_config.cpp, "cxx")
    print("hidden:", cxx.compiler_names(), TOGGLES["compile"].available(CPU))
    assert cxx.compiler_names() == ("g++",)
    print("OK")
""")


def test_test_cxx_then_a_compile_availability_check_in_one_process():
    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT")}
    done = subprocess.run([sys.executable, "-c", AFTER_TEST_CXX], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.rstrip().endswith("OK"), done.stdout[-3000:] + done.stderr[-3000:]


def test_the_state_guard_sees_a_changed_setting(library_state):
    import torch._dynamo.config as dynamo_config

    before = library_state()
    with dynamo_config.patch(cache_size_limit=dynamo_config.cache_size_limit + 1):
        assert library_state() != before  # the guard would fail a test that left this behind
    assert library_state() == before


def test_torchaos_inductor_flags_hold_for_the_run_only():
    import contextlib

    import torch._inductor.config as inductor_config

    from scalekit.toggles.quantize import keep_inductor_config

    before = inductor_config.get_config_copy()
    with contextlib.ExitStack() as run_stack:
        keep_inductor_config(run_stack)
        inductor_config.coordinate_descent_tuning = not before["coordinate_descent_tuning"]  # as torchao's setter does
        assert inductor_config.get_config_copy() != before
    assert inductor_config.get_config_copy() == before


def monkeypatched_targets(source: str) -> list[str]:
    """The first argument of every monkeypatch.setattr / delattr call in `source`, as written."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args
                and node.func.attr in ("setattr", "delattr") and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "monkeypatch"):
            found.append(ast.unparse(node.args[0]))
    return found


def test_no_test_monkeypatches_torchs_config():
    # torch's config modules are proxies: restore them through their own patch(), never monkeypatch
    offenders = [f"{path.name}: monkeypatch of {target}" for path in sorted(ROOT.joinpath("tests").rglob("*.py"))
                 for target in monkeypatched_targets(path.read_text())
                 if "config" in target.lower() and "conftest" not in target]
    assert not offenders, offenders
    assert monkeypatched_targets("monkeypatch.setattr(inductor_config.cpp, 'cxx', 1)") == ["inductor_config.cpp"]
