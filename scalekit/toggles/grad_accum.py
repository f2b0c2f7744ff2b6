"""Gradient accumulation: k micro-batches of B/k per optimizer step, the same update as one batch of B."""

from __future__ import annotations

from ..errors import ConfigError
from .base import BuildContext
from .counted import CountToggle


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


class GradAccum(CountToggle):
    name = "grad_accum"
    summary = "gradient accumulation: k micro-batches of B/k, losses scaled by 1/k, one optimizer step"
    cost = "k smaller forward/backward passes: slower per step where one big batch kept the device busy"
    helps_when = "the batch you want does not fit: activation memory scales with B/k, not B"
    group = "memory"
    kind = "memory"
    phase = "step"
    default = 4
    choices = (2, 4, 8, 16)  # offered in the Lab and `scalekit toggles`; any count that divides the batch works
    unit = "micro-batches per optimizer step"

    def apply(self, ctx: BuildContext, value: int) -> None:
        batch = ctx.config.batch_size
        if batch % value:
            raise ConfigError(f"RunConfig.toggles['grad_accum']={value} must divide batch_size={batch} "
                              f"(each micro-batch is batch_size/k sequences); allowed here: "
                              f"{', '.join(map(str, divisors(batch)))}")
        # the engine's train_step splits the batch, scales each loss by 1/k and clears grads (set_to_none)
        ctx.grad_accum_steps = value


TOGGLE = GradAccum()
