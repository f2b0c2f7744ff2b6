"""non_blocking: copy each batch to the GPU asynchronously, so the host goes on while the copy runs."""

from __future__ import annotations

import dataclasses

from ..checks import check_bool, dict_or_none
from .base import BuildContext, Spelling, Toggle, Tune, needs_a_gpu, no_loader


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

    # Framework spellings: Trainer arguments, accelerate, Lightning
    training_fields = {"accelerator_config": None}

    def from_training_arguments(self, fields, notes) -> bool | None:
        config = fields["accelerator_config"]
        if dataclasses.is_dataclass(config):  # a TrainingArguments holds it as transformers' AcceleratorConfig: its
            config = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)  # fields set off their defaults
                      if getattr(config, f.name) != (f.default if f.default_factory is dataclasses.MISSING
                                                     else f.default_factory())}
        if isinstance(config, str):
            notes.append(f"accelerator_config={config!r} not mapped: a JSON file is not read (give a dict)")
            return None
        config = dict_or_none("TrainingArguments", "accelerator_config", config)
        on = config.pop("non_blocking", False)
        check_bool("TrainingArguments", "accelerator_config['non_blocking']", on)
        if config:
            notes.append(f"accelerator_config not mapped: {config}")
        return on or None

    def spelling(self, target, value, cfg) -> Spelling:
        return {"hf": Spelling(kwargs={"accelerator_config": {"non_blocking": True}}),
                "accelerate": Spelling(kwargs={"dataloader_config": "DataLoaderConfiguration(non_blocking=True)"},
                                       imports=("from accelerate.utils import DataLoaderConfiguration",)),
                "lightning": Spelling(notes=("non_blocking: Lightning copies batches to a GPU with non_blocking=True "
                                             "already",))}[target]


TOGGLE = NonBlocking()
