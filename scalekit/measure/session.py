"""The shell every measured run shares (scalekit.run, scalekit.generate): torch's threads pinned for the run
and restored after it, the machine's load recorded, what the build changes undone when the run ends, a failure
kept as a "failed" result in plain words (with catch_errors), memory handed back to the allocator afterwards
(collecting only the run's own garbage: measure/garbage.py)."""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable, Iterator

import torch

from ..errors import plain_error
from .garbage import collect_new_garbage, only_new_objects_collected
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
    with only_new_objects_collected():
        try:
            with contextlib.ExitStack() as stack:
                pin_threads(stack, threads)
                result.threads = torch.get_num_threads()
                yield stack
        except Exception as exc:
            if not catch_errors or must_raise():
                raise
            result.status, result.error = "failed", plain_error(exc)
            forget_frames(exc)  # kept as words: the frames' locals (the model among them) can go with the run
        finally:
            result.load = meter.read()
            collect_new_garbage()  # the run's own objects (a model in a cycle), not the whole process's
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


def forget_frames(exc: BaseException | None) -> None:
    """Clear the locals of the finished frames in `exc`'s traceback and in the exceptions it was raised from or
    while handling, so a failure kept as words does not keep the failed run's model alive."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        exc = exc.__cause__ or exc.__context__
