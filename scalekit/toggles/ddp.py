"""DDP: one model replica per rank, gradients averaged across ranks by all-reduce during backward."""

from __future__ import annotations

from torch.nn.parallel import DistributedDataParallel

from ..distributed.runtime import available_with_ranks, distributed_available, release_model
from .base import BuildContext, Spelling, Toggle


class DDP(Toggle):
    name = "ddp"
    summary = "DistributedDataParallel: each rank trains on batch/ranks, gradients all-reduced in buckets"
    cost = "a full copy of weights, gradients and optimizer state on every rank, plus gradient buckets"
    helps_when = "the model fits on one device and you have more devices: throughput scales with ranks"
    group = "distributed"
    kind = "runtime"
    phase = "wrap"
    needs_process_group = True  # the engine joins (or creates) the process group before building
    averages_gradients = True

    def available(self, hw) -> tuple[bool, str]:
        return available_with_ranks("DDP")

    def available_in_ranks(self, hw) -> tuple[bool, str]:
        return distributed_available()

    def apply(self, ctx: BuildContext, value) -> None:
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        ctx.model = DistributedDataParallel(ctx.model, device_ids=device_ids)
        # micro-steps before the last accumulate locally; the last one all-reduces the sum (train_step)
        ctx.no_sync = ctx.model.no_sync
        # a DDP model outliving its process group can abort the process at exit: drop it first (LIFO)
        ctx.stack.callback(release_model, ctx)


    def plan(self, facts, value) -> None:
        facts.grad_buckets = True
        facts.rank_notes.append("ddp: every rank keeps the whole model, its gradients and optimizer state, plus "
                                "gradient buckets (a flat copy of every gradient)")

    # Framework spellings: Trainer arguments, accelerate, Lightning
    training_fields = {"fsdp": None, "deepspeed": None}

    def from_training_arguments(self, fields, notes) -> bool | None:
        # the Trainer runs DistributedDataParallel when launched in several processes without FSDP or DeepSpeed
        return fields["world_size"] > 1 and not fields["fsdp"] and not fields["deepspeed"] or None

    def spelling(self, target, value, cfg) -> Spelling:
        return {"hf": Spelling(notes=("ddp: the Trainer runs DistributedDataParallel when started in several processes",)),
                "accelerate": Spelling(notes=("ddp: Accelerate runs DistributedDataParallel in notebook_launcher's "
                                              "processes",)),
                "lightning": Spelling(kwargs={"strategy": "'ddp'"})}[target]


TOGGLE = DDP()
