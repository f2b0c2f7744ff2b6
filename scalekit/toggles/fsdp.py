"""FSDP2: every rank keeps 1/ranks of each weight, gradient and optimizer state; blocks are gathered to run."""

from __future__ import annotations

import warnings

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

from ..launch.ranks import available_with_ranks, distributed_available, release_model, world_size
from .base import BuildContext, Toggle


def shard_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules to shard one by one: the built-in GPT's blocks, else every ModuleList's members."""
    blocks = getattr(getattr(model, "transformer", None), "h", None)
    if isinstance(blocks, torch.nn.ModuleList):
        return list(blocks)
    return [m for lst in model.modules() if isinstance(lst, torch.nn.ModuleList) for m in lst]


def fsdp_kwargs(ctx: BuildContext) -> dict:
    """fully_shard's options for this run: the mesh, bf16 mixed precision, CPU offload."""
    toggles = ctx.config.toggles
    kwargs: dict = {"mesh": init_device_mesh(ctx.device.type, (world_size(),))}
    if "bf16" in toggles:
        # compute in bf16, reduce gradients in fp32: the sharded fp32 weights stay the master copy
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if "cpu_offload" in toggles:
        # pinned host memory speeds the copies to a GPU; a CPU-only run has no device to pin for
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=ctx.device.type == "cuda")
    return kwargs


class FSDP(Toggle):
    name = "fsdp"
    summary = "FSDP2 fully_shard per block and on the root: weights, grads and optimizer state split across ranks"
    cost = "an all-gather of each block's weights in forward and backward, a reduce-scatter of its gradients"
    helps_when = "weights + gradients + optimizer state do not fit on one device, or leave too little for activations"
    group = "distributed"
    kind = "memory"
    phase = "wrap"
    needs_process_group = True

    def available(self, hw) -> tuple[bool, str]:
        return available_with_ranks("FSDP")

    def available_in_ranks(self, hw) -> tuple[bool, str]:
        return distributed_available()

    def apply(self, ctx: BuildContext, value) -> None:
        kwargs = fsdp_kwargs(ctx)
        units = shard_units(ctx.base_model)
        # fully_shard changes the modules in place, so a compiled wrapper around them shards too
        for unit in units:
            fully_shard(unit, **kwargs)
        fully_shard(ctx.base_model, **kwargs)  # the root: embeddings, final norm, head
        if not ctx.config.custom_model:
            # the GPT returns a slice of its logits and nothing edits it in place: FSDP2's warning about
            # in-place edits of a returned view does not apply (for your own model it stays on)
            ctx.stack.enter_context(warnings.catch_warnings())
            warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
        ctx.stack.callback(release_model, ctx)
        ctx.notes.append(f"fsdp: {len(units)} blocks + root sharded over {world_size()} ranks")


TOGGLE = FSDP()
