"""Activation checkpointing: keep only each block's input, recompute its insides during backward."""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    checkpoint_sequential,
    create_selective_checkpoint_contexts,
)

from ..checks import bool_or_none, check_bool, dict_or_none, int_in
from ..errors import ConfigError, ToggleUnavailable
from ..models.blocks import blocks_path, own_model_on_meta
from ..optional import quiet_import
from .base import BuildContext, Spelling, Tune
from .counted import CountToggle, as_count

SEQUENTIAL = "sequential"
SELECTIVE = "selective"

_aten = torch.ops.aten
# what selective checkpointing keeps (torchtitan's "op" policy): the outputs of the matmuls and of fused attention,
# which are costly to compute again; everything else (norms, GELU, softmax, adds, views) is recomputed in backward
SAVED_OPS = frozenset({_aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default,
                       _aten._scaled_dot_product_flash_attention.default,
                       _aten._scaled_dot_product_efficient_attention.default,
                       _aten._scaled_dot_product_cudnn_attention.default,
                       _aten._scaled_dot_product_flash_attention_for_cpu.default})


class Checkpointing(CountToggle):
    name = "checkpointing"
    summary = ("activation checkpointing: every block (or every k-th), torch's checkpoint_sequential, or selective "
               "(matmul outputs kept, the cheap ops recomputed)")
    cost = "one more forward of each checkpointed block during backward: ≈20% slower (≈⅓ more FLOPs)"
    helps_when = "activations dominate memory: long sequences, big batches, many layers"
    group = "memory"
    kind = "memory"
    phase = "wrap"
    default = 1
    tuning = (Tune(1, rank=130, label="checkpointing (to fit)", memory_only=True),
              Tune(SELECTIVE, rank=128, label="selective checkpointing (to fit)", memory_only=True))
    choices = (1, 2, SEQUENTIAL, SELECTIVE)  # offered in the Lab and `scalekit toggles`; any count works
    unit = "blocks (1: every block, k: every k-th block), 'sequential' or 'selective'"

    def validate(self, value: Any, owner: str = "RunConfig") -> int | str:
        if value in (SEQUENTIAL, SELECTIVE):
            return value
        if value is True or as_count(value) is not None:
            return super().validate(value, owner)
        raise ConfigError(f"{owner}.toggles['checkpointing'] must be True (every block), a positive whole "
                          f"number k (every k-th block), 'sequential' (torch's checkpoint_sequential) or "
                          f"'selective' (every block, its matmul outputs kept); got {value!r}")

    def apply(self, ctx: BuildContext, value: int | str) -> None:
        blocks = ctx.blocks  # found once for the run by scalekit.models.blocks.find_blocks
        if blocks is None:
            raise ToggleUnavailable("checkpointing needs repeated blocks: your model has no nn.ModuleList or "
                                    "nn.Sequential to checkpoint")
        adapter = ctx.model_adapter  # a model family with its own way to checkpoint (Hugging Face), or None
        if value == SELECTIVE:  # scalekit wraps every block itself, with the policy as its context_fn
            checkpoint_every(blocks, 1, selective=True)
            ctx.notes.append(f"selective checkpointing of {len(blocks)} blocks: matmul and attention outputs kept")
            return
        if value == SEQUENTIAL:
            ok, why = adapter.sequential_checkpoint_support() if adapter is not None else (True, "")
            if not ok:
                raise ToggleUnavailable(f"checkpointing='sequential': {why}")
            segments = min(sequential_segments(len(blocks)), len(blocks))
            checkpoint_all_sequential(blocks, segments)
            ctx.notes.append(f"checkpoint_sequential: {len(blocks)} blocks in {segments} segments "
                             f"(the last one not checkpointed)")
            return
        if value > len(blocks):
            raise ConfigError(f"RunConfig.toggles['checkpointing']={value}: the model has only {len(blocks)} "
                              f"blocks, so no block is a multiple of {value}; allowed: 1 to {len(blocks)}")
        own = adapter.checkpoint(ctx.base_model, value) if adapter is not None else None
        if own is not None:  # done the family's way (Hugging Face: activation_checkpointing_enable)
            ctx.notes.append(own)
            return
        chosen = checkpoint_every(blocks, value)
        if value > 1:
            ctx.notes.append(f"checkpointing {len(chosen)} of {len(blocks)} blocks")


    def plan(self, facts, value: int | str) -> None:
        facts.checkpointing = value
        if value == SELECTIVE:  # what the policy keeps depends on the ops each block dispatches: traced
            facts.analytic = False

    def traced(self, value) -> bool:
        return True

    # Framework spellings: Trainer arguments, accelerate, Lightning
    training_fields = {"activation_checkpointing": None, "activation_checkpointing_kwargs": None,
                       "gradient_checkpointing": None, "gradient_checkpointing_kwargs": None}

    def from_training_arguments(self, fields, notes) -> int | None:
        act, grad = (bool_or_none("TrainingArguments", n, fields[n]) for n in ("activation_checkpointing",
                                                                               "gradient_checkpointing"))
        act_kwargs, grad_kwargs = (dict_or_none("TrainingArguments", f"{n}_kwargs", fields[f"{n}_kwargs"])
                                   for n in ("activation_checkpointing", "gradient_checkpointing"))
        if not (act if act is not None else grad):  # the newer field wins where both are given
            return None
        name = "activation_checkpointing_kwargs" if act_kwargs or not grad_kwargs else "gradient_checkpointing_kwargs"
        kwargs = act_kwargs or grad_kwargs
        every = int_in("TrainingArguments", f"{name}['every_n_layers']", kwargs.pop("every_n_layers", 1), 1, 2**20)
        reentrant = kwargs.pop("use_reentrant", False)
        check_bool("TrainingArguments", f"{name}['use_reentrant']", reentrant)
        if reentrant:
            notes.append("checkpointing: use_reentrant=True not mapped: scalekit checkpoints with use_reentrant=False")
        if kwargs:
            notes.append(f"{name} not mapped: {kwargs}")
        return every

    def spelling(self, target, value, cfg) -> Spelling:
        if value == SELECTIVE:
            why = "selective checkpointing needs a policy function (context_fn), which the framework's switch cannot take"
            return Spelling(missing=f"has no TrainingArguments field: {why}" if target == "hf" else why)
        if value == SEQUENTIAL:
            why = ("torch's checkpoint_sequential passes one tensor from block to block, and a Transformers model's blocks "
                   "also take masks and positions")
            return Spelling(missing=f"has no TrainingArguments field: {why}" if target == "hf" else why)
        own, why = own_model_on_meta(getattr(cfg, "model", None))
        if own is not None or why:
            return own_model_spelling(target, value, own, why)
        name = checkpointing_field()
        if target == "hf":
            return Spelling(kwargs={name: True, f"{name}_kwargs": {"use_reentrant": False,
                                                                 **({"every_n_layers": value} if value != 1 else {})}})
        if target == "lightning":
            return Spelling(wrap=(enable_line("self.model", value),))
        return Spelling(model=(enable_line("model", value),))


def save_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """The selective policy: keep what SAVED_OPS compute, recompute the cheap rest."""
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def checkpointed(forward, selective: bool = False):
    """`forward`, run under torch.utils.checkpoint: its activations are recomputed in backward, not kept
    (selective: all but the matmuls' outputs, which are kept)."""
    extra = {"context_fn": functools.partial(create_selective_checkpoint_contexts, save_matmuls)} if selective else {}

    def run(*args, **kwargs):
        # use_reentrant=False: the recommended form; works with kwargs, compile and grads of any inputs
        return checkpoint(forward, *args, use_reentrant=False, **extra, **kwargs)

    return run


def sequential_segments(n_blocks: int) -> int:
    # √n segments keep √n boundaries and recompute one segment at a time (Chen et al., 2016)
    return max(2, math.ceil(math.sqrt(n_blocks)))


def checkpoint_every(blocks, every: int, selective: bool = False) -> list[int]:
    """Checkpoint blocks k, 2k, 3k… (1-based, as torchtitan counts); returns their 0-based indices."""
    chosen = [i for i in range(len(blocks)) if (i + 1) % every == 0]
    for i in chosen:
        blocks[i].forward = checkpointed(blocks[i].forward, selective)
    return chosen


def checkpoint_all_sequential(blocks, segments: int) -> None:
    """torch's checkpoint_sequential over the blocks: the first block runs the whole chain, the rest pass through.

    checkpoint_sequential needs the chain in one call; the model's own loop still calls each block, so
    block 0 runs them all and the others return their input.  Module hooks on blocks 1… fire around a
    pass-through: use the per-block form with wrappers that hook blocks (FSDP).
    """
    forwards = [b.forward for b in blocks]
    blocks[0].forward = lambda x: checkpoint_sequential(forwards, segments, x, use_reentrant=False)
    for b in list(blocks)[1:]:
        b.forward = _pass_through


def _pass_through(x):
    return x


def checkpointing_field() -> str:
    """'activation_checkpointing' where the installed transformers has it (5.x), else 'gradient_checkpointing'."""
    try:
        import dataclasses

        TrainingArguments = quiet_import("transformers.training_args").TrainingArguments  # noqa: N806 (a class)
    except ImportError:
        return "gradient_checkpointing"
    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


def enable_line(model: str, every: int) -> str:
    """The line that checkpoints a Transformers `model` every `every` layers."""
    if checkpointing_field() == "activation_checkpointing":
        return (f'{model}.activation_checkpointing_enable(activation_checkpointing_kwargs={{"use_reentrant": False}}'
                + (f", every_n_layers={every})" if every != 1 else ")"))
    return (f'{model}.gradient_checkpointing_enable(gradient_checkpointing_kwargs={{"use_reentrant": False}})'
            + ("  # every layer: this transformers has no every_n_layers" if every != 1 else ""))


def own_model_spelling(target: str, every: int, model, why: str) -> Spelling:
    """Checkpointing written for your own nn.Module (`model`, built on the meta device; None and `why` when it could not
    be): its blocks' forwards run under torch.utils.checkpoint, as scalekit runs them."""
    if model is None:
        return Spelling(missing=f"{why}, to find its blocks: run them under torch.utils.checkpoint by hand")
    path = blocks_path(model)
    lines = (f"for i, block in enumerate({{model}}{f'.get_submodule({path!r})' if path else ''}):  "
             f"# checkpointing={every}: blocks {every}, {2 * every}, ... keep only their input",
             f"    if (i + 1) % {every} == 0:",
             "        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)")
    imports = ("import functools", "from torch.utils.checkpoint import checkpoint")
    if target == "lightning":
        return Spelling(imports=imports, wrap=tuple(line.replace("{model}", "self.model") for line in lines))
    return Spelling(imports=imports, model=tuple(line.replace("{model}", "model") for line in lines))


TOGGLE = Checkpointing()
