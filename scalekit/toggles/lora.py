"""LoRA: freeze the model and train a low-rank update beside each targeted linear layer (peft)."""

from __future__ import annotations

from ..models.lora import add_adapters, peft_available, peft_code
from .base import BuildContext, Spelling
from .counted import CountToggle


class LoRA(CountToggle):
    name = "lora"
    summary = "LoRA (peft): the model frozen, a rank-r update B·A trained beside each linear layer of the blocks"
    cost = "an extra pair of thin matmuls per adapted layer; a low-rank update fits less than full fine-tuning"
    helps_when = "fine-tuning: gradients and optimizer state only for r·(in+out) values per layer"
    group = "finetune"
    trains_few_weights = True  # the base stays frozen
    kind = "memory"
    phase = "wrap"
    default = 8
    choices = (8, 4, 16, 64)  # offered in the Lab and `scalekit toggles`; any rank works
    unit = "rank r of the update"
    excludes = {"head_only": "both choose what trains: the new head alone, or adapters"}

    def available(self, hw) -> tuple[bool, str]:
        return peft_available()

    def apply(self, ctx: BuildContext, rank: int) -> None:
        ctx.model, note = add_adapters(ctx.base_model, rank, use_dora=False, names=ctx.config.adapter_targets)
        ctx.notes.append(note)

    def plan(self, facts, value) -> None:
        facts.analytic = False  # the built-in GPT's analytic plan has no frozen base or adapters: traced

    def traced(self, value) -> bool:
        return True

    # Framework spellings: Trainer arguments, accelerate, Lightning
    def spelling(self, target, rank: int, cfg) -> Spelling:
        imports, lines, notes = peft_code(rank, use_dora=False, cfg=cfg)
        return Spelling(imports=imports, model=lines, notes=notes)


TOGGLE = LoRA()
