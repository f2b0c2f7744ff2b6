"""The agent of a launch: torch's public elastic API, with what a launch from a notebook needs besides.

start_processes forks the ranks (or starts fresh interpreters for a script) with torchrun's environment,
PContext.wait polls them, PContext.close stops them.  torchrun's own agent adds what many nodes need
(rendezvous rounds, restarts, health checks); a launch adds a time limit that dumps the stacks of the ranks
still running, the time and status of every rank's exit, and signals held while ranks start or stop.
The store the ranks meet on listens on 127.0.0.1 only, on a port the operating system picks, so two
launches at once never collide and nothing is reachable from outside.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import socket
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from string import Template
from typing import Any

from torch.distributed import TCPStore
from torch.distributed.elastic.multiprocessing import LogsDest, LogsSpecs, PContext, start_processes

from ..distributed.runtime import PG_TIMEOUT_ENV
from .exits import ExitWatcher
from .rank import STACK_SIGNAL
from .run_files import RunFiles
from .signals import Signals
from .torch_hooks import SIGNALS_TO_HANDLE, USE_AGENT_STORE

PREFIX = "[rank{rank}]: "
SHUTDOWN_S = 3  # after a failure, the other ranks get this long after SIGTERM before SIGKILL
MONITOR_S = 0.05  # how often torch is asked whether the ranks are done (torchrun's agent: 0.1 s)
STACK_WAIT_S = 1.0  # how long the launcher waits for those stacks before it stops the ranks
STORE_TIMEOUT_S = 900  # torchrun's default rendezvous timeout
TORCH_LOGGERS = ("torch.distributed.elastic", "torch.multiprocessing")


@dataclass
class Outcome:
    """How the ranks of one launch ended: what the launch returns, or what the report tells."""

    nprocs: int
    forked: bool  # forked ranks running a function, or fresh interpreters running a script
    timeout_s: float | None
    return_values: dict[int, Any] = field(default_factory=dict)  # by rank, when every rank returned
    exit_codes: dict[int, int] = field(default_factory=dict)  # the exit codes torch reported, by rank
    exits: dict[int, tuple[float, int | None]] = field(default_factory=dict)  # the watcher's: rank: (time, code)
    timed_out: bool = False
    still_running: list[int] = field(default_factory=list)  # the ranks the time limit stopped
    stopping_since: float | None = None  # time.time() when the launcher began stopping ranks
    torch_failed: bool = False  # torch reported a failed rank

    @property
    def failed(self) -> bool:
        return self.timed_out or self.torch_failed


class LoopbackStore:
    """The c10d store the ranks meet on, hosted in this process as torchrun's agent hosts it, listening on
    127.0.0.1 only on a port the operating system picks: the socket is bound here and handed to the TCPStore
    (master_listen_fd, which then owns it; a TCPStore given port 0 would listen on every interface), so no
    other launch can race for the same number.  The ranks connect to it as clients (USE_AGENT_STORE)."""

    def __init__(self, timeout_s: float = STORE_TIMEOUT_S):
        sock = socket.create_server(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.store: TCPStore | None = TCPStore("127.0.0.1", self.port, None, True, timedelta(seconds=timeout_s),
                                               wait_for_workers=False, master_listen_fd=sock.detach())

    def close(self) -> None:
        self.store = None  # the store closes its listening socket


class RankLogs(LogsSpecs):
    """Each rank's stdout/stderr in the run folder, streamed into this process's with the rank's prefix by
    torch's own tailer (tee).  A forked rank points its output at those files itself (rank_main: in a
    notebook sys.stdout has no file descriptor for torch to redirect, and torch's redirect ends when the
    function returns), so torch redirects only a script's output."""

    def __init__(self, files: RunFiles, redirect: bool):
        super().__init__(log_dir=str(files.root))
        self.files = files
        self.redirect = redirect

    @property
    def root_log_dir(self) -> str:
        return str(self.files.root)

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        outs = {r: str(self.files.out(r)) for r in envs}
        errs = {r: str(self.files.err(r)) for r in envs}
        error_files = {r: str(self.files.torch_error(r)) for r in envs}
        for r, env in envs.items():  # where @record writes a script's exception, as torchrun sets it
            env["TORCHELASTIC_ERROR_FILE"] = error_files[r]
        if self.redirect:
            return LogsDest(outs, errs, outs, errs, error_files)
        no_redirect = dict.fromkeys(envs, "")
        return LogsDest(no_redirect, dict(no_redirect), outs, errs, error_files)


class Agent:
    """Start `nprocs` ranks, watch them until they all return, one fails, the time limit passes or a signal
    comes, then stop every one.  Ranks are stopped with SIGTERM whatever signal the launch got: passing a
    SIGINT on, as torchrun does, makes each rank print a KeyboardInterrupt traceback."""

    def __init__(self, entrypoint, args, nprocs: int, start_method: str, files: RunFiles,
                 timeout_s: float | None, signals: Signals):
        self.entrypoint, self.args, self.nprocs, self.start_method = entrypoint, tuple(args), nprocs, start_method
        self.files, self.signals, self.timeout_s = files, signals, timeout_s
        self.forked = start_method == "fork"
        self.deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self.pcontext: PContext | None = None
        self.exits = ExitWatcher()
        self.outcome = Outcome(nprocs, self.forked, timeout_s)

    def run(self) -> Outcome:
        store = LoopbackStore()
        try:
            with _process_state(self.nprocs, self.timeout_s):
                try:
                    self._start(store.port)
                    self._watch()
                finally:
                    self._stop()
        finally:
            with self.signals.held():
                self.exits.stop()
                store.close()  # now, even while a traceback keeps this frame (and so the store) alive
        self.outcome.exits = dict(self.exits.exits)
        return self.outcome

    def _start(self, port: int) -> None:
        run_id = f"scalekit-{uuid.uuid4().hex[:12]}"
        envs = {r: rank_env(r, self.nprocs, port, run_id) for r in range(self.nprocs)}
        if self.forked:
            # A forked rank inherits this process's garbage too: an earlier launch's store or process group
            # left in a reference cycle (a caught LaunchError's traceback holds one), whose destructor, run
            # by the rank's first garbage collection, joins threads the fork did not copy (SIGSEGV, or a
            # hang).  Frozen objects are never collected, so the ranks leave what they inherit alone.
            gc.freeze()
        try:
            with self.signals.held():
                self.pcontext = start_processes(
                    name="rank", entrypoint=self.entrypoint, envs=envs, start_method=self.start_method,
                    args={r: with_local_rank(self.args, r) for r in range(self.nprocs)},
                    logs_specs=RankLogs(self.files, redirect=not self.forked),
                    log_line_prefixes={r: PREFIX.format(rank=r) for r in range(self.nprocs)})
        finally:
            if self.forked:
                gc.unfreeze()  # this process collects its own garbage again, safely, where its threads are
            self.signals.install()  # in case this torch installed handlers of its own after all
        self.exits.watch(self.pcontext.pids())
        self.signals.raise_pending()  # now that every rank is known to the agent, which stops them all

    def _watch(self) -> None:
        while True:
            time.sleep(MONITOR_S)
            self.exits.look()  # before torch reaps a rank that has exited, and its exit status with it
            looked_at = time.time()
            result = self.pcontext.wait(0)
            if result is not None:
                if result.is_failed():  # torch has stopped the other ranks already
                    self.outcome.stopping_since = self.outcome.stopping_since or looked_at
                    self.outcome.torch_failed = True
                self.outcome.return_values = dict(result.return_values)
                self.outcome.exit_codes = {r: f.exitcode for r, f in result.failures.items()}
                return
            if self.deadline is not None and time.monotonic() >= self.deadline:
                self._time_out()
                return

    def _time_out(self) -> None:
        self.outcome.stopping_since = time.time()
        self.outcome.timed_out = True
        self.outcome.still_running = [r for r in range(self.nprocs) if self._running(r)]
        if self.forked:
            self._dump_stacks(self.pcontext.pids())

    def _running(self, rank: int) -> bool:
        """Still in its function: not exited, and (a forked rank waits for the others once done) not done."""
        return rank not in self.exits.exits and not self.files.done(rank).exists()

    def _dump_stacks(self, pids: dict[int, int]) -> None:
        files = {r: self.files.stacks(r) for r in self.outcome.still_running}
        for r in self.outcome.still_running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pids[r], STACK_SIGNAL)
        deadline = time.monotonic() + STACK_WAIT_S
        while time.monotonic() < deadline and not all(f.exists() and f.stat().st_size for f in files.values()):
            time.sleep(0.02)
        time.sleep(0.05)  # the handler writes in several pieces

    def _stop(self) -> None:
        """Every rank still alive: SIGTERM, then SIGKILL after SHUTDOWN_S; the output tailers flushed."""
        if self.pcontext is None:
            return
        with self.signals.held():
            self.outcome.stopping_since = self.outcome.stopping_since or time.time()
            self.pcontext.close(signal.SIGTERM, SHUTDOWN_S)


def rank_env(rank: int, nprocs: int, port: int, run_id: str) -> dict[str, str]:
    """What torchrun sets for a rank on one node (its documented variables), plus the store's owner."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
            "ROLE_NAME": "rank", "WORLD_SIZE": str(nprocs), "LOCAL_WORLD_SIZE": str(nprocs),
            "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": str(nprocs), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
            "TORCHELASTIC_RUN_ID": run_id, USE_AGENT_STORE: "True",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")}


def with_local_rank(args: tuple, rank: int) -> tuple:
    """torchrun's ${local_rank} macro in string arguments, replaced as its agent replaces it."""
    return tuple(Template(a).safe_substitute(local_rank=str(rank)) if isinstance(a, str) else a for a in args)


@contextlib.contextmanager
def _process_state(nprocs: int, timeout_s: float | None):
    """Let the agent do its work, then give the notebook process back its environment and logging: torch's
    logs every failure in full."""
    saved_env = {k: os.environ.get(k) for k in (SIGNALS_TO_HANDLE, "OMP_NUM_THREADS", PG_TIMEOUT_ENV)}
    os.environ[SIGNALS_TO_HANDLE] = ""  # no signal handlers from torch: see Signals
    if "OMP_NUM_THREADS" not in os.environ:  # as torchrun: share the cores instead of oversubscribing them
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nprocs))
    if timeout_s is None:  # the ranks' collectives keep torch's default timeout
        os.environ.pop(PG_TIMEOUT_ENV, None)
    else:  # read by distributed.setup(): a collective waits no longer than the whole launch may take
        os.environ[PG_TIMEOUT_ENV] = repr(timeout_s)
    # scalekit reports a failure itself, once, led by the rank that failed first
    # (every logger below them: torch gives some their own level, which a parent's level does not override)
    names = [n for n in list(logging.Logger.manager.loggerDict) if n.startswith(TORCH_LOGGERS)]
    logs = [logging.getLogger(name) for name in {*TORCH_LOGGERS, *names}]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for log, level in zip(logs, levels, strict=True):
            log.setLevel(level)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
