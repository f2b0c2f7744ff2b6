"""dataloader_pin_memory: the DataLoader hands over batches in page-locked (pinned) host memory."""

from __future__ import annotations

from .base import BuildContext, Toggle, Tune, needs_a_gpu, no_loader


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


TOGGLE = DataloaderPinMemory()
