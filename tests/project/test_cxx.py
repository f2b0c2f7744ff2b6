"""The C++ compiler torch.compile's CPU backend runs: found as inductor finds it, and a GCC that inductor would not
recognise by its name is said, with its cost and the fix."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys

import pytest
import torch._inductor.config as inductor_config
from torch._inductor import cpp_builder

from scalekit.machine import cxx
from scalekit.toggles import TOGGLES
from tests.helpers import CPU

GXX = shutil.which("g++")


@pytest.fixture
def set_cxx():
    """Sets inductor's `cpp.cxx` for one test through torch's own config API, which restores it afterwards.
    (pytest's monkeypatch.setattr on a config proxy would, from pytest 9.2 on, *delete* the setting on undo, and
    torch's config module then hides it from every later reader in the process.)"""
    with contextlib.ExitStack() as stack:
        yield lambda value: stack.enter_context(inductor_config.patch({"cpp.cxx": value}))


@pytest.mark.skipif(sys.platform == "darwin", reason="on macOS inductor asks the compiler itself (Apple clang)")
@pytest.mark.parametrize("name", ["g++", "gcc", "/usr/bin/g++-12", "x86_64-conda-linux-gnu-c++", "/opt/gcc/bin/c++",
                                  "c++", "clang++", "/usr/bin/clang++-14", "icpx", "cc"])
def test_gcc_by_name_is_what_torchs_inductor_decides(name):
    # torch's private rule, which decides the precompiled header's format: if it changes, this fails
    assert cxx.gcc_by_name(name) == cpp_builder._is_gcc(name)


def test_the_compiler_is_inductors_setting_and_nothing_else_on_path(set_cxx):
    set_cxx((None, "no-such-compiler++"))
    assert cxx.compiler_names() == ("no-such-compiler++",) and cxx.c_compiler() is None
    ok, why = TOGGLES["compile"].available(CPU)
    assert not ok and "no-such-compiler++" in why and "not on PATH" in why and "CXX" in why
    if GXX:
        assert "set CXX=g++" in why


def test_before_inductor_is_imported_the_compiler_is_read_from_cxx(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch._inductor.config")
    monkeypatch.setenv("CXX", "no-such-compiler++")
    assert cxx.compiler_names() == ("no-such-compiler++",) and cxx.c_compiler() is None
    monkeypatch.delenv("CXX")
    assert cxx.compiler_names() == ("clang++" if sys.platform == "darwin" else "g++",)


@pytest.mark.skipif(GXX is None, reason="needs g++ on PATH")
def test_gcc_under_its_own_name_is_described_without_a_warning(set_cxx):
    set_cxx((None, "g++"))
    line = cxx.describe()
    assert line.startswith(GXX) and "precompiled header" not in line
    assert TOGGLES["compile"].available(CPU) == (True, "")


@pytest.mark.skipif(GXX is None, reason="needs g++ on PATH")
def test_a_compiler_under_another_name_is_said_to_lose_its_precompiled_header(set_cxx, tmp_path):
    renamed = tmp_path / "mycxx"
    os.symlink(GXX, renamed)  # what Debian's c++ is: GCC under a name without "g++" in it
    set_cxx((None, str(renamed)))
    assert cxx.c_compiler() == str(renamed) and not cpp_builder._is_gcc(str(renamed))
    line = cxx.describe()
    assert "precompiled header" in line and "set CXX=g++" in line and "mycxx" in line
    assert TOGGLES["compile"].available(CPU) == (True, "")  # it still compiles: slower, not broken


def test_an_empty_cxx_is_said_as_such(set_cxx):
    set_cxx((None, ""))  # what CXX= (set, empty) gives inductor
    assert cxx.compiler_names() == () and cxx.c_compiler() is None
    ok, why = TOGGLES["compile"].available(CPU)
    assert not ok and "CXX is empty" in why


def test_a_setting_torch_cannot_read_is_not_set(monkeypatch):
    class Unreadable:  # what torch's config proxy does once a setting was deleted: it hides it
        def __getattr__(self, name):
            raise AttributeError(f"torch._inductor.config.cpp.{name} does not exist")

    monkeypatch.setitem(sys.modules, "torch._inductor.config", type("Config", (), {"cpp": Unreadable()}))
    monkeypatch.setenv("CXX", "no-such-compiler++")
    assert cxx.compiler_names() == ("no-such-compiler++",)  # inductor's default: what CXX says
    monkeypatch.delenv("CXX")
    assert cxx.compiler_names() == ("clang++" if sys.platform == "darwin" else "g++",)
    if GXX:
        assert TOGGLES["compile"].available(CPU) == (True, "")
