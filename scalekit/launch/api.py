"""`launch(fn, *args, nprocs=N)`: run a function in N ranks on torch.distributed, from a notebook cell.

The ranks are forked (so a function defined in the notebook needs no pickling, as in accelerate's
notebook_launcher) and meet on a store on 127.0.0.1; their output streams into the cell, every line
prefixed with the rank.  A failure raises LaunchError led by the rank that failed first; `timeout_s` stops
ranks that hang and names them.  The ranks' files live in a folder that is removed however the launch ends,
unless keep_logs=True.  The agent (agent.py) runs the ranks, rank.py is what runs inside each, report.py
tells how a failed launch ended.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable

from ..errors import ConfigError
from ..machine import hardware
from ..measure.load import LoadMeter
from . import guards
from .agent import Agent
from .failure_report import LaunchError, report
from .rank import UnreadableReturnValue, rank_main
from .run_files import run_folder
from .script_bootstrap import bootstrap_args
from .signals import Signals


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
    with Signals() as signals, run_folder(keep_logs, signals) as files:
        files.touch_logs(nprocs)
        launcher_pid = os.getpid()

        def rank_fn(*rank_args):
            return rank_main(fn, rank_args, kwargs or {}, files, launcher_pid)

        rank_fn.__name__ = rank_fn.__qualname__ = getattr(fn, "__name__", "fn")
        outcome = Agent(rank_fn, args, nprocs, "fork", files, timeout_s, signals).run()
        if outcome.failed:
            raise report(outcome, files, keep_logs)
        return _readable([outcome.return_values[r] for r in range(nprocs)])


def launch_script(script: str, script_args=(), nprocs: int | None = None, module: bool = False,
                  timeout_s: float | None = None, keep_logs: bool = False) -> int:
    """Run a Python script (or module, with module=True) in `nprocs` fresh interpreters on this machine,
    on the same loopback rendezvous as `launch`, with the same timeout_s and keep_logs.  Returns 0, or
    raises LaunchError."""
    nprocs = _check_nprocs(nprocs)
    timeout_s = _check_timeout(timeout_s)
    with Signals() as signals, run_folder(keep_logs, signals) as files:
        # each rank bound to this process's life before the script runs (script_bootstrap)
        args = bootstrap_args(script, module, script_args, os.getpid())
        outcome = Agent(sys.executable, ("-u", *args), nprocs, "spawn", files, timeout_s, signals).run()
        if outcome.failed:
            raise report(outcome, files, keep_logs)
        return 0


def launch_run(config, nprocs: int | None = None, catch_errors: bool = False, timeout_s: float | None = None,
               keep_logs: bool = False):
    """scalekit.run(config) in `nprocs` ranks; the result aggregated over ranks (rank 0's copy).

    This is how `scalekit bench --nproc-per-node` runs the ddp / fsdp toggles (and how the Lab does).
    With catch_errors, a failed launch (a timeout included) comes back as a result with status "failed" and
    the error in a line.  timeout_s and keep_logs as for `launch`.  The result's `load` is what other processes
    ran during the launch, read from this process where the ranks recorded none (a finding of one run each on a
    busy machine then reads "unreliable (machine busy)", as a single process's does).
    """
    from ..training.results import RunResult

    nprocs = _check_nprocs(nprocs)
    config.check_ranks(nprocs)  # a mesh the ranks cannot form is refused before any of them starts
    try:
        meter = LoadMeter()  # the ranks are this process's children: only other processes count
        result = launch(_run_config, config, nprocs=nprocs, timeout_s=timeout_s, keep_logs=keep_logs)[0]
        if result.load is None:  # aggregated over several ranks, it carries none: the launch's load, seen from here
            result.load = meter.read()
        return result
    except (LaunchError, guards.ForkUnsafeError) as exc:
        if not catch_errors:
            raise
        lines = str(exc).strip().splitlines()
        # a timeout's first line names the ranks still running; the next say where each one was
        error = "; ".join(line.strip() for line in lines) if getattr(exc, "timed_out", False) else lines[0]
        return RunResult(label=config.label or config.describe(), config=config.to_dict(), status="failed",
                         error=error[:600])


def _readable(values: list) -> list:
    unreadable = next((v for v in values if isinstance(v, UnreadableReturnValue)), None)
    if unreadable is not None:
        raise LaunchError(f"rank {unreadable.rank}'s return value could not be read back in this process: "
                          f"{unreadable.error}", rank=unreadable.rank)
    return values


def _run_config(config):
    from ..training.engine import run

    return run(config)


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
