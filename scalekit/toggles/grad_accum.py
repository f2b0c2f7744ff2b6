"""Gradient accumulation: k micro-batches of B/k per optimizer step, the same update as one batch of B."""

from __future__ import annotations

from ..checks import BATCH_SIZE_RANGE, int_in, micro_batch_rows
from .base import BuildContext, Spelling, Tune
from .counted import CountToggle


class GradAccum(CountToggle):
    name = "grad_accum"
    summary = "gradient accumulation: k micro-batches of B/k, losses scaled by 1/k, one optimizer step"
    cost = "k smaller forward/backward passes: slower per step where one big batch kept the device busy"
    helps_when = "the batch you want does not fit: activation memory scales with B/k, not B"
    group = "memory"
    kind = "memory"
    phase = "step"
    default = 4
    # a memory lever that leaves the update as it was (only the kernels get smaller), so it comes before the
    # levers that recompute or approximate; tried only while the best is over the memory budget, the planner
    # pruning a count that cannot fit, and the fastest configuration that fits is crowned at the end
    tuning = (Tune(2, rank=120, label="grad_accum=2 (to fit)", memory_only=True),
              Tune(4, rank=121, label="grad_accum=4 (to fit)", memory_only=True))
    choices = (2, 4, 8, 16)  # offered in the Lab and `scalekit toggles`; any count that divides the batch works
    unit = "micro-batches per optimizer step"

    def apply(self, ctx: BuildContext, value: int) -> None:
        micro_batch_rows(ctx.config.batch_size, 1, value)
        # training.train_step splits the batch, scales each loss by 1/k and clears grads (set_to_none)
        ctx.grad_accum_steps = value

    def micro_batches(self, value: int) -> int:
        return value

    def plan(self, facts, value: int) -> None:
        facts.micro_batches = self.micro_batches(value)

    def traced(self, value) -> bool:
        return True

    # Framework spellings: Trainer arguments, accelerate, Lightning
    training_fields = {"gradient_accumulation_steps": 1}

    def from_training_arguments(self, fields, notes) -> int | None:
        k = int_in("TrainingArguments", "gradient_accumulation_steps", fields["gradient_accumulation_steps"],
                   1, BATCH_SIZE_RANGE[1])
        return k if k > 1 else None

    def spelling(self, target, k: int, cfg) -> Spelling:
        return {"hf": Spelling(kwargs={"gradient_accumulation_steps": k}),
                "accelerate": Spelling(kwargs={"gradient_accumulation_steps": str(k)}),
                "lightning": Spelling(kwargs={"accumulate_grad_batches": str(k)})}[target]

    def off_spelling(self, target, cfg) -> Spelling:
        return self.spelling(target, 1, cfg)  # said even at 1: the per-device batch is read with it


TOGGLE = GradAccum()
