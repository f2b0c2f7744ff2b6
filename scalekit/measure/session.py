"""The shell every measured run shares (scalekit.run, scalekit.generate): what the build changes is undone when
the run ends, a failure comes back as a "failed" result in plain words (with catch_errors), memory is handed
back to the allocator afterwards."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator

import torch

from ..errors import plain_error


@contextlib.contextmanager
def measured_run(result, device_type: str, catch_errors: bool,
                 must_raise: Callable[[], bool] = lambda: False) -> Iterator[contextlib.ExitStack]:
    """The run's exit stack (process-wide changes and wrappers register their undo on it).  An exception ends
    the run; with `catch_errors` it is kept in `result` (status "failed", the error in plain words) unless
    `must_raise()` says the failure has to travel on (a rank of a launch: the others would wait for it)."""
    try:
        with contextlib.ExitStack() as stack:
            yield stack
    except Exception as exc:
        if not catch_errors or must_raise():
            raise
        result.status, result.error = "failed", plain_error(exc)
    finally:
        gc.collect()
        if device_type == "cuda":
            torch.cuda.empty_cache()
