"""The shell every measured run shares (scalekit.run, scalekit.generate): torch's threads pinned for the run
and restored after it, the machine's load recorded, what the build changes undone when the run ends, a failure
kept as a "failed" result in plain words (with catch_errors), memory handed back to the allocator afterwards."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator

import torch

from ..errors import plain_error
from .load import LoadMeter, auto_threads, in_launched_rank


@contextlib.contextmanager
def measured_run(result, device_type: str, catch_errors: bool, must_raise: Callable[[], bool] = lambda: False,
                 threads: int | None = None) -> Iterator[contextlib.ExitStack]:
    """The run's exit stack (process-wide changes and wrappers register their undo on it).  An exception ends
    the run; with `catch_errors` it is kept in `result` (status "failed", the error in plain words) unless
    `must_raise()` says the failure has to travel on (a rank of a launch: the others would wait for it).
    `threads`: torch's intra-op threads for the run (None: measure.load.auto_threads(), at most torch's own
    setting; a launched rank keeps what its launcher set); `result.threads` and `result.load` record what the run had."""
    meter = LoadMeter(device_type)
    try:
        with contextlib.ExitStack() as stack:
            pin_threads(stack, threads)
            result.threads = torch.get_num_threads()
            yield stack
    except Exception as exc:
        if not catch_errors or must_raise():
            raise
        result.status, result.error = "failed", plain_error(exc)
    finally:
        result.load = meter.read()
        gc.collect()
        if device_type == "cuda":
            torch.cuda.empty_cache()


def pin_threads(stack: contextlib.ExitStack, threads: int | None) -> None:
    """Set torch's threads for the run; the first callback on the stack, so restored after everything else."""
    if threads is None and in_launched_rank():
        return
    before = torch.get_num_threads()
    # None: the free cores, never more than torch was set to (a caller's or OMP_NUM_THREADS's choice stands)
    wanted = threads if threads is not None else min(auto_threads(), before)
    if wanted != before:
        torch.set_num_threads(wanted)
        stack.callback(torch.set_num_threads, before)
