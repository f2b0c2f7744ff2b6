"""Fused AdamW: one kernel updates every parameter, instead of a loop of small kernels."""

from __future__ import annotations

from .base import BuildContext, Spelling, Toggle


class FusedAdamW(Toggle):
    name = "fused_adamw"
    summary = "AdamW(fused=True): the whole optimizer step in one fused kernel"
    cost = "none in results; needs floating-point parameters on a supported device"
    helps_when = "many parameter tensors make the optimizer step launch-bound (GPU) or loop-bound (CPU)"
    group = "optimizer"
    phase = "optimizer"
    excludes = {"optim": "both choose the optimizer: use optim='adamw_torch_fused' for fused AdamW"}

    def apply(self, ctx: BuildContext, value) -> None:
        ctx.optimizer_kwargs["fused"] = True


    def plan(self, facts, value) -> None:
        facts.optimizer = "adamw_torch_fused"

    def traced(self, value) -> bool:
        return True

    # Framework spellings: Trainer arguments, accelerate, Lightning
    def spelling(self, target, value, cfg) -> Spelling:
        if target == "hf":  # TrainingArguments' name for it, read back as optim='adamw_torch_fused'; torch's decay
            return Spelling(kwargs={"optim": "adamw_torch_fused", "weight_decay": 0.01})
        params = "self.parameters()" if target == "lightning" else "model.parameters()"
        return Spelling(optimizer=f"torch.optim.AdamW({params}, lr={cfg.lr!r}, fused=True)")


TOGGLE = FusedAdamW()
