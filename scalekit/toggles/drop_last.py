"""drop_last: skip the remainder of each epoch, so every epoch starts on a batch boundary."""

from __future__ import annotations

from ..checks import check_bool
from .base import BuildContext, Spelling, Toggle, no_loader


class DropLast(Toggle):
    name = "drop_last"
    summary = "skip each epoch's remainder (DataLoader(drop_last=True)) instead of carrying it into the next epoch"
    cost = "up to batch_size-1 samples per epoch are not seen in that epoch"
    helps_when = "compiled or CUDA-graphed models, which recompile (or fail) on a short last batch"
    group = "data"
    phase = "data"
    plan_note = "drop_last changes which samples an epoch sees, not a step's memory"

    def changes_nothing(self, cfg) -> str | None:
        if cfg.data == "synthetic":
            return "drop_last has no effect on synthetic data (it has no epochs)"
        return no_loader(cfg, self.name)

    def apply(self, ctx: BuildContext, value) -> None:
        ctx.loader_kwargs["drop_last"] = True


    def traced(self, value) -> bool:
        return True

    # Framework spellings: Trainer arguments, accelerate, Lightning
    training_fields = {"dataloader_drop_last": False}

    def from_training_arguments(self, fields, notes) -> bool | None:
        check_bool("TrainingArguments", "dataloader_drop_last", fields["dataloader_drop_last"])
        return fields["dataloader_drop_last"] or None

    def spelling(self, target, value, cfg) -> Spelling:
        return Spelling(kwargs={"dataloader_drop_last": True}) if target == "hf" else Spelling(loader={"drop_last": "True"})

    def off_spelling(self, target, cfg) -> Spelling:
        return Spelling(kwargs={"dataloader_drop_last": False}) if target == "hf" else Spelling()


TOGGLE = DropLast()
