"""ZeRO stages 1 and 2 in plain PyTorch: optimizer state (and gradients) split over the ranks; fsdp is stage 3."""

from __future__ import annotations

import warnings

from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel

from ..distributed.runtime import available_with_ranks, distributed_available, release_model
from ..distributed.sharding import shard_kwargs
from .base import BuildContext, Call, Spelling, Toggle

MODES = ("zero1", "zero2")
WHAT = {"zero1": "optimizer state", "zero2": "optimizer state and gradients"}


class Zero(Toggle):
    name = "zero"
    summary = ("ZeRO without DeepSpeed: zero1 splits the optimizer state over ranks (ZeroRedundancyOptimizer), "
               "zero2 also the gradients (FSDP2, weights kept gathered from forward to backward); fsdp is ZeRO-3")
    cost = ("zero1: DDP's all-reduce plus a broadcast of the updated weights after each step; zero2: FSDP2's "
            "all-gather and reduce-scatter, with every block's full weights held from forward until backward")
    helps_when = "the optimizer state (zero1) or state and gradients (zero2) crowd out activations on each device"
    group = "distributed"
    kind = "memory"
    phase = "wrap"
    choices = MODES
    needs_process_group = True
    averages_gradients = True
    excludes = {
        "ddp": "zero1 is DDP with the optimizer state split (zero2 is FSDP2): pick one",
        "fsdp": "fsdp is ZeRO-3 (weights split too): pick one stage",
        "deepspeed": "both are ZeRO: pick scalekit's zero or DeepSpeed's",
        "cpu_offload": "cpu_offload is fsdp's policy (ZeRO-3): use it with fsdp",
    }

    def available(self, hw) -> tuple[bool, str]:
        return available_with_ranks("ZeRO")

    def available_in_ranks(self, hw) -> tuple[bool, str]:
        return distributed_available()

    def apply(self, ctx: BuildContext, value: str) -> None:
        from torch.distributed.fsdp import fully_shard  # imported when used: it takes about a second

        if value == "zero1":
            device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
            ctx.model = DistributedDataParallel(ctx.model, device_ids=device_ids)
            ctx.no_sync = ctx.model.no_sync  # accumulate locally; the last micro-batch all-reduces
            ctx.optimizer_state_sharded = True  # the optimizer, built next, keeps only this rank's share
        else:
            # FSDP2 without resharding after forward: each block's gathered weights stay until its backward,
            # so backward gathers nothing; gradients are reduce-scattered, weights sharded again after backward
            kwargs = shard_kwargs(ctx, init_device_mesh(ctx.device.type, (ctx.world_size,)), reshard_after_forward=False)
            for unit in [] if ctx.blocks is None else list(ctx.blocks):
                fully_shard(unit, **kwargs)
            fully_shard(ctx.base_model, **kwargs)
            if not ctx.config.custom_model:  # as fsdp: the GPT's returned slice of its logits is never edited
                ctx.stack.enter_context(warnings.catch_warnings())
                warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
        ctx.stack.callback(release_model, ctx)
        ctx.notes.append(f"zero: ZeRO-{value[-1]}, the {WHAT[value]} split over {ctx.world_size} ranks")

    def plan(self, facts, value: str) -> None:
        if value == "zero1":
            facts.sharded = frozenset(("state",))
            facts.grad_buckets = True
        else:
            # at rest FSDP2 holds 1/W of the weights too; from forward to backward every block is gathered
            facts.sharded = frozenset(("params", "grads", "state"))
            facts.keeps_gathered = True
        facts.rank_notes.append(
            f"zero ZeRO-{value[-1]}: 1/{facts.world_size} of the {WHAT[value]} per rank"
            + (", the full weights and DDP's gradient buckets on every rank" if value == "zero1" else
               "; the full weights gathered block by block in forward and kept until backward"))

    # Framework spellings: Trainer arguments, accelerate, Lightning
    def spelling(self, target, value: str, cfg) -> Spelling:
        stage = int(value[-1])
        if target == "hf":  # the Trainer's FSDP2 has no ZeRO-1; its reshard_after_forward=False is ZeRO-2
            if stage == 1:
                return Spelling(missing="the Trainer has no ZeroRedundancyOptimizer option (DeepSpeed's ZeRO-1 is "
                                        "its way: deepspeed={'zero_optimization': {'stage': 1}})")
            return Spelling(kwargs={"fsdp": True, "fsdp_config": {"version": 2, "reshard_after_forward": False}})
        if target == "accelerate":
            if stage == 1:
                return Spelling(missing="Accelerate has no ZeroRedundancyOptimizer option (its DeepSpeedPlugin"
                                        "(zero_stage=1) is DeepSpeed's)")
            return Spelling(kwargs={"fsdp_plugin": Call("FullyShardedDataParallelPlugin",
                                                        {"fsdp_version": "2", "reshard_after_forward": "False"})},
                            imports=("from accelerate.utils import FullyShardedDataParallelPlugin",))
        return Spelling(missing="Lightning's strategies have no ZeRO-1/2 without DeepSpeed "
                                "(its 'deepspeed_stage_1'/'deepspeed_stage_2' need DeepSpeed)")


TOGGLE = Zero()
