"""The test set-up is locked: requirements/lock.txt (pip-compile's output, `bash scripts/lock.sh`) pins every
package that pyproject.toml declares, in its dependencies and in every extra, to one exact version, and the
installers (scripts/test.sh, so .ci/run; binder/) install through it.  pyproject.toml's own ranges stay open."""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import sysconfig
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "lock.txt"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def lock_pins(text: str) -> dict[str, Version]:
    """name -> the exact version a lock file pins (every requirement line must be `name==version`)."""
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        req = Requirement(line)
        specs = list(req.specifier)
        assert len(specs) == 1 and specs[0].operator == "==", f"{LOCK.name}: {line!r} is not an exact pin"
        pins[canonicalize_name(req.name)] = Version(specs[0].version)
    return pins


def declared() -> list[tuple[str, Requirement]]:
    """(where, requirement) for the dependencies and every extra, the package's own extras left out."""
    found = [("dependencies", Requirement(r)) for r in PROJECT["dependencies"]]
    for extra, reqs in PROJECT["optional-dependencies"].items():
        found += [(f"extra {extra!r}", Requirement(r)) for r in reqs]
    return [(where, req) for where, req in found if canonicalize_name(req.name) != canonicalize_name(PROJECT["name"])]


def unpinned(pins: dict[str, Version]) -> list[str]:
    return [f"{req} ({where})" for where, req in declared() if canonicalize_name(req.name) not in pins]


def test_every_declared_package_is_pinned_by_the_lock():
    missing = unpinned(lock_pins(LOCK.read_text()))
    assert not missing, (f"pyproject.toml names packages requirements/lock.txt does not pin: {missing}; run "
                         "`bash scripts/lock.sh` (DEVELOPERS.md)")


def test_a_package_missing_from_the_lock_is_caught():
    pins = lock_pins(LOCK.read_text())
    some = canonicalize_name(declared()[-1][1].name)
    assert unpinned({name: v for name, v in pins.items() if name != some}), "the check above could not fail"


def test_the_locked_versions_satisfy_the_declared_ranges():
    pins = lock_pins(LOCK.read_text())
    outside = [f"{req} ({where}) but the lock pins {pins[canonicalize_name(req.name)]}" for where, req in declared()
               if canonicalize_name(req.name) in pins
               and not req.specifier.contains(pins[canonicalize_name(req.name)], prereleases=True)]
    assert not outside, outside


def test_torch_is_the_cpu_build_the_installers_name():
    torch = lock_pins(LOCK.read_text())["torch"]
    assert torch.local == "cpu", f"the lock must pin torch's CPU build (a CUDA build is several GB), got {torch}"
    for installer in ("scripts/test.sh", "binder/requirements.txt"):
        named = re.search(r"torch==([\w.+]+)", (ROOT / installer).read_text()).group(1)
        assert Version(named).public == torch.public, f"{installer} names torch {named}, the lock {torch}"


def test_the_installers_install_through_the_lock():
    test_sh = (ROOT / "scripts" / "test.sh").read_text()
    assert re.search(r'pip install [^\n]*-c requirements/lock\.txt[^\n]*-e "\.\[test\]"', test_sh)
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    binder = [line.strip() for line in (ROOT / "binder" / "requirements.txt").read_text().splitlines()]
    assert "-c ../requirements/lock.txt" in binder  # pip reads a nested file's path from the file's own folder
    assert (ROOT / "binder" / "../requirements/lock.txt").resolve() == LOCK


def test_the_package_itself_caps_nothing():
    # a library does not cap its users: exact pins and upper bounds belong to the lock alone
    capped = [f"{req} ({where})" for where, req in declared()
              if any(spec.operator in ("==", "===", "<", "<=", "~=") for spec in req.specifier)]
    assert not capped, capped


def site_dirs() -> list[str]:
    """Where pip installs: the environment's site-packages.  (Not all of sys.path: setuptools puts its own vendored
    copies of packaging, platformdirs, ... on it once imported, which pip never installed.)"""
    paths = sysconfig.get_paths()
    return sorted({paths["purelib"], paths["platlib"]})


@pytest.mark.skipif(os.environ.get("SCALEKIT_TEST_LATEST") == "1",
                    reason="SCALEKIT_TEST_LATEST=1 runs the suite on the newest releases instead of the lock")
def test_this_environment_is_the_locked_one():
    # packages left on a machine hide a moved pin: the suite checks it runs on what the lock says
    pins = lock_pins(LOCK.read_text())
    installed = {canonicalize_name(d.metadata["Name"]): Version(d.version) for d in md.distributions(path=site_dirs())}
    differ = [f"{name} {installed[name]} (the lock: {version})" for name, version in sorted(pins.items())
              if name in installed and installed[name] != version]
    assert not differ, (f"installed versions differ from requirements/lock.txt: {differ}; install through the "
                        "lock (scripts/test.sh does) or set SCALEKIT_TEST_LATEST=1")
