"""non_blocking: copy each batch to the GPU asynchronously, so the host goes on while the copy runs."""

from __future__ import annotations

from .base import BuildContext, Toggle, Tune, needs_a_gpu, no_loader


class NonBlocking(Toggle):
    name = "non_blocking"
    summary = "copy batches to the GPU with .to(device, non_blocking=True): the host queues the copy and goes on"
    cost = "none by itself, but it is only asynchronous from pinned memory (dataloader_pin_memory)"
    helps_when = "a blocking copy makes the host wait for the device before it can queue the step's work"
    group = "data"
    phase = "data"
    tuning = (Tune(rank=120),)
    plan_note = 'non_blocking changes when the copy of a batch to the device runs, not its size'

    def available(self, hw) -> tuple[bool, str]:
        return needs_a_gpu(hw, "non_blocking")

    def changes_nothing(self, cfg) -> str | None:
        return no_loader(cfg, self.name)

    def apply(self, ctx: BuildContext, value) -> None:
        # a blocking copy waits until it is done, so it also waits for every kernel queued before it; from
        # pageable memory CUDA stages the copy and still waits: only pinned memory makes it asynchronous
        ctx.non_blocking_copy = True
        if not ctx.loader_kwargs.get("pin_memory"):
            ctx.notes.append("non_blocking without pinned memory: from pageable memory the copy still waits")


TOGGLE = NonBlocking()
