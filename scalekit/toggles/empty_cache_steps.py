"""empty_cache every N steps: hand the CUDA caching allocator's unused blocks back to the driver."""

from __future__ import annotations

import torch

from .base import BuildContext
from .counted import CountToggle


class EmptyCacheSteps(CountToggle):
    name = "empty_cache_steps"
    summary = "torch.cuda.empty_cache() every N optimizer steps (HF torch_empty_cache_steps)"
    cost = "the allocator must ask the driver again for memory it gave back: ≈10% slower every N steps, " \
           "up to ≈40% every step"
    helps_when = "fragmentation, or other processes on the same GPU, make a run fail with memory to spare"
    group = "memory"
    kind = "memory"
    phase = "step"
    default = 1
    choices = (1, 10, 100)  # offered in the Lab and `scalekit toggles`; any count works
    unit = "optimizer steps between calls"
    plan_note = 'empty_cache_steps changes what the CUDA allocator keeps reserved, not the peak allocated'

    def available(self, hw) -> tuple[bool, str]:
        if hw.device_type == "cuda":
            return True, ""
        return False, ("torch.cuda.empty_cache() releases blocks cached by the CUDA allocator; on the CPU "
                       "tensors are freed straight away and there is no cache to empty")

    def apply(self, ctx: BuildContext, every: int) -> None:
        def empty_cache(step: int) -> None:
            if (step + 1) % every == 0:
                torch.cuda.empty_cache()

        ctx.after_step.append(empty_cache)


TOGGLE = EmptyCacheSteps()
