"""dataloader_pin_memory: the DataLoader hands over batches in page-locked (pinned) host memory."""

from __future__ import annotations

import torch

from ..checks import check_bool
from .base import BuildContext, Spelling, Toggle, Tune, needs_a_gpu, no_loader


class DataloaderPinMemory(Toggle):
    name = "dataloader_pin_memory"
    summary = "batches handed over in pinned (page-locked) host memory, so the copy to the GPU is a direct DMA"
    cost = "pinning is one more copy per batch (in a thread), and pinned memory is taken from what the OS can page"
    helps_when = "host-to-device copies are a share of the data wait; non_blocking copies need it to be asynchronous"
    group = "data"
    phase = "data"
    tuning = (Tune(rank=110),)
    plan_note = 'dataloader_pin_memory keeps a few batches in pinned host memory, not device memory'

    def available(self, hw) -> tuple[bool, str]:
        return needs_a_gpu(hw, "pinned memory")

    def changes_nothing(self, cfg) -> str | None:
        return no_loader(cfg, self.name)

    def apply(self, ctx: BuildContext, value) -> None:
        # the DataLoader pins each batch in a thread of the training process, after the workers made it
        ctx.loader_kwargs["pin_memory"] = True

    # Framework spellings: Trainer arguments, accelerate, Lightning
    training_fields = {"dataloader_pin_memory": True, "use_cpu": False}

    def from_training_arguments(self, fields, notes) -> bool | None:
        check_bool("TrainingArguments", "dataloader_pin_memory", fields["dataloader_pin_memory"])
        if fields["dataloader_pin_memory"] and (fields["use_cpu"] or not torch.cuda.is_available()):
            # the Trainer pins only where there is a GPU to copy batches to (torch's DataLoader does nothing on a
            # CPU); the toggle is refused there, so it is said, not switched on
            notes.append("dataloader_pin_memory=True: the Trainer pins batches only on a GPU, and this run has none; "
                         "on a GPU it maps to the dataloader_pin_memory toggle")
            return None
        return fields["dataloader_pin_memory"] or None

    def spelling(self, target, value, cfg) -> Spelling:
        return Spelling(kwargs={"dataloader_pin_memory": True}) if target == "hf" else Spelling(loader={"pin_memory": "True"})

    def off_spelling(self, target, cfg) -> Spelling:
        return Spelling(kwargs={"dataloader_pin_memory": False}) if target == "hf" else Spelling()


TOGGLE = DataloaderPinMemory()
