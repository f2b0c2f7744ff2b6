"""The first lines a launched script's rank runs, before the script: bound to its launcher's life.

A forked rank (`launch`) binds itself in rank.end_with_launcher.  A script's rank (`launch_script`, `scalekit launch`)
is a fresh interpreter that runs the user's file, so the binding comes first, as `python -c BOOTSTRAP`: on Linux the
kernel kills the rank when the launcher's thread that started it ends (prctl's PR_SET_PDEATHSIG, SIGKILL and the OOM
killer included), and a rank whose launcher is already gone ends at once.  Then the script runs as `python script.py`
(or `python -m module`) would run it: as __main__, with its own sys.argv and sys.path[0].  The bootstrap imports
nothing but the standard library, so it adds no start-up time; where prctl is missing, a daemon thread polls.
"""

from __future__ import annotations

BOOTSTRAP = """
import ctypes, os, runpy, signal, sys, threading, time
launcher, how, target, *args = sys.argv[1:]
launcher = int(launcher)
def _watch():
    while os.getppid() == launcher:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
try:
    bound = sys.platform.startswith("linux") and ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0) == 0
except (OSError, AttributeError):
    bound = False
if not bound:
    threading.Thread(target=_watch, name="scalekit-launcher-watch", daemon=True).start()
if os.getppid() != launcher:
    os.kill(os.getpid(), signal.SIGKILL)
del ctypes, threading, time, _watch, bound
if how == "-m":
    sys.argv = [target, *args]
    sys.path[0] = os.getcwd()
    runpy.run_module(target, run_name="__main__", alter_sys=True)
else:
    sys.argv = [target, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(target))
    runpy.run_path(target, run_name="__main__")
"""


def bootstrap_args(target: str, module: bool, script_args, launcher_pid: int) -> tuple[str, ...]:
    """The interpreter's arguments (after `-u`) that run `target` bound to the launcher `launcher_pid`."""
    return ("-c", BOOTSTRAP, str(launcher_pid), "-m" if module else "-f", target, *script_args)
