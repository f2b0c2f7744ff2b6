"""Freeing what a run made, without paying for what was there before it.

A run ends with `gc.collect()` so that a model caught in a reference cycle (hooks, wrappers, a failing run's
frames) is freed at once, before the next run is measured or CUDA's cache is emptied.  But a full collection
visits every object in the process: with torch and transformers imported that is 300,000 objects and 0.25–0.5 s
on a laptop CPU, paid again by every row of a ladder, every autotune candidate and every Lab run.  Objects that
existed before the run cannot be garbage the run made, so they are frozen (`gc.freeze()`, CPython's permanent
generation) while the run lasts; the collection at its end visits only what the run created, then they are
handed back to the collector as they were.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def only_new_objects_collected() -> Iterator[None]:
    """Freeze the objects alive now for the block, so collections inside it (and `collect_new_garbage`) scan
    only what the block created.  Where someone else froze objects already (a nested run, a forked server that
    froze its heap), theirs stay frozen and the block changes nothing."""
    mine = gc.get_freeze_count() == 0
    if mine:
        gc.freeze()
    try:
        yield
    finally:
        if mine:
            gc.unfreeze()


def collect_new_garbage() -> int:
    """`gc.collect()`: inside `only_new_objects_collected`, the run's own objects only (fast); outside, all.
    Returns what it found unreachable."""
    return gc.collect()
