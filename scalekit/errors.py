"""Errors a user can act on: each names the field and the values it allows; and failures said in plain words."""

from __future__ import annotations

import errno

import torch


class ConfigError(ValueError):
    """A RunConfig field holds a value scalekit cannot run."""


class ToggleUnavailable(ConfigError):
    """A toggle was asked for that this machine or this model cannot provide; the message says why."""


def toggle_why(name: str, why: str) -> str:
    """A toggle's reason in words: "toggle 'sdpa' needs ...", or "toggle 'kv_cache'='static': ..." where the reason
    is about one of its values (it then starts with "=")."""
    return f"toggle {name!r}{'' if why.startswith('=') else ' '}{why}"


class TokenCacheUnavailable(ConfigError):
    """The shipped corpus' token cache could not be built (a full disk, a read-only folder): the message names the
    folder, says why, and says how to put it elsewhere (SCALEKIT_CACHE)."""


class NotWritten(OSError):
    """A file scalekit writes could not be written: the message names the file and says why (`errno` is the system's
    reason).  An OSError, so whatever handles a failed write still handles it."""


EDQUOT = getattr(errno, "EDQUOT", errno.ENOSPC)  # a quota exceeded (POSIX; not every platform names it)


def os_error_in(exc: BaseException) -> OSError | None:
    """The OSError with a system reason behind `exc`: itself, or one it was raised from or while handling (torch.save
    reports a full disk as its own RuntimeError, raised while handling the OSError)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError) and exc.errno is not None:
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def why_not_written(exc: BaseException) -> str:
    """Why a write failed, in words: "no space left on the disk", "the file system is read-only", ..."""
    err = os_error_in(exc)
    if err is None:
        lines = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"
    return {errno.ENOSPC: "no space left on the disk", EDQUOT: "no space left: the disk quota is exceeded",
            errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied",
            errno.EPERM: "permission denied"}.get(err.errno, (err.strerror or str(err)).lower())


def is_no_space(exc: BaseException) -> bool:
    err = os_error_in(exc)
    return err is not None and err.errno in (errno.ENOSPC, EDQUOT)


class CompileFailed(ToggleUnavailable):
    """torch.compile failed on this model (dynamo or inductor raised, compiling or at a compiled call): the message
    names compile's mode, the model's class and the way out in one line; torch's own exception is its __cause__."""


TORCH_COMPILE_MODULES = ("torch._dynamo", "torch._inductor")  # where torch.compile's own exceptions are defined


def compile_failure_in(exc: BaseException | None) -> BaseException | None:
    """The exception torch.compile raised behind `exc` (BackendCompilerFailed, InductorError, dynamo's Unsupported,
    ...: its own classes): `exc` itself, or one it was raised from or while handling; None when there is none."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if type(exc).__module__.startswith(TORCH_COMPILE_MODULES):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def torch_compile_says(exc: BaseException) -> str:
    """torch.compile's reason in one line: what a failed backend raised ("AssertionError: ..."), else torch's
    exception; its message's first line, and its last where there are more; cut to 200 characters."""
    inner = getattr(exc, "inner_exception", None)  # BackendCompilerFailed and InductorError keep the backend's error
    said = inner if isinstance(inner, BaseException) else exc
    lines = [line.strip() for line in str(said).strip().splitlines() if line.strip()]
    text = type(said).__name__ + (f": {lines[0]}" if lines else "") + (f" … {lines[-1]}" if len(lines) > 1 else "")
    return text if len(text) <= 200 else text[:199] + "…"


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
    if isinstance(exc, CompileFailed):  # already one line naming the mode, the model and the way out
        return text
    if "DataLoader worker" in text and ("killed by signal" in text or "exited unexpectedly" in text):
        # torch says one or the other, depending on which of its checks sees the dead worker first
        return f"a data-loader worker process died (killed, or it crashed outside Python): {text[:300]}"
    if type(exc).__module__.startswith("torch._dynamo") or "inductor" in type(exc).__module__:
        return f"torch.compile failed: {type(exc).__name__}: {text[:300]}"
    return f"{type(exc).__name__}: {text[:300]}"
