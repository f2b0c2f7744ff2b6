"""Binder's environment agrees with pyproject.toml, and binder/start opens JupyterLab on the course."""

import ast
import importlib.metadata as md
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
BINDER = ROOT / "binder"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = PYPROJECT["optional-dependencies"]
BINDER_EXTRA = "all"  # the extra Binder installs: every library the course uses
# what `pip install -e .[all]` brings: the dependencies, and the extras `all` names
DECLARED = {canonicalize_name(Requirement(r).name): Requirement(r) for r in
            [*PYPROJECT["dependencies"], *(r for extra in ("hf", "quant") for r in EXTRAS[extra])]}
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def binder_lines() -> list[str]:
    lines = (BINDER / "requirements.txt").read_text().splitlines()
    return [line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()]


def binder_requirements() -> dict:
    return {canonicalize_name(Requirement(line).name): Requirement(line) for line in binder_lines()
            if not line.startswith("-") and not line.startswith(".")}


def test_binder_installs_the_package_itself():
    # pip installs pyproject's dependencies along with the package: binder cannot fall behind them
    assert f"-e .[{BINDER_EXTRA}]" in binder_lines() or f".[{BINDER_EXTRA}]" in binder_lines()
    assert EXTRAS[BINDER_EXTRA] == ["scalekit[hf,quant]"], "the `all` extra must bring every other user extra"


def test_binder_installs_cpu_torch_pinned_like_the_test_setup():
    lines = binder_lines()
    assert f"--extra-index-url {CPU_INDEX}" in lines or f"--index-url {CPU_INDEX}" in lines
    torch = binder_requirements()["torch"]
    pins = [s.version for s in torch.specifier if s.operator == "=="]
    assert len(pins) == 1, f"binder must pin torch exactly, got {torch}"
    assert DECLARED["torch"].specifier.contains(pins[0]), f"binder's torch {pins[0]} is outside pyproject's {DECLARED['torch']}"
    test_pin = re.search(r"torch==([\w.+]+)", (ROOT / "scripts" / "test.sh").read_text()).group(1)
    assert pins[0] == test_pin, f"binder pins torch {pins[0]}, scripts/test.sh pins {test_pin}"


def test_binder_adds_nothing_that_pyproject_does_not_declare():
    # a package only Binder installs would make notebooks that fail after `pip install scalekit`
    for name, req in binder_requirements().items():
        assert name in DECLARED, f"binder installs {name}, which pyproject.toml does not declare"
        for spec in req.specifier:
            if spec.operator == "==":
                assert DECLARED[name].specifier.contains(spec.version), f"{req} disagrees with {DECLARED[name]}"


def test_binder_python_satisfies_requires_python():
    runtime = (BINDER / "runtime.txt").read_text().strip()
    assert runtime.startswith("python-")
    version = Version(runtime.removeprefix("python-"))
    assert version in Requirement(f"python{PYPROJECT['requires-python']}").specifier


def _installed_closure(names) -> set[str]:
    """Installed distributions reachable from `names` through their (non-extra) requirements."""
    env = default_environment() | {"extra": ""}
    seen, todo = set(), [canonicalize_name(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate(env):
                todo.append(canonicalize_name(req.name))
    return seen


def _optional_imports(tree) -> set[int]:
    """Imports inside `try: ... except ImportError` (e.g. triton, present only on GPU machines)."""
    optional = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                for h in node.handlers):
            optional |= {id(n) for stmt in node.body for n in ast.walk(stmt) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return optional


def _notebook_imports() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "notebooks").rglob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            source = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
            tree = ast.parse(source)
            optional = _optional_imports(tree)
            for node in ast.walk(tree):
                if id(node) in optional:
                    continue
                if isinstance(node, ast.Import):
                    mods = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    mods = [node.module]
                else:
                    continue
                for mod in mods:
                    found.setdefault(mod.split(".")[0], set()).add(path.name)
    return found


def test_every_notebook_import_comes_with_the_package():
    # Binder installs scalekit and what it depends on, nothing else: the course must need nothing more
    reachable = _installed_closure(DECLARED)
    dists = md.packages_distributions()
    missing = []
    for module, notebooks in sorted(_notebook_imports().items()):
        if module in sys.stdlib_module_names or module == "scalekit":
            continue
        providers = {canonicalize_name(d) for d in dists.get(module, [])}
        if not providers & reachable:
            missing.append(f"{module} (in {', '.join(sorted(notebooks))})")
    assert not missing, "notebooks import modules pyproject.toml does not bring: " + "; ".join(missing)


def test_start_script_hands_over_to_the_command():
    text = (BINDER / "start").read_text()
    assert text.startswith("#!") and (BINDER / "start").stat().st_mode & 0o111
    assert 'exec "$@"' in text
    out = subprocess.run([str(BINDER / "start"), "echo", "plain", "command"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0 and out.stdout.strip() == "plain command"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_start_script_opens_jupyterlab_on_the_first_chapter(tmp_path):
    port = _free_port()
    cmd = [str(BINDER / "start"), "jupyter", "lab", "--no-browser", "--allow-root", "--ip=127.0.0.1",
           f"--port={port}", "--IdentityProvider.token=", f"--ServerApp.root_dir={ROOT}"]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path)})

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        location = None
        deadline = time.monotonic() + 60
        while location is None and time.monotonic() < deadline and server.poll() is None:
            try:
                opener.open(f"http://127.0.0.1:{port}/", timeout=5)
            except urllib.error.HTTPError as err:
                location = err.headers.get("Location")
            except OSError:
                time.sleep(0.5)
        assert location is not None, "JupyterLab did not answer"
        assert urllib.parse.urlsplit(location).path.endswith("/lab/tree/notebooks/00_start_here.ipynb"), location
        assert (ROOT / "notebooks" / "00_start_here.ipynb").exists()
    finally:
        server.terminate()
        server.wait(timeout=30)


WIDGETS_PLUGIN = "@jupyter-widgets/jupyterlab-manager:plugin"


def _lab_setting(app_dir: Path, user_dir: Path, plugin: str, key: str):
    """The default JupyterLab serves for `plugin`'s `key` with the overrides under `app_dir` (the settings API's
    own code, jupyterlab_server, as the server runs it)."""
    from jupyter_core.paths import jupyter_path
    from jupyterlab.commands import get_app_dir
    from jupyterlab_server.settings_utils import get_settings

    settings, _ = get_settings(str(app_dir / "settings"), str(Path(get_app_dir()) / "schemas"), str(user_dir),
                               schema_name=plugin, labextensions_path=jupyter_path("labextensions"))
    return settings["schema"]["properties"][key]["default"]


def test_postbuild_keeps_widget_state_out_of_saved_notebooks(tmp_path):
    # a Lab's widget state is tens of MB of plot points: JupyterLab must save the notebook without it (the Lab
    # keeps a static snapshot instead).  postBuild puts binder/overrides.json where JupyterLab reads overrides,
    # merged into what is there, ours winning: an override that said the opposite is replaced, others are kept.
    ours = json.loads((BINDER / "overrides.json").read_text())
    assert ours[WIDGETS_PLUGIN] == {"saveState": False}
    assert (BINDER / "postBuild").stat().st_mode & 0o111
    app_dir = tmp_path / "lab"
    (app_dir / "settings").mkdir(parents=True)
    before = {WIDGETS_PLUGIN: {"saveState": True}, "@jupyterlab/notebook-extension:tracker": {"kernelShutdown": True}}
    (app_dir / "settings" / "overrides.json").write_text(json.dumps(before))
    assert _lab_setting(app_dir, tmp_path / "user", WIDGETS_PLUGIN, "saveState") is True  # the place JupyterLab reads
    out = subprocess.run([str(BINDER / "postBuild")], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "JUPYTERLAB_DIR": str(app_dir), "PATH": f"{Path(sys.executable).parent}:"
                                                                                       f"{os.environ['PATH']}"})
    assert out.returncode == 0, out.stderr
    after = json.loads((app_dir / "settings" / "overrides.json").read_text())
    assert after == {**before, WIDGETS_PLUGIN: {"saveState": False}}
    assert _lab_setting(app_dir, tmp_path / "user", WIDGETS_PLUGIN, "saveState") is False
