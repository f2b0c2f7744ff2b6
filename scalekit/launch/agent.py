"""The elastic agent of a launch: torch's LocalElasticAgent, with what a launch from a notebook needs besides.

It starts the ranks (forked, or fresh interpreters for a script), sets RANK / WORLD_SIZE / MASTER_ADDR for
torch.distributed, watches them and stops them all when one fails, when the time limit passes (dumping the
stacks of the ranks still running) or when a signal comes.  The rendezvous store listens on 127.0.0.1 only,
on a port the operating system picks, so two launches at once never collide and nothing is reachable from
outside.  Each rank's output goes to a file that torch's TailLog streams with the rank's prefix.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from torch.distributed import TCPStore
from torch.distributed.elastic.agent.server.api import RunResult, WorkerSpec, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, LogsDest
from torch.distributed.elastic.multiprocessing.tail_log import TailLog
from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous

from ..distributed import PG_TIMEOUT_ENV
from .rank import STACK_SIGNAL
from .run_files import RunFiles
from .signals import Signals

PREFIX = "[rank{rank}]: "
SHUTDOWN_S = 3  # after a failure, the other ranks get this long after SIGTERM before SIGKILL
STACK_WAIT_S = 1.0  # how long the launcher waits for those stacks before it stops the ranks
TORCH_LOGGERS = ("torch.distributed.elastic", "torch.multiprocessing")


@dataclass
class Outcome:
    """How the ranks of one launch ended: what the launch returns, or what the report tells."""

    nprocs: int
    forked: bool  # forked ranks running a function, or fresh interpreters running a script
    timeout_s: float | None
    return_values: dict[int, Any] = field(default_factory=dict)  # by rank, when every rank returned
    exit_codes: dict[int, int] = field(default_factory=dict)  # the exit codes torch collected, by rank
    exits: dict[int, tuple[float, int | None]] = field(default_factory=dict)  # the watcher's: rank: (time, code)
    timed_out: bool = False
    still_running: list[int] = field(default_factory=list)  # the ranks the time limit stopped
    stopping_since: float | None = None  # time.time() when the launcher began stopping ranks
    torch_failed: bool = False  # torch reported a failed rank

    @property
    def failed(self) -> bool:
        return self.timed_out or self.torch_failed


class LoopbackRendezvous(StaticTCPRendezvous):
    """torchrun's static rendezvous for one node, its store listening on 127.0.0.1 only, on a free port.

    The listening socket is bound here and handed to the TCPStore (master_listen_fd, which then owns it),
    so the port is the operating system's choice: no race with another launch picking the same number.
    """

    def __init__(self, run_id: str, timeout_s: int = 900):
        super().__init__("127.0.0.1", 0, rank=0, world_size=1, run_id=run_id, timeout=timeout_s)

    def next_rendezvous(self):
        if self._store is None:
            sock = socket.create_server(("127.0.0.1", 0))
            self.master_port = sock.getsockname()[1]
            self._store = TCPStore("127.0.0.1", self.master_port, 1, True, self.timeout, multi_tenant=True,
                                   master_listen_fd=sock.detach())
        return super().next_rendezvous()

    def close(self) -> None:
        self._store = None  # the store closes its listening socket


class FileLogsSpecs(DefaultLogsSpecs):
    """Send each rank's stdout/stderr to the files scalekit tails with its own rank prefix."""

    def __init__(self, files: RunFiles):
        super().__init__(log_dir=str(files.root / "elastic"))
        self._files = files

    def reify(self, envs) -> LogsDest:
        base = super().reify(envs)
        outs = {r: str(self._files.out(r)) for r in envs}
        errs = {r: str(self._files.err(r)) for r in envs}
        return LogsDest(outs, errs, {}, {}, base.error_files, base.filtered_stdout, base.filtered_stderr)


class ExitWatcher:
    """When each rank's process ended, and how, noted as it happens: a thread polls waitid(WNOWAIT), which
    reads a child's exit status without reaping it, so torch's agent still collects it as usual.  The agent
    itself reports one failure, in the order it happens to look, which is how rank 0's "Connection reset by
    peer" used to hide the rank 1 that had exited first."""

    POLL_S = 0.005

    def __init__(self):
        self.exits: dict[int, tuple[float, int | None]] = {}  # rank: (time.time(), exit code, or -signal)
        self._pids: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, pids: dict[int, int]) -> None:
        if not hasattr(os, "waitid"):  # then the report falls back on the agent's exit codes
            return
        self._pids = dict(pids)
        self._thread = threading.Thread(target=self._loop, name="scalekit-launch-exits", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while self._pids and not self._stop.is_set():
            for rank, pid in list(self._pids.items()):
                try:
                    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                except ChildProcessError:  # the agent reaped it before we looked: the time is all we have
                    code = None
                else:
                    if info is None:
                        continue
                    code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
                self.exits[rank] = (time.time(), code)
                del self._pids[rank]
            self._stop.wait(self.POLL_S)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


class Agent(LocalElasticAgent):
    """torch's LocalElasticAgent with what a launch from a notebook needs besides: a time limit, the time and
    status of every rank's exit, and signals (see Signals) held while ranks start or stop.  Every rank is
    stopped with SIGTERM, never with the SIGINT torch would pass on, which makes each rank print a
    KeyboardInterrupt traceback."""

    def __init__(self, spec, logs_specs, start_method: str, timeout_s: float | None, files: RunFiles,
                 signals: Signals):
        super().__init__(spec, logs_specs=logs_specs, start_method=start_method, shutdown_timeout=SHUTDOWN_S)
        self.nprocs = spec.local_world_size
        self.timeout_s = timeout_s
        self.timed_out = False
        self.deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self.files = files
        self.forked = start_method == "fork"
        self.exits = ExitWatcher()
        self.still_running: list[int] = []  # the ranks a timeout stopped
        self.stopping_since: float | None = None  # time.time() when the launcher began stopping ranks
        self.signals = signals

    def _start_workers(self, worker_group):
        if self.forked:
            # A forked rank inherits this process's garbage too: an earlier launch's store or process group
            # left in a reference cycle (a caught LaunchError's traceback holds one), whose destructor, run
            # by the rank's first garbage collection, joins threads the fork did not copy (SIGSEGV, or a
            # hang).  Frozen objects are never collected, so the ranks leave what they inherit alone.
            gc.freeze()
        try:
            with self.signals.held():
                pids = super()._start_workers(worker_group)
        finally:
            if self.forked:
                gc.unfreeze()  # this process collects its own garbage again, safely, where its threads are
            self.signals.install()  # in case this torch installed handlers of its own after all
        self.exits.watch({w.global_rank: pids[w.local_rank] for w in worker_group.workers})
        self.signals.raise_pending()  # now that every rank is known to the agent, which stops them all
        return pids

    def _monitor_workers(self, worker_group) -> RunResult:
        looked_at = time.time()
        result = super()._monitor_workers(worker_group)
        if result.state == WorkerState.FAILED:  # torch has begun stopping the other ranks already
            self.stopping_since = self.stopping_since or looked_at
        elif result.state == WorkerState.HEALTHY and self.deadline is not None and time.monotonic() >= self.deadline:
            self.stopping_since = time.time()
            self.timed_out = True
            self.still_running = [w.global_rank for w in worker_group.workers if self._running(w.global_rank)]
            if self.forked:
                self._dump_stacks({w.global_rank: w.id for w in worker_group.workers})
            return RunResult(state=WorkerState.FAILED)  # the agent stops every rank and returns this
        return result

    def _running(self, rank: int) -> bool:
        """Still in its function: not exited, and (a forked rank waits for the others once done) not done."""
        return rank not in self.exits.exits and not self.files.done(rank).exists()

    def _dump_stacks(self, pids: dict[int, int]) -> None:
        files = {r: self.files.stacks(r) for r in self.still_running}
        for r in self.still_running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pids[r], STACK_SIGNAL)
        deadline = time.monotonic() + STACK_WAIT_S
        while time.monotonic() < deadline and not all(f.exists() and f.stat().st_size for f in files.values()):
            time.sleep(0.02)
        time.sleep(0.05)  # the handler writes in several pieces

    def _shutdown(self, death_sig=signal.SIGTERM, timeout: int = 30) -> None:
        if self.stopping_since is None and self._pcontext is not None:
            self.stopping_since = time.time()
        with self.signals.held():
            super()._shutdown(signal.SIGTERM, timeout)

    def exit_codes(self) -> dict[int, int]:
        """The exit code of every rank torch collected (rank = local rank: one node), for ranks the watcher
        saw only after the agent had reaped them."""
        codes = {}
        pc = getattr(self._pcontext, "_pc", None)  # fork: torch.multiprocessing's ProcessContext
        for local, proc in enumerate(getattr(pc, "processes", None) or []):
            codes[local] = proc.exitcode
        for local, handler in (getattr(self._pcontext, "subprocess_handlers", None) or {}).items():  # spawn
            codes[local] = handler.proc.returncode
        return {r: c for r, c in codes.items() if c is not None}

    def remove_error_files(self) -> None:
        """torch.multiprocessing leaves one pytorch-errorfile-*.pickle per forked rank in the temp folder."""
        pc = getattr(self._pcontext, "_pc", None)
        for path in getattr(pc, "error_files", None) or []:
            with contextlib.suppress(OSError):
                os.remove(path)

    def outcome(self, result) -> Outcome:
        return Outcome(self.nprocs, self.forked, self.timeout_s, dict(result.return_values),
                       {**self.exit_codes(), **{r: f.exitcode for r, f in result.failures.items()}},
                       dict(self.exits.exits), timed_out=self.timed_out, still_running=list(self.still_running),
                       stopping_since=self.stopping_since, torch_failed=result.is_failed())


def run_agent(entrypoint, args, nprocs: int, start_method: str, files: RunFiles, timeout_s: float | None,
              signals: Signals) -> Outcome:
    """Run `entrypoint` in `nprocs` ranks and say how they ended."""
    prefixes = {r: PREFIX.format(rank=r) for r in range(nprocs)}
    rdzv = LoopbackRendezvous(f"scalekit-{uuid.uuid4().hex[:12]}")
    spec = WorkerSpec(role="rank", local_world_size=nprocs, entrypoint=entrypoint, args=tuple(args),
                      rdzv_handler=rdzv, max_restarts=0, monitor_interval=0.05, local_addr="127.0.0.1")
    if start_method == "fork":  # the ranks redirect their own output (see rank_main)
        logs_specs = DefaultLogsSpecs(log_dir=str(files.root / "elastic"))
    else:  # fresh interpreters: the agent points their output at the files we tail
        logs_specs = FileLogsSpecs(files)
    agent = Agent(spec, logs_specs, start_method, timeout_s, files, signals)
    tails = []
    try:
        with _process_state(nprocs, timeout_s):
            tails = [TailLog("rank", {r: str(files.out(r)) for r in range(nprocs)}, sys.stdout, prefixes).start(),
                     TailLog("rank", {r: str(files.err(r)) for r in range(nprocs)}, sys.stderr, prefixes).start()]
            result = agent.run()
        return agent.outcome(result)
    finally:
        with signals.held():
            agent.exits.stop()
            for tail in tails:
                tail.stop()
            # the store is freed now, here, even when the agent lives on in a traceback (see _start_workers)
            agent._store = agent._worker_group.store = None
            rdzv.close()
            agent.remove_error_files()


@contextlib.contextmanager
def _process_state(nprocs: int, timeout_s: float | None):
    """Let the agent do its work, then give the notebook process back its environment and logging: torch's
    logs every failure in full."""
    saved_env = {k: os.environ.get(k) for k in ("TORCHELASTIC_SIGNALS_TO_HANDLE", "OMP_NUM_THREADS", PG_TIMEOUT_ENV)}
    os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = ""  # no signal handlers from torch: see Signals
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
