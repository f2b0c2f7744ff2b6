"""What runs inside each forked rank: bound to its launcher's life, fresh signal handlers and output files,
then the launched function.

A rank whose function raises writes its traceback to its stderr and a record of when it failed (the report
leads with the rank that failed first), then exits with code 1 rather than letting the exception reach
torch.multiprocessing, which would pickle it into a file in the temp folder that only its private
ProcessContext knows, and leave it there; a return value that cannot be pickled is recorded the same way.
A rank ends when its launcher does, however the launcher ends.  A forked rank runs torch's CPU ops on one
thread; fresh interpreters (`launch_script`, the %%torchrun magic) can use more.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import gc
import io
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import torch
import torch.distributed as dist

from .run_files import RunFiles

STACK_SIGNAL = signal.SIGUSR1  # at a timeout, a forked rank writes where it is (faulthandler) on this signal
PR_SET_PDEATHSIG = 1  # prctl's option, from <linux/prctl.h>
LAUNCHER_POLL_S = 0.5  # where prctl is missing: how often a rank looks whether its launcher is still there


def rank_main(fn, args, kwargs, files: RunFiles, launcher_pid: int):
    """Runs in each forked rank: bound to its launcher's life, fresh signal handlers and output files, then fn;
    fn's value goes back wrapped, so that one that cannot be sent says so."""
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    end_with_launcher(launcher_pid)
    os.environ["SCALEKIT_LAUNCHED_RANK"] = str(rank)
    _own_signals()
    # nothing may escape to torch's wrapper, which would pickle it into a file of its own in the temp folder
    # (left there, and unreadable when the folder is full): every failure ends in this rank's record
    try:
        _set_up(rank, local, files)
        out = fn(*args, **kwargs)
        _close_leftover_group()
        files.done(rank).touch()  # it waits for the others now: not "still running" at a timeout
        return ReturnValue(out, rank, files)
    except BaseException as exc:
        _record_failure(exc, rank, files)
        if isinstance(exc, SystemExit):
            raise
        raise SystemExit(1) from None


def _set_up(rank: int, local: int, files: RunFiles) -> None:
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


def end_with_launcher(launcher_pid: int) -> None:
    """However the launcher ends (SIGKILL and the OOM killer included), its ranks end with it instead of
    waiting for ever in torch's wrapper.  On Linux the kernel kills the rank when the thread that forked it
    ends (prctl's PR_SET_PDEATHSIG: torch forks from the thread that runs the launch, which outlives every
    rank, see FORKS_IN_CALLER in torch_hooks); elsewhere a thread looks for the launcher every LAUNCHER_POLL_S."""
    if not set_parent_death_signal(signal.SIGKILL):
        threading.Thread(target=_watch_launcher, args=(launcher_pid,), name="scalekit-launcher-watch",
                         daemon=True).start()
    if os.getppid() != launcher_pid:  # the launcher ended before the kernel was asked to tell
        os.kill(os.getpid(), signal.SIGKILL)


def set_parent_death_signal(signum: int) -> bool:
    """Ask the kernel to send `signum` to this process when its parent thread ends; False where it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_launcher(launcher_pid: int) -> None:
    while os.getppid() == launcher_pid:  # a rank whose parent has ended is re-parented
        time.sleep(LAUNCHER_POLL_S)
    os.kill(os.getpid(), signal.SIGKILL)


class ReturnValue:
    """fn's return value, pickled in the rank where a failure to pickle it can still be recorded and told: by
    torch's wrapper it would be a traceback in a file of torch's that the launcher never reads.  Unpickled in
    the launcher, it is the value itself (or an UnreadableReturnValue)."""

    def __init__(self, value, rank: int, files: RunFiles):
        self.value, self.rank, self.files = value, rank, files

    def __reduce__(self):
        try:
            data = bytes(ForkingPickler.dumps(self.value))  # the pickler torch's queue uses (tensors included)
        except Exception as exc:  # noqa: BLE001 - whatever pickle raises, the rank says it and ends
            _write_record(self.rank, self.files, f"{type(exc).__name__}: {exc}", "",
                          f"could not send its return value back: {exc} (launch pickles what each rank returns "
                          f"to bring it to this process)")
            raise SystemExit(1) from None  # past torch's wrapper, which catches only Exception
        return read_return_value, (self.rank, data)


@dataclass(frozen=True)
class UnreadableReturnValue:
    """What the launcher holds for a rank's return value that was pickled but cannot be unpickled here."""

    rank: int
    error: str


def read_return_value(rank: int, data: bytes):
    """In the launcher, inside torch's queue: the value, or what kept it from being read (raised here, it would
    leave torch's wait as a bare exception from deep inside torch)."""
    try:
        return ForkingPickler.loads(data)
    except Exception as exc:  # noqa: BLE001 - whatever the value's own unpickling raises
        return UnreadableReturnValue(rank, f"{type(exc).__name__}: {exc}")


def _own_signals() -> None:
    # the notebook's (or the agent's) handlers were inherited: a rank should simply end on SIGTERM
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(s, signal.SIG_DFL)
    # Ctrl-C (a terminal's, or Jupyter's interrupt, which signals the kernel's whole process group) is for the
    # launcher, which stops every rank with SIGTERM: each rank raising KeyboardInterrupt would print a traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _record_failure(exc: BaseException, rank: int, files: RunFiles) -> None:
    """The traceback from fn down (this wrapper's own frame left out) to the rank's stderr, and a record of
    what failed and when, from which the report tells the rank that failed first.  Best effort: in a full
    temp folder neither may fit, and the report then says the folder is full."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next))
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(tb)
        sys.stderr.flush()
    _write_record(rank, files, f"{type(exc).__name__}: {exc}", tb)


def _write_record(rank: int, files: RunFiles, error: str, tb: str, text: str = "") -> None:
    """text: what the report says after "rank N ", when "failed: <error>" is not the best way to say it."""
    record = {"rank": rank, "time": time.time(), "error": error, "traceback": tb, "text": text}
    with contextlib.suppress(OSError):
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
