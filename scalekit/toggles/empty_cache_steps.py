"""empty_cache every N steps: hand the CUDA caching allocator's unused blocks back to the driver."""

from __future__ import annotations

import torch

from ..checks import int_in
from .base import BuildContext, Spelling
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

    # Framework spellings: Trainer arguments, accelerate, Lightning
    training_fields = {"torch_empty_cache_steps": None}

    def from_training_arguments(self, fields, notes) -> int | None:
        if fields["torch_empty_cache_steps"] is None:
            return None
        notes.append("torch_empty_cache_steps: the Trainer empties the cache in every micro-batch of each N-th step; "
                     "scalekit's empty_cache_steps after each N-th step")
        return int_in("TrainingArguments", "torch_empty_cache_steps", fields["torch_empty_cache_steps"], 1, 10**8)

    def spelling(self, target, n: int, cfg) -> Spelling:
        if target == "hf":
            return Spelling(kwargs={"torch_empty_cache_steps": n})
        if target == "accelerate":  # `step` counts micro-batches there
            return Spelling(after_step=(f"if accelerator.sync_gradients and (step + 1) % ({n} * accelerator."
                                        f"gradient_accumulation_steps) == 0:",
                                        f"    torch.cuda.empty_cache()  # empty_cache_steps={n}"))
        return Spelling(after_step=(f"if (self.trainer.global_step + 1) % {n} == 0:", "    torch.cuda.empty_cache()"))


TOGGLE = EmptyCacheSteps()
