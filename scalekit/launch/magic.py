"""`%%torchrun --nproc-per-node N`: run a cell as a script under torchrun, streaming its output.

The safe path when forking is not: every rank is a fresh interpreter, so CUDA already initialised in the
notebook, or bitsandbytes imported, does not matter.  The cell cannot see the notebook's variables (it is
a separate program); it sees the files and the installed packages.  The line takes torchrun's own options;
without a rendezvous option the ranks meet on 127.0.0.1 on free ports.  Arguments for the cell's script
go after `--`: `%%torchrun --nproc-per-node 2 -- --steps 10` (sys.argv in the cell).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading

from .agent import PREFIX
from .commands import LOOPBACK_RDZV
from .failure_report import LaunchError
from .rank import set_parent_death_signal

RDZV_OPTIONS = ("--standalone", "--rdzv-endpoint", "--rdzv_endpoint", "--rdzv-backend", "--rdzv_backend",
                "--master-addr", "--master_addr", "--master-port", "--master_port")


def torchrun_argv(line: str, script: str) -> list[str]:
    """python -m torch.distributed.run with the magic's options, output teed with rank prefixes."""
    words = shlex.split(line)
    options, script_args = (words[:words.index("--")], words[words.index("--") + 1:]) if "--" in words \
        else (words, [])
    argv = [sys.executable, "-m", "torch.distributed.run", "--tee=3"]
    if not any(w.split("=")[0] in RDZV_OPTIONS for w in options):
        argv += LOOPBACK_RDZV
    return argv + options + [script] + script_args


def run_cell(line: str, cell: str, out=None, err=None) -> None:
    """Write `cell` to a script, run it under torchrun and stream its output; raise LaunchError on failure."""
    out, err = out or sys.stdout, err or sys.stderr
    with tempfile.TemporaryDirectory(prefix="scalekit-torchrun-") as tmp:
        script = os.path.join(tmp, "cell.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(cell)
        env = dict(os.environ, TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=PREFIX.replace("{rank}", "${rank}"),
                   PYTHONUNBUFFERED="1")
        env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun with several ranks, without its warning banner
        # torchrun stops its ranks on SIGTERM: the kernel asks for it at its own death too (a kernel killed
        # outright, by SIGKILL or the OOM killer, would otherwise leave torchrun and its ranks running)
        proc = subprocess.Popen(torchrun_argv(line, script), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env, start_new_session=True, preexec_fn=_stop_with_this_process)
        pump = threading.Thread(target=_copy, args=(proc.stderr, err), daemon=True)
        pump.start()
        try:
            _copy(proc.stdout, out)
            code = proc.wait()
        except KeyboardInterrupt:
            _stop(proc)
            raise
        finally:
            if proc.poll() is None:
                _stop(proc)
            pump.join(timeout=5)
    if code != 0:
        raise LaunchError(f"torchrun exited with code {code}: the failing rank's traceback is above")


def _stop_with_this_process() -> None:
    """In torchrun's process, before it runs: SIGTERM when the thread that started it ends (Linux's
    PR_SET_PDEATHSIG; elsewhere nothing is asked)."""
    set_parent_death_signal(signal.SIGTERM)


def _copy(stream, dst) -> None:
    for text in iter(stream.readline, ""):
        dst.write(text)
        dst.flush()


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to torchrun and its ranks (their own session), SIGKILL if they are still there after 5 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def torchrun(line: str, cell: str) -> None:
    """%%torchrun [torchrun options] [-- script args]: run this cell as a script under torchrun."""
    run_cell(line, cell)


def load_ipython_extension(ipython) -> None:
    ipython.register_magic_function(torchrun, magic_kind="cell", magic_name="torchrun")
