"""bf16 autocast: run matmuls and most ops in bfloat16, keep weights and reductions in fp32."""

from __future__ import annotations

import torch

from ..checks import check_bool
from .base import BuildContext, Spelling, Toggle, Tune


class BF16(Toggle):
    name = "bf16"
    summary = "autocast to bfloat16: half the bytes per activation, fast tensor-core matmuls"
    cost = "8-bit mantissa in autocast regions; losses drift slightly from fp32"
    helps_when = "the GPU has bf16 tensor cores (Ampere+); on CPUs with AVX512-BF16/AMX and larger models"
    group = "precision"
    phase = "precision"
    loops = ("train", "generate")
    tuning = (Tune(rank=20), Tune(rank=50, loop="generate"))

    def available(self, hw) -> tuple[bool, str]:
        if hw.bf16_supported:
            return True, ""
        return False, f"{hw.device_name} (compute capability {hw.capability}) has no bf16 support; use fp16"

    def apply(self, ctx: BuildContext, value) -> None:
        ctx.compute_dtype = torch.bfloat16
        # sharding wrappers (FSDP2, DeepSpeed) gather and compute with bf16 copies of the fp32 weights
        ctx.wrapper_param_dtype = torch.bfloat16

    def plan(self, facts, value) -> None:
        facts.activation_bytes = facts.wrapper_param_bytes = 2

    def traced(self, value) -> bool:
        return True

    # Framework spellings: Trainer arguments, accelerate, Lightning
    training_fields = {"bf16": False}

    def from_training_arguments(self, fields, notes) -> bool | None:
        check_bool("TrainingArguments", "bf16", fields["bf16"])
        return fields["bf16"] or None

    def spelling(self, target, value, cfg) -> Spelling:
        return {"hf": Spelling(kwargs={"bf16": True}), "accelerate": Spelling(kwargs={"mixed_precision": "'bf16'"}),
                "lightning": Spelling(kwargs={"precision": "'bf16-mixed'"})}[target]

    def off_spelling(self, target, cfg) -> Spelling:
        return Spelling(kwargs={"precision": "'32-true'"}) if target == "lightning" else Spelling()


TOGGLE = BF16()
