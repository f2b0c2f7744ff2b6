"""The C++ compiler torch.compile's CPU backend runs, as inductor chooses it, and what that choice costs.

Inductor runs one compiler: its `cpp.cxx` setting, which it reads from CXX when it is imported (g++ by default,
clang++ on macOS). It does not fall back to a c++ or clang++ found elsewhere on PATH, so neither does this.

Inductor tells GCC from clang by the compiler's *name* (`torch._inductor.cpp_builder._is_gcc` and `_is_clang`;
`gcc_by_name` below follows them, and tests/project/test_cxx.py fails if torch changes them). A GCC under another name,
such as Debian's `c++`, still compiles, but inductor then writes its precompiled header in clang's format (`.pch`),
which GCC ignores: every CPU kernel parses torch's headers again (measured here with GCC 12: 0.5 s of CPU per
kernel with the header, 1.8 s without it).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys


def compiler_names() -> tuple[str, ...]:
    """The names inductor tries, in its order: its `cpp.cxx` setting once inductor is imported (a user may set it
    there), else what that setting will read from the environment."""
    cxx = inductor_setting()
    if cxx is not None:
        return tuple(c for c in (cxx if isinstance(cxx, (list, tuple)) else (cxx,)) if c)
    return (os.environ.get("CXX", "clang++" if sys.platform == "darwin" else "g++"),)


def inductor_setting():
    """Inductor's `cpp.cxx` setting, or None when it is not set: inductor not imported yet, or the setting missing
    or hidden (torch's config module hides a setting that was deleted, as a test framework's undo can do), in
    which case inductor's own default, read from CXX, is what holds."""
    config = sys.modules.get("torch._inductor.config")
    if config is None:
        return None
    try:
        return config.cpp.cxx
    except Exception:  # noqa: BLE001 - whatever a config proxy raises, the setting is unreadable, so not set
        return None


def found() -> tuple[str, str] | None:
    """(name, path) of the compiler torch.compile's CPU backend will run: the first of its names on PATH."""
    for name in compiler_names():
        if path := shutil.which(name):
            return name, path
    return None


def c_compiler() -> str | None:
    """Path of the compiler torch.compile's CPU backend will run, or None when none of its names is on PATH."""
    compiler = found()
    return compiler[1] if compiler else None


def gcc_by_name(name: str) -> bool:
    """Whether inductor takes the compiler called `name` for GCC (and so writes a precompiled header GCC reads)."""
    if re.search(r"(clang|clang\+\+)", name):
        return False
    return bool(re.search(r"(gcc|g\+\+|gnu-c\+\+)", name))


def version_text(path: str) -> str:
    """What `path --version` prints ('' when it does not answer)."""
    try:
        return subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def is_gcc(version: str) -> bool:
    """Whether a compiler that printed `version` for --version is GCC, whatever its name."""
    return "Free Software Foundation" in version and "clang" not in version.lower()


def unavailable_reason() -> str:
    """Why torch.compile cannot compile for the CPU here ('' when a compiler is there), with the fix."""
    if found():
        return ""
    tried = compiler_names()
    names = " or ".join(repr(n) for n in tried)
    others = [n for n in ("g++", "clang++", "c++") if n not in tried and shutil.which(n)]
    fix = f"; {others[0]} is: set CXX={others[0]}" if others else "; install g++"
    if not names:
        return f"torch.compile on CPU runs the compiler CXX names, and CXX is empty{fix}"
    return f"torch.compile on CPU runs {names} (set by CXX, g++ by default), which is not on PATH{fix}"


def describe() -> str:
    """One line for `scalekit doctor`: which compiler, and whether its precompiled header is used."""
    if not (compiler := found()):
        return f"none: {unavailable_reason()}"
    name, path = compiler
    version = version_text(path)
    line = f"{path} ({version.splitlines()[0] if version else 'no answer to --version'})"
    if not gcc_by_name(name) and is_gcc(version):
        line += (f"; this GCC is named {name!r}, which torch does not read as GCC: it writes its precompiled header "
                 "in clang's format, which GCC ignores, so every CPU kernel parses torch's headers again (about "
                 "3x the CPU per kernel); set CXX=g++")
    return line
