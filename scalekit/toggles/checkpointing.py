"""Activation checkpointing: keep only each block's input, recompute its insides during backward."""

from __future__ import annotations

import math
from typing import Any

from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from ..errors import ConfigError, ToggleUnavailable
from .base import BuildContext, Tune
from .counted import CountToggle, as_count

SEQUENTIAL = "sequential"


def checkpointed(forward):
    """`forward`, run under torch.utils.checkpoint: its activations are recomputed in backward, not kept."""
    def run(*args, **kwargs):
        # use_reentrant=False: the recommended form; works with kwargs, compile and grads of any inputs
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def sequential_segments(n_blocks: int) -> int:
    # √n segments keep √n boundaries and recompute one segment at a time (Chen et al., 2016)
    return max(2, math.ceil(math.sqrt(n_blocks)))


def checkpoint_every(blocks, every: int) -> list[int]:
    """Checkpoint blocks k, 2k, 3k… (1-based, as torchtitan counts); returns their 0-based indices."""
    chosen = [i for i in range(len(blocks)) if (i + 1) % every == 0]
    for i in chosen:
        blocks[i].forward = checkpointed(blocks[i].forward)
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


class Checkpointing(CountToggle):
    name = "checkpointing"
    summary = "activation checkpointing: every block (or every k-th), or torch's checkpoint_sequential"
    cost = "one more forward of each checkpointed block during backward: ≈20% slower (≈⅓ more FLOPs)"
    helps_when = "activations dominate memory: long sequences, big batches, many layers"
    group = "memory"
    kind = "memory"
    phase = "wrap"
    tuning = (Tune(1, rank=130, label="checkpointing (to fit)", memory_only=True),)
    default = 1
    choices = (1, 2, "sequential")  # offered in the Lab and `scalekit toggles`; any count works
    unit = "blocks (1: every block, k: every k-th block), or 'sequential'"

    def validate(self, value: Any, owner: str = "RunConfig") -> int | str:
        if value == SEQUENTIAL:
            return SEQUENTIAL
        if value is True or as_count(value) is not None:
            return super().validate(value, owner)
        raise ConfigError(f"{owner}.toggles['checkpointing'] must be True (every block), a positive whole "
                          f"number k (every k-th block) or 'sequential' (torch's checkpoint_sequential); "
                          f"got {value!r}")

    def apply(self, ctx: BuildContext, value: int | str) -> None:
        blocks = ctx.blocks  # found once for the run by scalekit.models.blocks.find_blocks
        if blocks is None:
            raise ToggleUnavailable("checkpointing needs repeated blocks: your model has no nn.ModuleList or "
                                    "nn.Sequential to checkpoint")
        adapter = ctx.model_adapter  # a model family with its own way to checkpoint (Hugging Face), or None
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

    def traced(self, value) -> bool:
        return True

TOGGLE = Checkpointing()
