"""LoRA: freeze the model and train a low-rank update beside each targeted linear layer (peft)."""

from __future__ import annotations

import importlib.util

from ..errors import ToggleUnavailable
from ..models.blocks import block_linears, is_conv1d
from ..optional import quiet_import
from .base import BuildContext, Spelling
from .counted import CountToggle


def import_peft():
    return quiet_import("peft")

def peft_available() -> tuple[bool, str]:
    if importlib.util.find_spec("peft") is None:
        return False, "LoRA and DoRA need peft, which is not installed (pip install peft)"
    return True, ""


def adapter_targets(ctx: BuildContext) -> list[str]:
    """The linear layers the adapters go on: every nn.Linear (or transformers' Conv1D, as in GPT-2) inside the
    model's repeated blocks (one rule, scalekit.models.blocks), or those named by RunConfig.adapter_targets."""
    targets = block_linears(ctx.base_model, ctx.config.adapter_targets, conv1d=True)
    if not targets:
        what = f"named {list(ctx.config.adapter_targets)}" if ctx.config.adapter_targets else "at all"
        raise ToggleUnavailable(f"adapters need linear layers inside the model's repeated blocks, and there are "
                                f"none {what}; RunConfig.adapter_targets names the layers to use")
    return targets


def add_adapters(ctx: BuildContext, rank: int, use_dora: bool) -> None:
    """peft's LoRA (or DoRA) layers on the targets; everything else frozen."""
    peft = import_peft()
    targets = adapter_targets(ctx)
    modules = dict(ctx.base_model.named_modules())
    # Conv1D stores its weight (in, out): peft must know, or its update would be transposed
    fan_in_fan_out = all(is_conv1d(modules[t]) for t in targets)
    config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=targets,
                             use_dora=use_dora, init_lora_weights=True, fan_in_fan_out=fan_in_fan_out)
    # peft puts its layers into the model in place (ctx.base_model keeps them) and wraps it in a PeftModel
    ctx.model = peft.get_peft_model(ctx.base_model, config)
    kind = "DoRA" if use_dora else "LoRA"
    ctx.notes.append(f"{kind} rank {rank} on {len(targets)} linear layers; "
                     f"{sum(p.numel() for p in ctx.model.parameters() if p.requires_grad):,} trainable parameters")


def peft_spelling(rank: int, use_dora: bool, cfg) -> Spelling:
    """peft's LoraConfig and get_peft_model in exported code (the same config add_adapters builds)."""
    targets = repr(list(cfg.adapter_targets)) if cfg.adapter_targets else '"all-linear"'  # the blocks' linear layers
    return Spelling(imports=("from peft import LoraConfig, get_peft_model", "from transformers.pytorch_utils import Conv1D"),
                    model=(f"adapters = LoraConfig(r={rank}, lora_alpha={2 * rank}, lora_dropout=0.0, target_modules={targets}, "
                           f"use_dora={use_dora},",
                           "                      fan_in_fan_out=any(isinstance(m, Conv1D) for m in model.modules()))  "
                           "# Conv1D stores (in, out)",
                           f"model = get_peft_model(model, adapters)  # {'dora' if use_dora else 'lora'}={rank}"))


class LoRA(CountToggle):
    name = "lora"
    summary = "LoRA (peft): the model frozen, a rank-r update B·A trained beside each linear layer of the blocks"
    cost = "an extra pair of thin matmuls per adapted layer; a low-rank update fits less than full fine-tuning"
    helps_when = "fine-tuning: gradients and optimizer state only for r·(in+out) values per layer"
    group = "finetune"
    kind = "memory"
    phase = "wrap"
    default = 8
    choices = (8, 4, 16, 64)  # offered in the Lab and `scalekit toggles`; any rank works
    unit = "rank r of the update"
    excludes = {"head_only": "both choose what trains: the new head alone, or adapters"}

    def available(self, hw) -> tuple[bool, str]:
        return peft_available()

    def apply(self, ctx: BuildContext, rank: int) -> None:
        add_adapters(ctx, rank, use_dora=False)


    def plan(self, facts, value) -> None:
        facts.analytic = False  # the built-in GPT's analytic plan has no frozen base or adapters: traced

    def traced(self, value) -> bool:
        return True

    def spelling(self, target, rank: int, cfg) -> Spelling:
        return peft_spelling(rank, False, cfg)

TOGGLE = LoRA()
