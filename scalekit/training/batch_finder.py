"""Find the largest batch that fits a memory budget, by trying it (as Lightning's BatchSizeFinder does).

Powers of two first: double the batch until a step runs out of memory or goes over the budget; then look
between the last batch that fit and the first that did not, in steps of 8 (tensor-core-friendly multiples),
by bisection.  An out-of-memory error is caught, and the memory it held is released before the next try.
Every try is a fresh build (`scalekit.run`) with one measured step, so what it returns has actually run.
"""

from __future__ import annotations

import dataclasses
import gc
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..errors import ConfigError, is_out_of_memory
from ..machine.hardware import detect
from ..toggles import TOGGLES
from .config import RunConfig
from .engine import run

MULTIPLE = 8  # look between powers of two in steps of this


@dataclass
class Trial:
    batch_size: int
    fits: bool
    peak_mem_bytes: int | None
    why: str  # "fits", "over budget", "out of memory: …"


@dataclass
class BatchSizeSearch:
    batch_size: int  # the largest batch that fit
    budget_bytes: int | None  # None: up to what the device holds
    trials: list[Trial] = field(default_factory=list)

    def table(self):
        import pandas as pd

        df = pd.DataFrame([dataclasses.asdict(t) for t in self.trials])
        df["peak_mem_mb"] = df.pop("peak_mem_bytes") / 2**20
        return df


def release_memory() -> None:
    """Free what a failed try left: Python garbage first (tensors held by the dead frames), then the CUDA cache."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def try_batch(config: RunConfig, batch_size: int, budget_bytes: int | None, hw) -> Trial:
    cfg = dataclasses.replace(config, batch_size=batch_size, steps=1, warmup_steps=0, measure_memory=True,
                              label=f"batch {batch_size}")
    try:
        result = run(cfg, hw=hw)
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        why = f"out of memory: {str(exc).splitlines()[0][:120]}"
        del exc  # its traceback holds the failed step's tensors
        release_memory()
        return Trial(batch_size, False, None, why)
    peak = result.peak_mem_bytes
    if budget_bytes is not None and (peak is None or peak > budget_bytes):
        return Trial(batch_size, False, peak, "over budget")
    return Trial(batch_size, True, peak, "fits")


def find_batch_size(config: RunConfig, budget_bytes: int | None = None, start: int | None = None,
                    max_batch_size: int = 2**16, on_trial: Callable[[Trial], None] | None = None) -> BatchSizeSearch:
    """The largest batch_size for `config` whose training step fits `budget_bytes` (peak memory).

    On a GPU without a budget, a batch fits if its step does not run out of memory.  On a CPU a budget is
    required (trying until the machine runs out of RAM would take the machine down with it).  Every batch
    tried is a multiple of the micro-batches per optimizer step the toggles declare (Toggle.micro_batches:
    grad_accum=k splits each batch into k).
    """
    hw = detect(config.device)
    splits = {name: TOGGLES[name].micro_batches(value) for name, value in config.toggles.items()}
    splits = {name: k for name, k in splits.items() if k > 1}  # the toggles that split each batch, and into how many
    unit = math.prod(splits.values())
    unit_said = " × ".join(f"{name}={k}" for name, k in splits.items())
    start = _check_search(hw, budget_bytes, start or unit, unit, unit_said, max_batch_size)
    search = BatchSizeSearch(batch_size=0, budget_bytes=budget_bytes)
    tried: dict[int, Trial] = {}

    def fits(b: int) -> bool:
        if b not in tried:
            tried[b] = try_batch(config, b, budget_bytes, hw)
            search.trials.append(tried[b])
            if on_trial is not None:
                on_trial(tried[b])
        return tried[b].fits

    lo, hi = _powers_of_two(fits, start, unit, max_batch_size, tried)
    if hi is not None:
        lo = _bisect(fits, lo, hi, unit)
    search.batch_size = lo
    return search


def _check_search(hw, budget_bytes, start: int, unit: int, unit_said: str, max_batch_size: int) -> int:
    if budget_bytes is None and hw.device_type != "cuda":
        raise ConfigError("find_batch_size: budget_bytes is required on a CPU (a peak-memory budget in bytes, "
                          "e.g. 2 * 2**30)")
    if budget_bytes is not None and (isinstance(budget_bytes, bool) or not budget_bytes > 0):
        raise ConfigError(f"find_batch_size: budget_bytes must be a positive number of bytes, got {budget_bytes!r}")
    if start % unit or start > max_batch_size:
        multiple = f"a multiple of {unit_said} and " if unit > 1 else ""
        raise ConfigError(f"find_batch_size: start={start} must be {multiple}at most max_batch_size={max_batch_size}")
    return start


def _powers_of_two(fits, start: int, unit: int, max_batch_size: int, tried: dict) -> tuple[int, int | None]:
    """Powers of two (times the accumulation unit): up while it fits, down if even the start does not.
    Returns (the largest batch that fit, the first that did not, or None if every one up to the cap fit)."""
    lo, hi = None, None
    b = start
    while b <= max_batch_size:
        if fits(b):
            lo, b = b, b * 2
        else:
            hi = b
            break
    while lo is None:
        b = hi // 2 // unit * unit
        if b < unit:
            raise ConfigError(f"find_batch_size: even batch_size={unit} does not fit the budget "
                              f"({tried[hi].why}); lower seq_len, use checkpointing or a leaner optimizer")
        if fits(b):
            lo = b
        else:
            hi = b
    return lo, hi


def _bisect(fits, lo: int, hi: int, unit: int) -> int:
    """Between the last fit and the first miss, in steps of 8 (of the unit for small batches)."""
    step = math.lcm(MULTIPLE, unit) if lo >= math.lcm(MULTIPLE, unit) else unit
    while hi - lo > step:
        mid = (lo + hi) // 2 // step * step
        if mid <= lo:
            break
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo
