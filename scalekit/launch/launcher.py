"""`launch(fn, *args, nprocs=N)`: run a function in N ranks on torch.distributed, from a notebook cell.

It is torchrun's machinery, driven in-process: torch.distributed.elastic's LocalElasticAgent starts the
ranks with the "fork" start method (so a function defined in the notebook needs no pickling, as in
accelerate's notebook_launcher), sets RANK / WORLD_SIZE / MASTER_ADDR for torch.distributed, watches the
ranks and stops them all when one fails.  The rendezvous store listens on 127.0.0.1 only, on a port the
operating system picks, so two launches at once never collide and nothing is reachable from outside.

Each rank writes its stdout/stderr to a file that torch's TailLog streams into the cell, every line
prefixed with the rank.  When a rank fails, the launch raises LaunchError led by the rank that failed
FIRST and how (its Python traceback, an exit code or a signal); the others usually fail after it on a
closed connection, and are listed after it as consequences (see _report).  `timeout_s` ends every rank
when the limit passes and names the ranks still running, and where each one was.  The ranks' files live
in a temporary folder that is removed however the launch ends, unless keep_logs=True.
A forked rank runs torch's CPU ops on one thread (see _rank_main); fresh interpreters (`launch_script`,
the %%torchrun magic) can use more.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import io
import json
import logging
import math
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.distributed import TCPStore
from torch.distributed.elastic.agent.server.api import RunResult, WorkerSpec, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, LogsDest
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.tail_log import TailLog
from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous

from .. import hardware
from ..distributed import PG_TIMEOUT_ENV
from ..errors import ConfigError
from . import guards

PREFIX = "[rank{rank}]: "
SHUTDOWN_S = 3  # after a failure, the other ranks get this long after SIGTERM before SIGKILL
AGENT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
STACK_SIGNAL = signal.SIGUSR1  # at a timeout, a forked rank writes where it is (faulthandler) on this signal
STACK_WAIT_S = 1.0  # how long the launcher waits for those stacks before it stops the ranks
TORCH_LOGGERS = ("torch.distributed.elastic", "torch.multiprocessing")
INTERRUPTED = "launch interrupted: every rank was stopped"
# how a rank fails when a rank it talks to has gone (gloo, NCCL, the c10d store): a consequence, not a cause
PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Connection refused",
             "remote process exited", "communicator was aborted", "DistNetworkError", "DistStoreError",
             "Socket Timeout", "Timed out waiting", "Watchdog caught collective operation timeout")


class LaunchError(RuntimeError):
    """A rank failed, or the launch ran past its time limit.

    `rank` is the rank that failed first (None after a timeout) and `rank_traceback` its Python traceback
    ("" when it ended without one); `still_running` lists the ranks a timeout stopped; `logs_dir` is the
    folder of the ranks' output when it was kept (keep_logs=True), else None."""

    def __init__(self, message: str, rank: int | None = None, rank_traceback: str = "",
                 still_running: tuple[int, ...] = (), logs_dir: str | None = None):
        super().__init__(message)
        self.rank = rank
        self.rank_traceback = rank_traceback
        self.still_running = list(still_running)
        self.timed_out = bool(still_running)
        self.logs_dir = logs_dir


def launch(fn: Callable, *args, nprocs: int | None = None, kwargs: dict | None = None,
           timeout_s: float | None = None, keep_logs: bool = False) -> list:
    """Run fn(*args, **kwargs) in `nprocs` ranks and return every rank's return value, in rank order.

    Inside fn, torch.distributed.init_process_group() needs no arguments (the environment is set), or
    let scalekit.run do it: a RunConfig with the ddp or fsdp toggle joins the ranks by itself.
    nprocs defaults to one rank per GPU (counted without initialising CUDA), or 2 on a CPU machine.
    timeout_s: stop every rank after this many seconds and raise LaunchError naming the ranks still running
    (scalekit.run's process group then uses the same limit for its collectives); None waits as long as the
    ranks run.  keep_logs: keep the folder of the ranks' output (its path is printed) instead of removing it.
    Ctrl-C stops every rank and raises KeyboardInterrupt.
    """
    guards.check_fork_safe()
    nprocs = _check_nprocs(nprocs)
    timeout_s = _check_timeout(timeout_s)
    if kwargs is not None and not isinstance(kwargs, dict):
        raise ConfigError(f"launch(kwargs=...) must be a dict of keyword arguments for fn, got {type(kwargs).__name__}")
    with _Signals() as signals, _run_folder(keep_logs, signals) as run_dir:
        logs = _log_files(run_dir, nprocs)
        for path in [*logs["out"].values(), *logs["err"].values()]:
            path.touch()

        def rank_main(*rank_args):
            return _rank_main(fn, rank_args, kwargs or {}, run_dir)

        rank_main.__name__ = rank_main.__qualname__ = getattr(fn, "__name__", "fn")
        agent, result = _run_agent(rank_main, args, nprocs, "fork", run_dir, logs, timeout_s, signals)
        if result.is_failed():
            raise _report(agent, result, nprocs, run_dir, keep_logs)
        return [result.return_values[r] for r in range(nprocs)]


def launch_script(script: str, script_args=(), nprocs: int | None = None, module: bool = False,
                  timeout_s: float | None = None, keep_logs: bool = False) -> int:
    """Run a Python script (or module, with module=True) in `nprocs` fresh interpreters on this machine,
    on the same loopback rendezvous as `launch`, with the same timeout_s and keep_logs.  Returns 0, or
    raises LaunchError."""
    nprocs = _check_nprocs(nprocs)
    timeout_s = _check_timeout(timeout_s)
    with _Signals() as signals, _run_folder(keep_logs, signals) as run_dir:
        logs = _log_files(run_dir, nprocs)
        target = ["-m", script] if module else [script]
        agent, result = _run_agent(sys.executable, ("-u", *target, *script_args), nprocs, "spawn", run_dir, logs,
                                   timeout_s, signals)
        if result.is_failed():
            raise _report(agent, result, nprocs, run_dir, keep_logs)
        return 0


def launch_run(config, nprocs: int | None = None, catch_errors: bool = False, timeout_s: float | None = None,
               keep_logs: bool = False):
    """scalekit.run(config) in `nprocs` ranks; the result aggregated over ranks (rank 0's copy).

    This is how `scalekit bench --nproc-per-node` runs the ddp / fsdp toggles (and how the Lab does).
    With catch_errors, a failed launch (a timeout included) comes back as a result with status "failed" and
    the error in a line.  timeout_s and keep_logs as for `launch`.
    """
    from ..measure.results import RunResult

    try:
        return launch(_run_config, config, nprocs=nprocs, timeout_s=timeout_s, keep_logs=keep_logs)[0]
    except (LaunchError, guards.ForkUnsafeError) as exc:
        if not catch_errors:
            raise
        lines = str(exc).strip().splitlines()
        # a timeout's first line names the ranks still running; the next say where each one was
        error = "; ".join(line.strip() for line in lines) if getattr(exc, "timed_out", False) else lines[0]
        return RunResult(label=config.label or config.describe(), config=config.to_dict(), status="failed",
                         error=error[:600])


def _run_config(config):
    from ..engine import run

    return run(config)


# -- the parent side ---------------------------------------------------------------------------------------
def _check_nprocs(nprocs) -> int:
    if nprocs is None:
        return guards.default_nprocs()
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ConfigError(f"launch(nprocs=...) must be a positive integer (the number of ranks: 1, 2, ...) or "
                          f"None for the default, got {nprocs!r}")
    gpus = hardware.gpu_count_without_cuda_init() if hardware.cuda_gpu_present() else 0
    if gpus and nprocs > gpus:
        raise ConfigError(f"launch(nprocs={nprocs}): this machine has {gpus} GPU(s) and NCCL runs one rank per "
                          f"GPU; use nprocs <= {gpus}")
    return nprocs


def _check_timeout(timeout_s) -> float | None:
    if timeout_s is None:
        return None
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not math.isfinite(timeout_s) \
            or timeout_s <= 0:
        raise ConfigError(f"launch(timeout_s=...) must be a positive number of seconds, or None for no limit; "
                          f"got {timeout_s!r}")
    return float(timeout_s)


class _Signals:
    """Ctrl-C (SIGINT), SIGTERM, SIGHUP and SIGQUIT while a launch runs in the main thread.

    They raise torch's SignalException, which the agent answers by stopping every rank, except while ranks
    are being started or stopped or the launch is cleaning up (`held`): a signal then waits until that is
    done, so no rank is left half-started and no folder half-removed, however often Ctrl-C is pressed.
    torch installs handlers of its own that raise at any moment; TORCHELASTIC_SIGNALS_TO_HANDLE="" (set in
    _agent_process_state) keeps them out.  Leaving, a SIGINT becomes KeyboardInterrupt."""

    def __init__(self):
        self.pending: int | None = None
        self._holding = 0
        self._saved = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._saved = {s: signal.getsignal(s) for s in AGENT_SIGNALS}
            self.install()
        return self

    def install(self) -> None:
        for s in self._saved:
            signal.signal(s, self._handler)

    def _handler(self, signum, frame) -> None:
        if self._holding:
            self.pending = signum
            return
        raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))

    @contextlib.contextmanager
    def held(self):
        self._holding += 1
        try:
            yield
        finally:
            self._holding -= 1

    def raise_pending(self) -> None:
        if self.pending is not None and not self._holding:
            signum, self.pending = self.pending, None
            self._handler(signum, None)

    def __exit__(self, exc_type, exc, tb):
        for s, h in self._saved.items():
            signal.signal(s, h)
        if exc_type is None and self.pending is not None:  # it came while the launch was cleaning up
            exc = SignalException("", sigval=signal.Signals(self.pending))
        if isinstance(exc, SignalException):
            if exc.sigval == signal.SIGINT:
                raise KeyboardInterrupt(INTERRUPTED) from None
            raise exc
        return False


@contextlib.contextmanager
def _run_folder(keep_logs: bool, signals: _Signals):
    """The folder of one launch's rank output and records: removed however the launch ends, unless kept."""
    run_dir = Path(tempfile.mkdtemp(prefix="scalekit-launch-"))
    try:
        yield run_dir
    finally:
        with signals.held():
            if keep_logs:
                print(f"scalekit.launch: the ranks' logs are kept in {run_dir}", file=sys.stderr, flush=True)
            else:
                shutil.rmtree(run_dir, ignore_errors=True)


def _log_files(run_dir: Path, nprocs: int) -> dict:
    return {stream: {r: run_dir / f"rank{r}.{stream}" for r in range(nprocs)} for stream in ("out", "err")}


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

    def __init__(self, run_dir: Path, logs: dict):
        super().__init__(log_dir=str(run_dir / "elastic"))
        self._logs = logs

    def reify(self, envs) -> LogsDest:
        base = super().reify(envs)
        outs = {r: str(self._logs["out"][r]) for r in envs}
        errs = {r: str(self._logs["err"][r]) for r in envs}
        return LogsDest(outs, errs, {}, {}, base.error_files, base.filtered_stdout, base.filtered_stderr)


class _ExitWatcher:
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


class _Agent(LocalElasticAgent):
    """torch's LocalElasticAgent with what a launch from a notebook needs besides: a time limit, the time and
    status of every rank's exit, and signals (see _Signals) held while ranks start or stop.  Every rank is
    stopped with SIGTERM, never with the SIGINT torch would pass on, which makes each rank print a
    KeyboardInterrupt traceback."""

    def __init__(self, spec, logs_specs, start_method: str, timeout_s: float | None, run_dir: Path,
                 signals: _Signals):
        super().__init__(spec, logs_specs=logs_specs, start_method=start_method, shutdown_timeout=SHUTDOWN_S)
        self.timeout_s = timeout_s
        self.deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self.run_dir = run_dir
        self.forked = start_method == "fork"
        self.exits = _ExitWatcher()
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
            self.still_running = [w.global_rank for w in worker_group.workers if self._running(w.global_rank)]
            if self.forked:
                self._dump_stacks({w.global_rank: w.id for w in worker_group.workers})
            return RunResult(state=WorkerState.FAILED)  # the agent stops every rank and returns this
        return result

    def _running(self, rank: int) -> bool:
        """Still in its function: not exited, and (a forked rank waits for the others once done) not done."""
        return rank not in self.exits.exits and not (self.run_dir / f"done-rank{rank}").exists()

    def _dump_stacks(self, pids: dict[int, int]) -> None:
        files = {r: self.run_dir / f"stack-rank{r}.txt" for r in self.still_running}
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


def _run_agent(entrypoint, args, nprocs: int, start_method: str, run_dir: Path, logs: dict,
               timeout_s: float | None, signals: _Signals):
    prefixes = {r: PREFIX.format(rank=r) for r in range(nprocs)}
    rdzv = LoopbackRendezvous(f"scalekit-{uuid.uuid4().hex[:12]}")
    spec = WorkerSpec(role="rank", local_world_size=nprocs, entrypoint=entrypoint, args=tuple(args),
                      rdzv_handler=rdzv, max_restarts=0, monitor_interval=0.05, local_addr="127.0.0.1")
    if start_method == "fork":  # the ranks redirect their own output (see _rank_main)
        logs_specs = DefaultLogsSpecs(log_dir=str(run_dir / "elastic"))
    else:  # fresh interpreters: the agent points their output at the files we tail
        logs_specs = FileLogsSpecs(run_dir, logs)
    agent = _Agent(spec, logs_specs, start_method, timeout_s, run_dir, signals)
    tails = []
    try:
        with _agent_process_state(nprocs, timeout_s):
            tails = [TailLog("rank", {r: str(p) for r, p in logs["out"].items()}, sys.stdout, prefixes).start(),
                     TailLog("rank", {r: str(p) for r, p in logs["err"].items()}, sys.stderr, prefixes).start()]
            result = agent.run()
        return agent, result
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
def _agent_process_state(nprocs: int, timeout_s: float | None):
    """Let the agent do its work, then give the notebook process back its environment and logging: torch's
    logs every failure in full."""
    saved_env = {k: os.environ.get(k) for k in ("TORCHELASTIC_SIGNALS_TO_HANDLE", "OMP_NUM_THREADS", PG_TIMEOUT_ENV)}
    os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = ""  # no signal handlers from torch: see _Signals
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


# -- the report ---------------------------------------------------------------------------------------------
@dataclass
class _RankEnd:
    """How one rank ended, as the report tells it."""

    rank: int
    kind: str  # "raised" (a Python exception), "exited" (an exit code or a signal), "stopped", "finished"
    time: float = math.inf  # when it failed (time.time()); inf when not known
    text: str = ""  # what happened, in words, after "rank N "
    traceback: str = ""
    consequence: bool = False  # it failed because another rank had gone (a closed connection, a timeout)


def _report(agent: _Agent, result, nprocs: int, run_dir: Path, keep_logs: bool) -> LaunchError:
    """The LaunchError for a failed launch: the first rank that failed, how, then what the others did."""
    ends = _rank_ends(agent, result, nprocs, run_dir)
    logs = f"\nLogs: {run_dir}" if keep_logs else ""
    logs_dir = str(run_dir) if keep_logs else None
    if agent.still_running:
        return _timeout_error(agent, ends, run_dir, logs, logs_dir)
    failures = sorted((e for e in ends.values() if e.kind in ("raised", "exited")),
                      key=lambda e: (e.consequence, e.time))
    if not failures:  # torch saw a failure none of our records shows
        if not result.failures:
            return LaunchError(f"the launch failed and no rank says why; the ranks' output is above{logs}",
                               logs_dir=logs_dir)
        rank, failure = min(result.failures.items())
        return LaunchError(f"rank {rank} ended with {_how(failure.exitcode)}; its output is above{logs}",
                           rank=rank, logs_dir=logs_dir)
    first = failures[0]
    message = f"rank {first.rank} {first.text}" + (f"\n\n{first.traceback.rstrip()}" if first.traceback else "")
    after = []
    for end in sorted(ends.values(), key=lambda e: (e.time, e.rank)):
        if end is first or end.kind == "finished":
            continue
        if end.kind == "stopped":
            after.append(f"  rank {end.rank} was stopped by the launcher")
        else:
            note = " — most likely a consequence: a rank it was talking to had gone" if end.consequence else ""
            after.append(f"  rank {end.rank} {_short(end.text)}{note}")
    if after:
        message += "\nAfter it:\n" + "\n".join(after)
    return LaunchError(message + logs, rank=first.rank, rank_traceback=first.traceback, logs_dir=logs_dir)


def _rank_ends(agent: _Agent, result, nprocs: int, run_dir: Path) -> dict[int, _RankEnd]:
    records = {}
    for path in run_dir.glob("failure-rank*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            record = json.loads(path.read_text())
            records[record["rank"]] = record
    codes = agent.exit_codes()
    ends = {}
    for rank in range(nprocs):
        exit_time, code = agent.exits.exits.get(rank, (None, None))
        when = math.inf if exit_time is None else exit_time
        if code is None:
            code = codes.get(rank)
        if code is None and rank in result.failures:
            code = result.failures[rank].exitcode
        after_stop = agent.stopping_since is not None and exit_time is not None and exit_time >= agent.stopping_since
        # ended by the launcher's SIGTERM (or its SIGKILL after SHUTDOWN_S); torch may reap such a rank before
        # the watcher sees it, so an unseen exit by these signals counts as stopped too
        stopped = agent.stopping_since is not None and code in (-signal.SIGTERM, -signal.SIGKILL) and (
            exit_time is None or exit_time >= agent.stopping_since)
        if rank in records:  # a forked rank that raised: its traceback and the time it raised
            r = records[rank]
            ends[rank] = _RankEnd(rank, "raised", r["time"], f"failed: {r['error']}", r["traceback"],
                                  consequence=_peer_gone(r["error"]))
        elif rank in agent.still_running or code is None:
            ends[rank] = _RankEnd(rank, "stopped")
        elif code == 0 or (agent.forked and (run_dir / f"done-rank{rank}").exists()):
            ends[rank] = _RankEnd(rank, "finished")
        elif stopped:
            ends[rank] = _RankEnd(rank, "stopped", when)
        elif agent.forked:
            ends[rank] = _RankEnd(rank, "exited", when,
                                  f"ended with {_how(code)} and no Python exception (killed, out of memory, or a "
                                  f"crash in native code); its output is above", consequence=after_stop)
        else:  # a script: its traceback, if any, is in its output; the last line says what it was
            last = _last_line(run_dir / f"rank{rank}.err")
            ends[rank] = _RankEnd(rank, "exited", when,
                                  f"ended with {_how(code)}; its output is above"
                                  + (f" (its last line: {last[:300]})" if last else ""),
                                  consequence=after_stop or _peer_gone(last))
    return ends


def _timeout_error(agent: _Agent, ends: dict, run_dir: Path, logs: str, logs_dir) -> LaunchError:
    running = agent.still_running
    lines = [f"the launch reached its time limit of {agent.timeout_s:g} s (timeout_s): {_ranks(running)} "
             f"{'was' if len(running) == 1 else 'were'} still running, and every rank was stopped"]
    for rank in running:
        where = _where(run_dir / f"stack-rank{rank}.txt")
        if where:
            lines.append(f"  rank {rank} was in {where}")
    finished = [r for r, e in ends.items() if e.kind == "finished"]
    if finished:
        lines.append(f"  {_ranks(finished)} had finished")
    return LaunchError("\n".join(lines) + logs, still_running=tuple(running), logs_dir=logs_dir)


def _how(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
        return f"signal {-code}"
    return f"exit code {code}"


def _peer_gone(text: str) -> bool:
    return any(p in text for p in PEER_GONE)


def _short(text: str, limit: int = 300) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[:limit] + " …"


def _last_line(path: Path) -> str:
    with contextlib.suppress(OSError):
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
        return lines[-1] if lines else ""
    return ""


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<fn>\S+)')
TORCH_DIR = os.path.dirname(torch.__file__)


def _where(stack_file: Path) -> str:
    """Where a rank's function was, from the faulthandler dump it wrote on STACK_SIGNAL: the innermost frame
    of its main thread (the one running _rank_main), and the innermost frame of the user's code if that is
    another (a rank waiting in a collective is in torch, called from the user's function)."""
    with contextlib.suppress(OSError):
        for block in stack_file.read_text(errors="replace").split("\n\n"):
            frames = [m.groupdict() for m in FRAME.finditer(block)]
            if not any(f["fn"] == "_rank_main" for f in frames):
                continue
            frames = frames[:next(i for i, f in enumerate(frames) if f["fn"] == "_rank_main")]
            if not frames:
                return ""
            inner = frames[0]
            text = f"{inner['fn']} ({_short_path(inner['path'])}:{inner['line']})"
            user = next((f for f in frames if not f["path"].startswith((TORCH_DIR, os.path.dirname(__file__)))),
                        None)
            if user is not None and user is not inner:
                text += f", called from {user['fn']} ({_short_path(user['path'])}:{user['line']})"
            return text
    return ""


def _short_path(path: str) -> str:
    if path.startswith(TORCH_DIR):
        return "torch" + path[len(TORCH_DIR):]
    with contextlib.suppress(ValueError):
        return os.path.relpath(path) if not os.path.relpath(path).startswith("..") else path
    return path


# -- the rank side -----------------------------------------------------------------------------------------
def _rank_main(fn, args, kwargs, run_dir: Path):
    """Runs in each forked rank: fresh signal handlers and output files, then fn."""
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    os.environ["SCALEKIT_LAUNCHED_RANK"] = str(rank)
    # the notebook's (or the agent's) handlers were inherited: a rank should simply end on SIGTERM
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(s, signal.SIG_DFL)
    # Ctrl-C (a terminal's, or Jupyter's interrupt, which signals the kernel's whole process group) is for the
    # launcher, which stops every rank with SIGTERM: each rank raising KeyboardInterrupt would print a traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stdout = _redirect(1, run_dir / f"rank{local}.out")
    sys.stderr = _redirect(2, run_dir / f"rank{local}.err")
    # at a timeout the launcher asks every rank still running where it is; the answer goes to its own file
    stacks = open(run_dir / f"stack-rank{rank}.txt", "w")  # noqa: SIM115 - open for the rank's whole life
    faulthandler.register(STACK_SIGNAL, file=stacks, all_threads=True)
    # GNU OpenMP cannot run a parallel region in a child forked after the parent ran one (it waits for
    # threads the fork did not copy): like DataLoader workers, a forked rank computes on one thread.
    torch.set_num_threads(1)
    if "GLOO_SOCKET_IFNAME" not in os.environ and _loopback_interface():
        os.environ["GLOO_SOCKET_IFNAME"] = _loopback_interface()  # one machine: keep gloo on loopback
    try:
        out = fn(*args, **kwargs)
        _close_leftover_group()
        (run_dir / f"done-rank{rank}").touch()  # it waits for the others now: not "still running" at a timeout
        return out
    except BaseException as exc:
        # the traceback from fn down (this wrapper's own frame left out)
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next))
        sys.stderr.write(tb)
        sys.stderr.flush()
        report = {"rank": rank, "time": time.time(), "error": f"{type(exc).__name__}: {exc}", "traceback": tb}
        (run_dir / f"failure-rank{rank}.json").write_text(json.dumps(report))
        raise


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
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
