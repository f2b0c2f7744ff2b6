"""What runs inside each forked rank: fresh signal handlers and output files, then the launched function.

A rank whose function raises writes its traceback to its stderr and a record of when it failed (the report
leads with the rank that failed first), then exits with code 1 rather than letting the exception reach
torch.multiprocessing, which would pickle it into a file in the temp folder that only its private
ProcessContext knows, and leave it there.  A forked rank runs torch's CPU ops on one thread; fresh
interpreters (`launch_script`, the %%torchrun magic) can use more.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import io
import json
import os
import signal
import socket
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from .run_files import RunFiles

STACK_SIGNAL = signal.SIGUSR1  # at a timeout, a forked rank writes where it is (faulthandler) on this signal


def rank_main(fn, args, kwargs, files: RunFiles):
    """Runs in each forked rank: fresh signal handlers and output files, then fn."""
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    os.environ["SCALEKIT_LAUNCHED_RANK"] = str(rank)
    _own_signals()
    sys.stdout = _redirect(1, files.out(local))
    sys.stderr = _redirect(2, files.err(local))
    # at a timeout the launcher asks every rank still running where it is; the answer goes to its own file
    stacks = open(files.stacks(rank), "w")  # noqa: SIM115 - open for the rank's whole life
    faulthandler.register(STACK_SIGNAL, file=stacks, all_threads=True)
    # GNU OpenMP cannot run a parallel region in a child forked after the parent ran one (it waits for
    # threads the fork did not copy): like DataLoader workers, a forked rank computes on one thread.
    torch.set_num_threads(1)
    if "GLOO_SOCKET_IFNAME" not in os.environ and _loopback_interface():
        os.environ["GLOO_SOCKET_IFNAME"] = _loopback_interface()  # one machine: keep gloo on loopback
    try:
        out = fn(*args, **kwargs)
        _close_leftover_group()
        files.done(rank).touch()  # it waits for the others now: not "still running" at a timeout
        return out
    except BaseException as exc:
        _record_failure(exc, rank, files)
        if isinstance(exc, SystemExit):
            raise
        raise SystemExit(1) from None


def _own_signals() -> None:
    # the notebook's (or the agent's) handlers were inherited: a rank should simply end on SIGTERM
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(s, signal.SIG_DFL)
    # Ctrl-C (a terminal's, or Jupyter's interrupt, which signals the kernel's whole process group) is for the
    # launcher, which stops every rank with SIGTERM: each rank raising KeyboardInterrupt would print a traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _record_failure(exc: BaseException, rank: int, files: RunFiles) -> None:
    """The traceback from fn down (this wrapper's own frame left out) to the rank's stderr, and a record of
    what failed and when, from which the report tells the rank that failed first."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next))
    sys.stderr.write(tb)
    sys.stderr.flush()
    record = {"rank": rank, "time": time.time(), "error": f"{type(exc).__name__}: {exc}", "traceback": tb}
    files.failure(rank).write_text(json.dumps(record))


def _redirect(fd: int, path: Path) -> io.TextIOWrapper:
    """Point file descriptor `fd` at `path` (C and Python output alike) and return a text stream on it."""
    target = os.open(path, os.O_WRONLY | os.O_APPEND)
    os.dup2(target, fd)
    os.close(target)
    return io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), line_buffering=True, write_through=True)


def _loopback_interface() -> str | None:
    with contextlib.suppress(OSError):
        for _, name in socket.if_nameindex():
            if name.startswith("lo"):
                return name
    return None


def _close_leftover_group() -> None:
    """A process group fn left alive: free what may hold it (a DDP model), then destroy it."""
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
