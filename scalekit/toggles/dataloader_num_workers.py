"""dataloader_num_workers: build batches in worker processes, ahead of the step that needs them."""

from __future__ import annotations

import os

import torch

from ..checks import int_in
from ..data.pipeline import init_worker
from .base import BuildContext, Spelling, Tune, no_loader
from .counted import CountToggle

PREFETCH_FACTOR = 2  # batches each worker prepares ahead (torch's default): 2 × workers batches in flight
BATCH_TIMEOUT_S = 600  # a batch that takes longer than this means a worker is stuck: the run fails, it does not hang


class DataloaderNumWorkers(CountToggle):
    name = "dataloader_num_workers"
    summary = "build batches in N worker processes (DataLoader num_workers), ahead of the step that needs them"
    cost = "N processes and cores; batches cross to the training process through shared memory; a second to start"
    helps_when = "making a batch (reading, decoding, transforming) is a share of each step and cores are free"
    group = "data"
    phase = "data"
    default = 2
    choices = (1, 2, 4, 8)  # offered in the Lab and `scalekit toggles`; any count works
    unit = "worker processes"
    tuning = (Tune(2, rank=80),)
    plan_note = ('dataloader_num_workers adds worker processes, each with its own memory (a few batches in flight '
                 'and a copy-on-write view of the dataset), outside this plan')

    def changes_nothing(self, cfg) -> str | None:
        return no_loader(cfg, self.name)

    def apply(self, ctx: BuildContext, workers: int) -> None:
        # the loader's sampler never ends, so the workers live for the whole run (what persistent_workers
        # gives a loader that is iterated once per epoch) and end with it (the run closes its pipeline)
        ctx.loader_kwargs.update(num_workers=workers, worker_init_fn=init_worker, prefetch_factor=PREFETCH_FACTOR,
                                 timeout=BATCH_TIMEOUT_S)
        threads, cores = torch.get_num_threads(), os.cpu_count() or 1
        if ctx.device.type == "cpu" and workers + threads > cores:
            ctx.notes.append(f"{workers} data worker{'s' * (workers > 1)} and {threads} compute "
                             f"thread{'s' * (threads > 1)} share {cores} core{'s' * (cores > 1)}")

    # Framework spellings: Trainer arguments, accelerate, Lightning
    training_fields = {"dataloader_num_workers": 0}

    def from_training_arguments(self, fields, notes) -> int | None:
        return int_in("TrainingArguments", "dataloader_num_workers", fields["dataloader_num_workers"], 0, 2**20) or None

    def spelling(self, target, workers: int, cfg) -> Spelling:
        if target == "hf":
            return Spelling(kwargs={"dataloader_num_workers": workers})
        return Spelling(loader={"num_workers": str(workers)})

    def off_spelling(self, target, cfg) -> Spelling:
        return Spelling(kwargs={"dataloader_num_workers": 0}) if target == "hf" else Spelling()


TOGGLE = DataloaderNumWorkers()
