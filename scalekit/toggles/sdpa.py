"""SDPA: replace the explicit softmax(QKᵀ)V with F.scaled_dot_product_attention (flash attention on GPU)."""

from __future__ import annotations

from .base import BuildContext, Toggle


class SDPA(Toggle):
    name = "sdpa"
    summary = "fused attention (F.scaled_dot_product_attention; flash attention on GPU)"
    cost = "none in results (same math); backends differ in which shapes and dtypes they accept"
    helps_when = "sequences are long: the T×T attention matrix is never written to memory"
    group = "kernels"
    phase = "model_config"
    loops = ("train", "generate")
    gpt_only = True

    def apply(self, ctx: BuildContext, value) -> None:
        ctx.gpt_config.attention = "sdpa"


TOGGLE = SDPA()
