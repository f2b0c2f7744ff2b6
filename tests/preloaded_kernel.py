"""Notebook kernels for nbval, forked from a process that has already imported what every chapter imports.

A chapter's kernel spends 4-9 s of CPU before its first line of content: starting the kernel, then importing
torch, scalekit, plotly and (most chapters and solutions) transformers.  The suite starts 31 of them per run.
Here a server process per pytest worker imports those once; each kernel nbval asks for is a fork of it that
then starts ipykernel exactly as `python -m ipykernel_launcher -f CONNECTION_FILE` would, in the cwd and with
the environment nbval gave.  Nothing is shared between notebooks: every kernel is a fresh process, only its
imports are done.

Two roles, one file (stdlib only at the top, so the launcher costs nothing):

- `python preloaded_kernel.py serve SOCKET OWNER_PID [MODULE ...]`: the server (MODULEs: another preload than
  PRELOAD), detached, serving while OWNER_PID lives.  It imports the preload list, refuses to serve if that
  imported bitsandbytes or left more than the main thread running Python (a fork must not copy held locks; a
  kernel that forks ranks must be free to), then listens on the Unix socket.
- `python preloaded_kernel.py launch SOCKET -f CONNECTION_FILE`: what nbval's kernel manager starts.  It hands
  the server its argv, cwd, environment and stdio, waits for the kernel to end and exits with its status.  The
  kernel manager's signals (interrupt, terminate) reach the kernel's process group through it; if the launcher
  is killed outright, the kernel's lifeline pipe closes and the kernel's group is killed, as the plain kernel's
  group would have been.  With no server to reach, it becomes a plain kernel (`exec` of ipykernel_launcher).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
import time

# What the chapters and their solutions import before their first section (their first cells), in import order
PRELOAD = ("torch", "scalekit", "scalekit.course.chapter", "plotly.io", "plotly.graph_objects", "pandas", "ipywidgets",
           "ipykernel.kernelapp", "transformers", "transformers.modeling_utils", "torch._inductor.compile_fx")
# Modules a kernel must import itself: scalekit.launch refuses to fork ranks from a process that has them
NEVER_PRELOADED = ("bitsandbytes",)
CONNECT_WAIT_S = 120  # the server imports for ~10 s; on a loaded machine, longer
_HEADER = struct.Struct("!Q")


# ---- the launcher (what the kernel spec runs) -----------------------------------------------------------------


def launch(socket_path: str, kernel_argv: list[str]) -> int:
    server = _connect(socket_path)
    if server is None:  # no server (it failed to start or was stopped): a plain kernel, as without this module
        os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", *kernel_argv])
    lifeline_read, lifeline_write = os.pipe()
    request = json.dumps({"argv": kernel_argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    socket.send_fds(server, [_HEADER.pack(len(request)) + request], [0, 1, 2, lifeline_read])
    os.close(lifeline_read)
    kernel_pid = int(_read_line(server))

    def forward(signum, _frame):
        try:
            os.killpg(kernel_pid, signum)  # the kernel leads its own group, which its ranks and workers join
        except ProcessLookupError:
            pass

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, forward)
    status = int(_read_line(server))  # the server writes the kernel's wait status when it has reaped it
    os.close(lifeline_write)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _connect(socket_path: str) -> socket.socket | None:
    deadline = time.monotonic() + CONNECT_WAIT_S
    while True:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            client.connect(socket_path)
            return client
        except (FileNotFoundError, ConnectionRefusedError):
            client.close()
            server_pid = os.environ.get("SCALEKIT_TEST_KERNEL_SERVER_PID")
            if not server_pid or not alive(int(server_pid)) or time.monotonic() > deadline:
                return None
            time.sleep(0.05)


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    fields = proc_stat(pid)
    return fields is not None and fields[0] != "Z"


def proc_stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields from the state on (field 3 of proc(5) is [0]), or None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def _read_line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(64)
        if not chunk:
            raise ConnectionError("the kernel server closed the connection")
        data += chunk
    return data


# ---- the server ---------------------------------------------------------------------------------------------


def serve(socket_path: str, owner_pid: int, preload: tuple[str, ...] = PRELOAD) -> None:
    """Detach (the process that started this one returns at once, and the server is no child of the tests': the
    tests that check they left no process behind do not see it), write the server's pid to SOCKET.pid, import,
    then fork a kernel for each launcher that connects, for as long as `owner_pid` lives."""
    if os.fork():
        os._exit(0)
    os.setsid()  # nor does a Ctrl-C at the terminal reach it: its owner stops it
    with open(socket_path + ".pid.tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(socket_path + ".pid.tmp", socket_path + ".pid")
    sys.modules.setdefault("rfc3987_syntax", None)  # as the tests' IPython startup file does in every kernel
    env_before = dict(os.environ)
    for name in ("ipykernel.kernelapp", "torch", *preload):
        __import__(name)
    if "torch._inductor.compile_fx" in sys.modules:
        _hash_torchs_sources()
    import_env = {name: value for name, value in os.environ.items() if env_before.get(name) != value}
    _refuse_unsafe_fork()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path + ".tmp")
    os.rename(socket_path + ".tmp", socket_path)  # launchers see the socket only once it accepts
    listener.listen(8)
    waiting: dict[int, socket.socket] = {}  # kernel pid -> its launcher's connection
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    listener.settimeout(0.2)
    while alive(owner_pid):  # the pytest worker that started it is gone: so is the server
        _reap(waiting)
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        conn.settimeout(None)
        request, fds = _receive_request(conn)
        pid = os.fork()
        if pid == 0:
            listener.close()
            for other in waiting.values():
                other.close()
            _become_kernel(conn, request, fds, import_env)  # never returns
        for fd in fds:
            os.close(fd)
        waiting[pid] = conn
        conn.sendall(f"{pid}\n".encode())


def _hash_torchs_sources() -> None:
    """What a process's first torch.compile does before anything else: hash torch's own ~2,000 source files into
    the key of every cache entry it reads or writes (2 s of CPU).  The value depends on the installed torch alone,
    so a kernel forked from here holds the one it would have computed."""
    from torch._inductor.codecache import torch_key

    torch_key()


def _refuse_unsafe_fork() -> None:
    imported = [name for name in NEVER_PRELOADED if name in sys.modules]
    if imported:
        raise SystemExit(f"preloaded_kernel: the preload imported {imported}; kernels would be unable to fork ranks")
    import threading

    if threading.active_count() != 1:
        raise SystemExit(f"preloaded_kernel: the preload started Python threads {threading.enumerate()}")


def _receive_request(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 4)
    size = _HEADER.unpack_from(data)[0]
    body = data[_HEADER.size:]
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ConnectionError("a launcher closed its connection mid-request")
        body += chunk
    return json.loads(body), fds


def _reap(waiting: dict[int, socket.socket]) -> None:
    while waiting:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = waiting.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(f"{status}\n".encode())
            except OSError:
                pass  # its launcher is gone already
            conn.close()


def _become_kernel(conn: socket.socket, request: dict, fds: list[int], import_env: dict[str, str]) -> None:
    try:
        conn.close()
        for signum in (signal.SIGTERM, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.setsid()  # a group of its own, as the plain kernel (started in a new session) has
        stdin, stdout, stderr, lifeline = fds
        for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
            os.dup2(fd, target)
            os.close(fd)
        _watch_lifeline(lifeline)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _fresh_process_state(import_env)
        import ipykernel_launcher  # noqa: F401  (its path becomes argv[0], as in a plain kernel)
        from ipykernel import kernelapp

        sys.argv = [sys.modules["ipykernel_launcher"].__file__, *request["argv"]]
    except BaseException:
        import traceback

        traceback.print_exc()
        os._exit(1)
    # ipykernel reads these two from the environment as it is imported, which was in the server: given here
    kernelapp.IPKernelApp.launch_instance(parent_handle=int(os.environ.get("JPY_PARENT_PID") or 0),
                                          interrupt=int(os.environ.get("JPY_INTERRUPT_EVENT") or 0))
    # the kernel ended: this process exits as the plain kernel would, running the atexit hooks its imports set
    sys.exit(0)


def _watch_lifeline(fd: int) -> None:
    import threading

    def watch():
        while os.read(fd, 1):
            pass
        os.killpg(0, signal.SIGKILL)  # the launcher died without its kernel: end the kernel's whole group

    threading.Thread(target=watch, name="kernel-lifeline", daemon=True).start()


def _fresh_process_state(import_env: dict[str, str]) -> None:
    """What a fresh interpreter importing the preload would have that a fork does not:
    - this file's folder off sys.path (a kernel's path is its cwd's, as ipykernel_launcher makes it);
    - the environment variables the preload's imports set (`setdefault`, over the kernel's own environment);
    - torch's and numpy's global generators seeded afresh, as each new process seeds them (Python's `random`
      reseeds itself in a forked child)."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or ".") != here]
    for name, value in import_env.items():
        os.environ.setdefault(name, value)
    import torch

    torch.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "serve":
        serve(argv[1], int(argv[2]), tuple(argv[3:]) or PRELOAD)
        return 0
    if len(argv) >= 2 and argv[0] == "launch":
        return launch(argv[1], argv[2:])
    print("usage: preloaded_kernel.py serve SOCKET OWNER_PID [MODULE ...] | launch SOCKET -f CONNECTION_FILE", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
