"""`launch(fn, *args, nprocs=N)`: run a function in N ranks on torch.distributed, from a notebook cell.

It is torchrun's machinery, driven in-process: torch.distributed.elastic's LocalElasticAgent starts the
ranks with the "fork" start method (so a function defined in the notebook needs no pickling, as in
accelerate's notebook_launcher), sets RANK / WORLD_SIZE / MASTER_ADDR for torch.distributed, watches the
ranks and stops them all when one fails.  The rendezvous store listens on 127.0.0.1 only, on a port the
operating system picks, so two launches at once never collide and nothing is reachable from outside.

Each rank writes its stdout/stderr to a file that torch's TailLog streams into the cell, every line
prefixed with the rank.  A rank that raises prints its traceback; the launch then raises LaunchError with
the traceback of the rank that failed first (the others usually fail after it, on a closed connection).
A forked rank runs torch's CPU ops on one thread (see _rank_main); fresh interpreters (`launch_script`,
the %%torchrun magic) can use more.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
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
from pathlib import Path

from torch.distributed import TCPStore
from torch.distributed.elastic.agent.server.api import WorkerSpec
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, LogsDest
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.tail_log import TailLog
from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous

from .. import hardware
from ..errors import ConfigError
from . import guards

PREFIX = "[rank{rank}]: "
SHUTDOWN_S = 3  # after a failure, the other ranks get this long after SIGTERM before SIGKILL
AGENT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


class LaunchError(RuntimeError):
    """A rank failed.  `rank` is the rank that failed first, `rank_traceback` its traceback."""

    def __init__(self, message: str, rank: int | None = None, rank_traceback: str = ""):
        super().__init__(message)
        self.rank = rank
        self.rank_traceback = rank_traceback


def launch(fn: Callable, *args, nprocs: int | None = None, kwargs: dict | None = None) -> list:
    """Run fn(*args, **kwargs) in `nprocs` ranks and return every rank's return value, in rank order.

    Inside fn, torch.distributed.init_process_group() needs no arguments (the environment is set), or
    let scalekit.run do it: a RunConfig with the ddp or fsdp toggle joins the ranks by itself.
    nprocs defaults to one rank per GPU (counted without initialising CUDA), or 2 on a CPU machine.
    """
    guards.check_fork_safe()
    nprocs = _check_nprocs(nprocs)
    if kwargs is not None and not isinstance(kwargs, dict):
        raise ConfigError(f"launch(kwargs=...) must be a dict of keyword arguments for fn, got {type(kwargs).__name__}")
    run_dir = Path(tempfile.mkdtemp(prefix="scalekit-launch-"))
    logs = {stream: {r: run_dir / f"rank{r}.{stream}" for r in range(nprocs)} for stream in ("out", "err")}
    for path in [*logs["out"].values(), *logs["err"].values()]:
        path.touch()

    def rank_main(*rank_args):
        return _rank_main(fn, rank_args, kwargs or {}, run_dir)

    rank_main.__name__ = rank_main.__qualname__ = getattr(fn, "__name__", "fn")
    result = _run_agent(rank_main, args, nprocs, "fork", run_dir, logs)
    if result.is_failed():
        raise _launch_error(result, run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    return [result.return_values[r] for r in range(nprocs)]


def launch_script(script: str, script_args=(), nprocs: int | None = None, module: bool = False) -> int:
    """Run a Python script (or module, with module=True) in `nprocs` fresh interpreters on this machine,
    on the same loopback rendezvous as `launch`.  Returns 0, or raises LaunchError."""
    nprocs = _check_nprocs(nprocs)
    run_dir = Path(tempfile.mkdtemp(prefix="scalekit-launch-"))
    logs = {stream: {r: run_dir / f"rank{r}.{stream}" for r in range(nprocs)} for stream in ("out", "err")}
    target = ["-m", script] if module else [script]
    result = _run_agent(sys.executable, ("-u", *target, *script_args), nprocs, "spawn", run_dir, logs)
    if result.is_failed():
        raise _launch_error(result, run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    return 0


def launch_run(config, nprocs: int | None = None, catch_errors: bool = False):
    """scalekit.run(config) in `nprocs` ranks; the result aggregated over ranks (rank 0's copy).

    This is how `scalekit bench --nproc-per-node` runs the ddp / fsdp toggles (and how a widget can).
    With catch_errors, a failed launch comes back as a result with status "failed" and the error in words.
    """
    from ..measure.results import RunResult

    try:
        return launch(_run_config, config, nprocs=nprocs)[0]
    except (LaunchError, guards.ForkUnsafeError) as exc:
        if not catch_errors:
            raise
        first = str(exc).strip().splitlines()[0]
        return RunResult(label=config.label or config.describe(), config=config.to_dict(), status="failed",
                         error=first[:400])


def _run_config(config):
    from ..engine import run

    return run(config)


# -- the parent side ---------------------------------------------------------------------------------------
def _check_nprocs(nprocs) -> int:
    if nprocs is None:
        return guards.default_nprocs()
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ConfigError(f"launch(nprocs=...) must be a positive integer, got {nprocs!r}")
    gpus = hardware.gpu_count_without_cuda_init() if hardware.cuda_gpu_present() else 0
    if gpus and nprocs > gpus:
        raise ConfigError(f"launch(nprocs={nprocs}): this machine has {gpus} GPU(s) and NCCL runs one rank per "
                          f"GPU; use nprocs <= {gpus}")
    return nprocs


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


def _run_agent(entrypoint, args, nprocs: int, start_method: str, run_dir: Path, logs: dict):
    prefixes = {r: PREFIX.format(rank=r) for r in range(nprocs)}
    rdzv = LoopbackRendezvous(f"scalekit-{uuid.uuid4().hex[:12]}")
    spec = WorkerSpec(role="rank", local_world_size=nprocs, entrypoint=entrypoint, args=tuple(args),
                      rdzv_handler=rdzv, max_restarts=0, monitor_interval=0.05, local_addr="127.0.0.1")
    if start_method == "fork":  # the ranks redirect their own output (see _rank_main)
        logs_specs = DefaultLogsSpecs(log_dir=str(run_dir / "elastic"))
    else:  # fresh interpreters: the agent points their output at the files we tail
        logs_specs = FileLogsSpecs(run_dir, logs)
    agent = LocalElasticAgent(spec, logs_specs=logs_specs, start_method=start_method,
                              shutdown_timeout=SHUTDOWN_S)
    tails = [TailLog("rank", {r: str(p) for r, p in logs["out"].items()}, sys.stdout, prefixes).start(),
             TailLog("rank", {r: str(p) for r, p in logs["err"].items()}, sys.stderr, prefixes).start()]
    try:
        with _agent_process_state(nprocs):
            return agent.run()
    finally:
        for tail in tails:
            tail.stop()
        rdzv.close()


@contextlib.contextmanager
def _agent_process_state(nprocs: int):
    """Let the agent do its work, then give the notebook process back its signal handlers, environment and
    logging: the agent installs SIGINT/SIGTERM handlers and logs every failure in full."""
    main = threading.current_thread() is threading.main_thread()
    handlers = {s: signal.getsignal(s) for s in AGENT_SIGNALS} if main else {}
    saved_env = {k: os.environ.get(k) for k in ("TORCHELASTIC_SIGNALS_TO_HANDLE", "OMP_NUM_THREADS")}
    if "OMP_NUM_THREADS" not in os.environ:  # as torchrun: share the cores instead of oversubscribing them
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nprocs))
    # scalekit reports a failure itself, once, with the rank's traceback
    logs = [logging.getLogger(name) for name in ("torch.distributed.elastic", "torch.multiprocessing")]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.CRITICAL)
    try:
        yield
    except Exception as exc:
        if isinstance(exc, SignalException) and exc.sigval == signal.SIGINT:
            raise KeyboardInterrupt("launch interrupted: every rank was stopped") from None
        raise
    finally:
        for log, level in zip(logs, levels, strict=True):
            log.setLevel(level)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for s, h in handlers.items():
            signal.signal(s, h)


def _launch_error(result, run_dir: Path) -> LaunchError:
    reports = []
    for path in run_dir.glob("failure-rank*.json"):
        with contextlib.suppress(OSError, ValueError):
            reports.append(json.loads(path.read_text()))
    if reports:
        first = min(reports, key=lambda r: r["time"])
        others = sorted(r["rank"] for r in reports if r is not first)
        tail = f"\n(ranks {others} failed after it)" if others else ""
        return LaunchError(f"rank {first['rank']} failed: {first['error']}\n\n{first['traceback']}{tail}",
                           rank=first["rank"], rank_traceback=first["traceback"])
    # no Python exception was recorded: killed by a signal, os._exit, or a crash in native code
    rank, failure = min(result.failures.items())
    how = f"exit code {failure.exitcode}"
    if failure.exitcode is not None and failure.exitcode < 0:
        with contextlib.suppress(ValueError):
            how = f"signal {signal.Signals(-failure.exitcode).name}"
    message = failure.message if isinstance(failure.message, str) else json.dumps(failure.message)[:2000]
    return LaunchError(f"rank {rank} ended with {how} and no Python exception (killed, out of memory, or a "
                       f"crash in native code); its output is above.  Logs: {run_dir}\n{message}", rank=rank)


# -- the rank side -----------------------------------------------------------------------------------------
def _rank_main(fn, args, kwargs, run_dir: Path):
    """Runs in each forked rank: fresh signal handlers and output files, then fn."""
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    os.environ["SCALEKIT_LAUNCHED_RANK"] = str(rank)
    # the notebook's (or the agent's) handlers were inherited: a rank should simply end on SIGTERM
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(s, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.stdout = _redirect(1, run_dir / f"rank{local}.out")
    sys.stderr = _redirect(2, run_dir / f"rank{local}.err")
    import torch

    # GNU OpenMP cannot run a parallel region in a child forked after the parent ran one (it waits for
    # threads the fork did not copy): like DataLoader workers, a forked rank computes on one thread.
    torch.set_num_threads(1)
    if "GLOO_SOCKET_IFNAME" not in os.environ and _loopback_interface():
        os.environ["GLOO_SOCKET_IFNAME"] = _loopback_interface()  # one machine: keep gloo on loopback
    try:
        out = fn(*args, **kwargs)
        _close_leftover_group()
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
    import gc

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
