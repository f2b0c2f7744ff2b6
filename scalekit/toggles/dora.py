"""DoRA: LoRA on the direction of each weight, with its magnitude trained apart (peft's use_dora)."""

from __future__ import annotations

from ..models.lora import add_adapters, peft_available, peft_code
from .base import BuildContext, Spelling
from .counted import CountToggle


class DoRA(CountToggle):
    name = "dora"
    summary = "DoRA (peft): each weight split into magnitude and direction; LoRA on the direction, magnitude trained"
    cost = "LoRA's matmuls plus a weight norm per layer and step: slower than LoRA (≈1.2-1.4× on CPU here)"
    helps_when = "LoRA's quality at a low rank is not enough: DoRA gets closer to full fine-tuning"
    group = "finetune"
    trains_few_weights = True  # the base stays frozen
    kind = "memory"
    phase = "wrap"
    default = 8
    choices = (8, 4, 16, 64)
    unit = "rank r of the update"
    excludes = {"head_only": "both choose what trains: the new head alone, or adapters",
                "lora": "DoRA is LoRA with a magnitude split off: pick one"}

    def available(self, hw) -> tuple[bool, str]:
        return peft_available()

    def apply(self, ctx: BuildContext, rank: int) -> None:
        ctx.model, note = add_adapters(ctx.base_model, rank, use_dora=True, names=ctx.config.adapter_targets)
        ctx.notes.append(note)

    def plan(self, facts, value) -> None:
        facts.analytic = False  # the built-in GPT's analytic plan has no frozen base or adapters: traced

    def traced(self, value) -> bool:
        return True

    # Framework spellings: Trainer arguments, accelerate, Lightning
    def spelling(self, target, rank: int, cfg) -> Spelling:
        imports, lines, notes = peft_code(rank, use_dora=True, cfg=cfg)
        return Spelling(imports=imports, model=lines, notes=notes)


TOGGLE = DoRA()
