"""fp16 autocast with a GradScaler: the mixed-precision recipe for GPUs without bf16."""

from __future__ import annotations

import torch

from ..checks import check_bool
from .base import BuildContext, Spelling, Toggle, Tune


class FP16(Toggle):
    name = "fp16"
    summary = "autocast to float16 with dynamic loss scaling (GradScaler)"
    cost = "narrow range: gradients need scaling, and a skipped step when they overflow"
    helps_when = "the GPU has fp16 but no bf16 tensor cores (V100, T4)"
    group = "precision"
    phase = "precision"
    tuning = (Tune(rank=30, label="fp16 (no bf16 here)", instead_of="bf16"),)  # what to try where bf16 is not
    excludes = {"bf16": "both set the autocast dtype: pick one"}

    def apply(self, ctx: BuildContext, value) -> None:
        ctx.compute_dtype = torch.float16
        # the engine's stepper scales each loss before backward and unscales the gradients before the step
        ctx.grad_scaler = torch.amp.GradScaler(ctx.device.type)


    def plan(self, facts, value) -> None:
        facts.activation_bytes = 2

    def traced(self, value) -> bool:
        return True

    # Framework spellings: Trainer arguments, accelerate, Lightning
    training_fields = {"fp16": False}

    def from_training_arguments(self, fields, notes) -> bool | None:
        check_bool("TrainingArguments", "fp16", fields["fp16"])
        return fields["fp16"] or None

    def spelling(self, target, value, cfg) -> Spelling:
        return {"hf": Spelling(kwargs={"fp16": True}), "accelerate": Spelling(kwargs={"mixed_precision": "'fp16'"}),
                "lightning": Spelling(kwargs={"precision": "'16-mixed'"})}[target]

    def off_spelling(self, target, cfg) -> Spelling:
        return Spelling(kwargs={"precision": "'32-true'"}) if target == "lightning" else Spelling()


TOGGLE = FP16()
