"""Errors a user can act on: each names the field and the values it allows; and failures said in plain words."""

from __future__ import annotations

import torch


class ConfigError(ValueError):
    """A RunConfig field holds a value scalekit cannot run."""


class ToggleUnavailable(ConfigError):
    """A toggle was asked for that this machine or this model cannot provide; the message says why."""


def toggle_why(name: str, why: str) -> str:
    """A toggle's reason in words: "toggle 'sdpa' needs ...", or "toggle 'kv_cache'='static': ..." where the reason
    is about one of its values (it then starts with "=")."""
    return f"toggle {name!r}{'' if why.startswith('=') else ' '}{why}"


class PlanUnavailable(ConfigError):
    """The planner could not trace the step on fake tensors (the message says why); measure the run instead."""


class NothingFits(RuntimeError):
    """No configuration autotune tried fits the memory budget; `search` holds what was tried."""

    def __init__(self, message: str, search):
        super().__init__(message)
        self.search = search


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


class DataWorkerDied(RuntimeError):
    """A DataLoader worker process ended while the run waited for its batch (killed, or crashed outside Python);
    torch says so in one of several ways (its own RuntimeError, or a reset connection, an EOF, a broken pipe
    from the queue the worker fed), this says which worker and how."""


class ForkUnsafeError(RuntimeError):
    """This process is in a state that forked ranks cannot inherit; the message says what to do."""


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or the CPU allocator's "DefaultCPUAllocator: can't allocate memory"."""
    text = str(exc).lower()
    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in text \
        or "can't allocate memory" in text


def plain_error(exc: BaseException) -> str:
    """A failure in words a user can act on, without the traceback."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    if "Original Traceback" in str(exc):  # raised again from a DataLoader worker: say what the worker raised
        text = f"{text.rstrip('.')}: {lines[-1].strip()}"
    if is_out_of_memory(exc):
        return f"out of memory: {text[:300]} — try a smaller batch_size, bf16, or activation checkpointing"
    if isinstance(exc, DataWorkerDied):
        return text
    if "DataLoader worker" in text and ("killed by signal" in text or "exited unexpectedly" in text):
        # torch says one or the other, depending on which of its checks sees the dead worker first
        return f"a data-loader worker process died (killed, or it crashed outside Python): {text[:300]}"
    if type(exc).__module__.startswith("torch._dynamo") or "inductor" in type(exc).__module__:
        return f"torch.compile failed: {type(exc).__name__}: {text[:300]}"
    return f"{type(exc).__name__}: {text[:300]}"
