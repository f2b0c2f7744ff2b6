"""The notebook kernels nbval starts in the suite are forked from a server that has imported torch already
(tests/preloaded_kernel.py).  Each must still be a fresh kernel in everything a notebook can see, Jupyter's
interrupt and shutdown must reach it, and a launcher killed outright must leave no kernel behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager

from tests.preloaded_kernel import alive

SCRIPT = str(Path(__file__).parents[1] / "preloaded_kernel.py")


def wait_for(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tests import conftest

    suites = conftest._KERNEL_SERVER  # the one this pytest worker started for the notebooks, when it has one
    if suites.get("pid") and alive(suites["pid"]):
        socket_path = Path(suites["folder"], "server.sock")
        wait_for(lambda: socket_path.exists() or not alive(suites["pid"]), 120, "the suite's server listening")
        yield socket_path, suites["pid"]
        return
    socket_path = tmp_path_factory.mktemp("kernels") / "server.sock"
    # the suite's own preload; the server detaches and serves while this process lives
    subprocess.run([sys.executable, SCRIPT, "serve", str(socket_path), str(os.getpid())], check=True)
    pid_file = Path(f"{socket_path}.pid")
    wait_for(pid_file.exists, 30, "the server's pid file")
    pid = int(pid_file.read_text())
    wait_for(lambda: socket_path.exists() or not alive(pid), 120, "the server listening")
    assert alive(pid), "the kernel server exited while importing"
    assert pid not in [p.pid for p in psutil.Process().children(recursive=True)]  # not among this process's
    yield socket_path, pid
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not alive(pid), 10, "the server ending")


def kernel_manager(tmp_path, socket_path, server_pid: int | None) -> KernelManager:
    spec = {"argv": [sys.executable, SCRIPT, "launch", str(socket_path), "-f", "{connection_file}"],
            "display_name": "preloaded", "language": "python", "interrupt_mode": "signal",
            "env": {"SCALEKIT_TEST_KERNEL_SERVER_PID": str(server_pid)} if server_pid else {}}
    (tmp_path / "specs" / "preloaded").mkdir(parents=True)
    (tmp_path / "specs" / "preloaded" / "kernel.json").write_text(json.dumps(spec))
    return KernelManager(kernel_name="preloaded", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(tmp_path / "specs")]))


@pytest.fixture
def started(tmp_path, server):
    socket_path, server_pid = server
    managers = []

    def start(cwd=None, env=None):
        km = kernel_manager(tmp_path / f"k{len(managers)}", socket_path, server_pid)
        km.start_kernel(cwd=str(cwd or tmp_path), env={**os.environ, **(env or {})})
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        managers.append((km, kc))
        return km, kc

    yield start
    for km, kc in managers:
        kc.stop_channels()
        if km.is_alive():
            km.shutdown_kernel(now=True)


def run(kc, code: str, timeout_s: float = 60) -> tuple[dict, str]:
    printed = []

    def keep(msg):
        if msg["msg_type"] == "stream":
            printed.append(msg["content"]["text"])

    reply = kc.execute_interactive(code, timeout=timeout_s, output_hook=keep)
    return reply["content"], "".join(printed)


FACTS = """
import json, os, sys
preloaded = [name for name in ("torch", "scalekit", "transformers") if name in sys.modules]
import numpy, torch
print(json.dumps({"preloaded": preloaded, "cwd": os.getcwd(), "marker": os.environ.get("MARKER"),
                  "pid": os.getpid(), "leads_group": os.getpgid(0) == os.getpid(), "main": __name__,
                  "argv0": os.path.basename(sys.argv[0]), "path": sys.path, "torch_rand": torch.rand(3).tolist(),
                  "numpy_rand": numpy.random.rand(), "bitsandbytes": "bitsandbytes" in sys.modules,
                  "parent_handle": get_ipython().kernel.parent.parent_handle,
                  "jpy_parent": int(os.environ.get("JPY_PARENT_PID") or 0)}))
"""


def test_a_forked_kernel_is_a_fresh_kernel_with_its_imports_done(started, tmp_path):
    folder = tmp_path / "notebook folder"
    folder.mkdir()
    facts = []
    for marker in ("one", "two"):
        _, kc = started(cwd=folder, env={"MARKER": marker})
        reply, out = run(kc, FACTS)
        assert reply["status"] == "ok", reply
        facts.append(json.loads(out))
    for fact, marker in zip(facts, ("one", "two"), strict=True):
        # forked from the server: the imports were done before the first cell
        assert fact["preloaded"] == ["torch", "scalekit", "transformers"]
        assert fact["cwd"] == str(folder) and fact["marker"] == marker  # the cwd and environment Jupyter gave
        assert fact["leads_group"] and fact["main"] == "__main__" and fact["argv0"] == "ipykernel_launcher.py"
        assert os.path.dirname(SCRIPT) not in fact["path"]
        assert not fact["bitsandbytes"]  # so scalekit.launch may fork ranks from it
        assert fact["parent_handle"] == fact["jpy_parent"] == os.getpid()  # ipykernel watches Jupyter, not the server
    assert facts[0]["pid"] != facts[1]["pid"]
    # each seeded afresh, as a new process is: not one generator's state copied into both
    assert facts[0]["torch_rand"] != facts[1]["torch_rand"] and facts[0]["numpy_rand"] != facts[1]["numpy_rand"]


def test_jupyters_interrupt_reaches_the_kernel(started):
    km, kc = started()
    kc.execute("import time\nfor _ in range(600): time.sleep(0.1)")
    time.sleep(1)
    t0 = time.monotonic()
    km.interrupt_kernel()
    reply = kc.get_shell_msg(timeout=30)["content"]
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
    assert time.monotonic() - t0 < 10
    # ipykernel aborts requests that arrive just after an error: wait for it to go idle, then for that window
    while kc.get_iopub_msg(timeout=30)["content"].get("execution_state") != "idle":
        pass
    time.sleep(1)
    reply, out = run(kc, "print(6 * 7)")  # the kernel lives on
    assert reply["status"] == "ok" and out.strip() == "42"


def test_shutdown_ends_the_kernel_and_its_launcher(started, server):
    km, kc = started()
    _, out = run(kc, "import os; print(os.getpid())")
    kernel_pid = int(out)
    launcher = km.provisioner.process
    km.shutdown_wait_time = 30  # a kernel that has imported torch and transformers takes ~2 s to tear them down
    km.shutdown_kernel()
    wait_for(lambda: not alive(kernel_pid), 10, "the kernel ending")
    assert launcher.poll() == 0
    assert psutil.Process(server[1]).children() == []  # reaped by the server


def test_a_launcher_killed_outright_takes_the_kernel_and_its_children_with_it(started):
    km, kc = started()
    _, out = run(kc, "import os, subprocess\nchild = subprocess.Popen(['sleep', '60'])\nprint(os.getpid(), child.pid)")
    kernel_pid, child_pid = map(int, out.split())
    os.kill(km.provisioner.process.pid, signal.SIGKILL)
    wait_for(lambda: not alive(kernel_pid) and not alive(child_pid), 10, "the kernel and its child ending")


@pytest.mark.parametrize("server_pid", [None, "ended"])
def test_without_a_server_the_launcher_starts_a_plain_kernel(tmp_path, server_pid):
    if server_pid == "ended":  # the suite's server exited (a preload that failed): no waiting for its socket
        server_pid = subprocess.Popen(["true"]).pid
        wait_for(lambda: not alive(server_pid), 10, "the process ending")
    km = kernel_manager(tmp_path, tmp_path / "no-server.sock", server_pid=server_pid)
    km.start_kernel(cwd=str(tmp_path))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        reply, out = run(kc, "import sys; print('torch' in sys.modules)")
        assert reply["status"] == "ok" and out.strip() == "False"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_the_server_refuses_a_preload_that_imports_a_module_kernels_must_import_themselves(tmp_path):
    socket_path = tmp_path / "server.sock"
    log = tmp_path / "server.log"
    with log.open("w") as out:
        subprocess.run([sys.executable, SCRIPT, "serve", str(socket_path), str(os.getpid()), "json", "bitsandbytes"],
                       stdout=out, stderr=subprocess.STDOUT, check=True)
    wait_for(lambda: Path(f"{socket_path}.pid").exists(), 30, "the server's pid file")
    wait_for(lambda: not alive(int(Path(f"{socket_path}.pid").read_text())), 120, "the server refusing")
    assert "bitsandbytes" in log.read_text() and "fork ranks" in log.read_text()
    assert not socket_path.exists()
