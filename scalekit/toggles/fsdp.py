"""FSDP2: every rank keeps 1/ranks of each weight, gradient and optimizer state; blocks are gathered to run."""

from __future__ import annotations

import warnings

from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from ..checks import dict_or_none, one_of
from ..distributed.runtime import available_with_ranks, distributed_available, release_model
from ..distributed.sharding import shard_kwargs
from ..errors import ConfigError
from .base import BuildContext, Call, Spelling, Toggle


class FSDP(Toggle):
    name = "fsdp"
    summary = "FSDP2 fully_shard per block and on the root: weights, grads and optimizer state split across ranks"
    cost = "an all-gather of each block's weights in forward and backward, a reduce-scatter of its gradients"
    helps_when = "weights + gradients + optimizer state do not fit on one device, or leave too little for activations"
    group = "distributed"
    kind = "memory"
    phase = "wrap"
    needs_process_group = True
    averages_gradients = True
    excludes = {"ddp": "both spread training over ranks: DDP replicates the model, FSDP shards it; pick one"}

    def available(self, hw) -> tuple[bool, str]:
        return available_with_ranks("FSDP")

    def available_in_ranks(self, hw) -> tuple[bool, str]:
        return distributed_available()

    def apply(self, ctx: BuildContext, value) -> None:
        from torch.distributed.fsdp import fully_shard  # imported when used: it takes about a second

        kwargs = fsdp_kwargs(ctx)
        units = [] if ctx.blocks is None else list(ctx.blocks)  # the run's blocks, one rule for every toggle
        # fully_shard changes the modules in place, so a compiled wrapper around them shards too
        for unit in units:
            fully_shard(unit, **kwargs)
        # the root: embeddings, final norm, head; under pipeline_parallel the step calls this rank's stages (a
        # ModuleList), each a root of its own, as torch's PipelineStage expects
        roots = list(ctx.model) if isinstance(ctx.model, nn.ModuleList) else [ctx.base_model]
        for root in roots:
            fully_shard(root, **kwargs)
        if not ctx.config.custom_model:
            # the GPT returns a slice of its logits and nothing edits it in place: FSDP2's warning about
            # in-place edits of a returned view does not apply (for your own model it stays on)
            ctx.stack.enter_context(warnings.catch_warnings())
            warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
        ctx.stack.callback(release_model, ctx)
        over = ctx.world_size if ctx.mesh is None else ctx.mesh["dp"].size()
        ctx.notes.append(f"fsdp: {len(units)} blocks + {len(roots)} root(s) sharded over {over} ranks")


    def plan(self, facts, value) -> None:
        facts.sharded = frozenset(("params", "grads", "state"))
        facts.gathers_blocks = True
        over = facts.world_size // facts.tensor_parallel // facts.pipeline_stages  # the mesh's 'dp' size
        facts.rank_notes.insert(0, f"fsdp: 1/{over} of the weights, gradients and optimizer state per "
                                   f"rank, one block's full weights gathered at a time (two while the next is "
                                   f"prefetched) and one block's gradients reduce-scattered")

    # Framework spellings: Trainer arguments, accelerate, Lightning
    training_fields = {"fsdp": None, "fsdp_config": None}

    def from_training_arguments(self, fields, notes) -> bool | None:
        read = fsdp_fields(fields)
        if read is None:
            return None
        if isinstance(fields["fsdp_config"], str):
            notes.append(f"fsdp_config={fields['fsdp_config']!r} not mapped: a JSON file is not read (give a dict)")
        if one_of("TrainingArguments", "fsdp_config['version']", read[1].get("version", 2), (1, 2)) != 2:
            notes.append("fsdp_config version 1 (FullyShardedDataParallel): scalekit's fsdp is FSDP2 (fully_shard)")
        return True

    def spelling(self, target, value, cfg) -> Spelling:
        if target == "hf":
            return Spelling(kwargs={"fsdp": True, "fsdp_config": {"version": 2, "reshard_after_forward": True}})
        if target == "accelerate":
            return Spelling(kwargs={"fsdp_plugin": Call("FullyShardedDataParallelPlugin",
                                                        {"fsdp_version": "2", "reshard_after_forward": "True"})},
                            imports=("from accelerate.utils import FullyShardedDataParallelPlugin",))
        return Spelling(kwargs={"strategy": Call("FSDPStrategy")},
                        imports=("from lightning.pytorch.strategies import FSDPStrategy",),
                        notes=("Lightning's FSDPStrategy is FSDP1 (FullyShardedDataParallel); scalekit's fsdp is FSDP2 "
                               "(fully_shard: Lightning's ModelParallelStrategy)",))


def fsdp_kwargs(ctx: BuildContext) -> dict:
    """fully_shard's options for this run: the mesh, mixed precision, CPU offload (read from the context)."""
    # on the run's mesh (pipeline and tensor parallel dimensions beside) FSDP shards over its data-parallel
    # dimension, as torchtitan does; alone, over every rank
    mesh = ctx.mesh["dp"] if ctx.mesh is not None else init_device_mesh(ctx.device.type, (ctx.world_size,))
    return shard_kwargs(ctx, mesh=mesh)


def fsdp_fields(fields) -> tuple[list[str], dict] | None:
    """TrainingArguments' fsdp options and fsdp_config (a JSON file's path is not read: {}), checked; None: no fsdp."""
    fsdp, config = fields["fsdp"], fields["fsdp_config"]
    if fsdp is not None and not isinstance(fsdp, (bool, str)) and not (
            isinstance(fsdp, list) and all(isinstance(x, str) for x in fsdp)):
        raise ConfigError(f"TrainingArguments.fsdp must be None, True, or FSDP options as a string ('full_shard "
                          f"offload') or a list of them, got {fsdp!r}")
    config = {} if isinstance(config, str) else dict_or_none("TrainingArguments", "fsdp_config", config)
    if not fsdp:
        return None
    return (fsdp.split() if isinstance(fsdp, str) else list(fsdp) if isinstance(fsdp, list) else []), config


TOGGLE = FSDP()
