"""The Lab in a real browser: JupyterLab on 127.0.0.1 with a token, Debian's Chromium driven by Playwright.

Opens tests/notebooks/lab_browser.ipynb, runs it, presses Run, switches one optimization on, presses Run
again, and reads the page: two traces in the throughput plot, two rows in the table.  Nothing is
installed here: scripts/test.sh installs Chromium and the test extra (Playwright); a missing browser
fails the test rather than skipping it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "lab_browser.ipynb"
REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]

# the throughput figure is the plotly graph whose title says so; its scatter traces are drawn as g.trace
THROUGHPUT_TRACES = """() => {
  const plots = [...document.querySelectorAll('.scalekit-lab .js-plotly-plot')];
  const fig = plots.find(p => (p.querySelector('.gtitle') || {}).textContent?.startsWith('Throughput'));
  if (!fig) return null;
  return {drawn: fig.querySelectorAll('.scatterlayer .trace').length, names: (fig.data || []).map(t => t.name)};
}"""
TABLE_ROWS = "() => document.querySelectorAll('.scalekit-lab .scalekit-results tbody tr').length"


def _checkbox_toggle() -> str:
    """An on/off toggle the CPU can run: sdpa if it is one, else the panel's first such checkbox."""
    import ipywidgets as w

    from scalekit.machine.hardware import detect
    from scalekit.widgets.panel import TogglePanel

    panel = TogglePanel(detect("cpu"))
    boxes = [k for k, c in panel.controls.items() if isinstance(c.widget, w.Checkbox) and c.usable]
    assert boxes, "the Lab's panel has no on/off toggle this CPU can run"
    return "sdpa" if "sdpa" in boxes else boxes[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_server(url: str, token: str, server: subprocess.Popen, log: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"jupyter lab exited with {server.returncode}:\n{log.read_text()[-3000:]}")
        try:
            req = urllib.request.Request(f"{url}/api/status", headers={"Authorization": f"token {token}"})
            with urllib.request.urlopen(req, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    pytest.fail(f"jupyter lab did not answer within {timeout_s} s:\n{log.read_text()[-3000:]}")


def _stop_server(server: subprocess.Popen, url: str, token: str) -> None:
    """Shut the server and its kernels down; kill whatever is left, by pid."""
    try:
        family = psutil.Process(server.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    try:
        req = urllib.request.Request(f"{url}/api/shutdown", method="POST",
                                     headers={"Authorization": f"token {token}"})
        urllib.request.urlopen(req, timeout=5).close()
        server.wait(timeout=15)
    except (urllib.error.URLError, OSError, subprocess.TimeoutExpired):
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
    for proc in family:  # kernels live in their own sessions: make sure none outlives the test
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


@pytest.mark.browser
def test_lab_runs_twice_in_jupyterlab(tmp_path):
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium package (scripts/test.sh does)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is missing: pip install -e '.[test]' (scripts/test.sh does)")

    toggle = _checkbox_toggle()
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(NOTEBOOK, work / NOTEBOOK.name)
    port, token = _free_port(), secrets.token_hex(16)
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), JUPYTER_CONFIG_DIR=str(tmp_path / "config"))
    log = tmp_path / "jupyter.log"
    with open(log, "w") as log_file:
        server = subprocess.Popen(
            [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root", "--ip=127.0.0.1",
             f"--port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
             f"--ServerApp.root_dir={work}", "--LabApp.expose_app_in_browser=True",
             f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}", f"--LabApp.user_settings_dir={tmp_path / 'settings'}"],
            cwd=work, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        _wait_for_server(url, token, server, log)
        with sync_playwright() as p:
            context = p.chromium.launch_persistent_context(
                str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS,
                viewport={"width": 1400, "height": 1800})
            try:
                page = context.pages[0] if context.pages else context.new_page()
                page.set_default_timeout(60_000)
                page.goto(f"{url}/lab/tree/{NOTEBOOK.name}?token={token}")
                page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                                       " && window.jupyterapp.shell.currentWidget.sessionContext")
                page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.ready")
                page.evaluate("() => window.jupyterapp.commands.execute('runmenu:run-all')")

                page.locator(".scalekit-lab .scalekit-run").click()  # run 1: the baseline
                page.wait_for_function(f"() => ({TABLE_ROWS})() === 1")
                page.locator(f".scalekit-toggle-{toggle} input[type=checkbox]").check()  # waits until enabled
                page.locator(".scalekit-lab .scalekit-run").click()  # run 2: that optimization on
                page.wait_for_function(f"() => ({TABLE_ROWS})() === 2")
                page.wait_for_function(f"() => ({THROUGHPUT_TRACES})()?.drawn === 2")
                page.locator(".scalekit-results").scroll_into_view_if_needed()
                page.screenshot(path=str(tmp_path / "lab.png"), full_page=True)

                traces = page.evaluate(THROUGHPUT_TRACES)
                assert traces == {"drawn": 2, "names": ["#1 baseline", f"#2 {toggle}"]}
                assert page.evaluate(TABLE_ROWS) == 2
                cells = page.locator(".scalekit-results tbody tr td:nth-child(2)").all_inner_texts()
                assert cells == ["baseline", toggle]
                assert "failed" not in page.locator(".scalekit-message").inner_text()
            except Exception:
                page.screenshot(path=str(tmp_path / "lab-failure.png"), full_page=True)
                print(f"screenshot: {tmp_path / 'lab-failure.png'}\njupyter log:\n{log.read_text()[-3000:]}")
                raise
            finally:
                context.close()
    finally:
        _stop_server(server, url, token)
    assert (tmp_path / "lab.png").stat().st_size > 10_000
