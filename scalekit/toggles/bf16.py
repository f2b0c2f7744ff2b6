"""bf16 autocast: run matmuls and most ops in bfloat16, keep weights and reductions in fp32."""

from __future__ import annotations

import torch

from .base import BuildContext, Toggle, Tune


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

TOGGLE = BF16()
