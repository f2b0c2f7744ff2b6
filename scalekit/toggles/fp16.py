"""fp16 autocast with a GradScaler: the mixed-precision recipe for GPUs without bf16."""

from __future__ import annotations

import torch

from .base import BuildContext, Toggle, Tune


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

TOGGLE = FP16()
