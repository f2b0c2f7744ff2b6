"""How many operators one training step dispatches: what a CPU (and a small model on any device in eager mode)
pays per operator, whatever the operator's size."""

from __future__ import annotations

import contextlib
import functools


@functools.lru_cache(maxsize=32)
def count_step_ops(preset: str, toggles: tuple[tuple[str, str], ...] = ()) -> int:
    """Operators (aten calls) of one training step of the built-in `preset` with these single-process toggles:
    forward, backward and the optimizer step, counted by running one step at batch 1 on this CPU (the count does
    not depend on the batch)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from ..machine.hardware import detect
    from ..models.presets import PRESETS
    from ..training.build import build, train_step
    from ..training.config import RunConfig
    from .inputs import as_number

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    values = {k: (True if v == "True" else as_number(v)) for k, v in toggles}
    cfg = RunConfig(preset=preset, toggles=values, batch_size=1, seq_len=min(32, PRESETS[preset].block_size),
                    device="cpu", check_memory=False)
    hw = detect("cpu")
    with contextlib.ExitStack() as stack:
        ctx = build(cfg.resolve(hw), hw, stack)
        batch = next(ctx.batches)
        train_step(ctx, batch)  # the first step creates the optimizer's state: count a later one
        with Count():
            train_step(ctx, next(ctx.batches))
        torch._dynamo.reset() if "compile" in values else None
    return Count.n
