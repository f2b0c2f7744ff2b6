"""SDPA: replace the explicit softmax(QKᵀ)V with F.scaled_dot_product_attention (flash attention on GPU)."""

from __future__ import annotations

from .base import BuildContext, Spelling, Toggle, Tune


class SDPA(Toggle):
    name = "sdpa"
    summary = "fused attention (F.scaled_dot_product_attention; flash attention on GPU)"
    cost = "none in results (same math); backends differ in which shapes and dtypes they accept"
    helps_when = "sequences are long: the T×T attention matrix is never written to memory"
    group = "kernels"
    phase = "model_config"
    loops = ("train", "generate")
    tuning = (Tune(rank=40), Tune(rank=40, loop="generate"))
    gpt_only = True  # the built-in GPT's switch, or a model family's (Hugging Face: attn_implementation)

    def applies_to(self, adapter) -> tuple[bool, str]:
        return adapter.attention_support()

    def apply(self, ctx: BuildContext, value) -> None:
        if ctx.gpt_config is not None:
            ctx.gpt_config.attention = "sdpa"
        else:  # a model family's own switch: Hugging Face builds with attn_implementation="sdpa"
            ctx.model_adapter.set_attention("sdpa")


    def traced(self, value) -> bool:
        return True

    # Framework spellings: Trainer arguments, accelerate, Lightning
    spelled_for_transformers_models = True

    def spelling(self, target, value, cfg) -> Spelling:
        return Spelling(model_kwargs={"attn_implementation": '"sdpa"'})  # the model's own switch, in every framework

    def off_spelling(self, target, cfg) -> Spelling:
        return Spelling(model_kwargs={"attn_implementation": '"eager"'})


TOGGLE = SDPA()
