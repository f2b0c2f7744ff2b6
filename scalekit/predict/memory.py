"""Memory per GPU of a prediction: scalekit.estimate's plan for the built-in GPT, and for the public shapes 16 bytes
per parameter split as the sharding splits it plus the activations walked op by op (saved_activations.py), the peak
the most bytes alive at once."""

from __future__ import annotations

from ..errors import ConfigError
from . import cost
from .inputs import as_number
from .shapes import ModelShape

GIB = 2**30


def memory_per_gpu(model, shape, lay, toggles, batch, seq, rows, part, assumptions):
    """(bytes by part, the method) per GPU."""
    from ..training.config import RunConfig

    preset = model if isinstance(model, str) and shape.source.startswith("scalekit") else getattr(model, "preset", None)
    if preset is not None and shape.source.startswith("scalekit"):
        from ..plan import estimate

        planned = {k: v for k, v in toggles.items() if k != "context_parallel"}
        cfg = RunConfig(preset=preset, toggles=planned, batch_size=batch, seq_len=seq, device="cpu")
        est = estimate(cfg, device="cpu" if part.name.startswith("this-cpu") else "cuda",
                       world_size=lay.world if lay.world > 1 else None)
        mem = dict(params=est.params_bytes, grads=est.grads_bytes, optimizer_state=est.optimizer_state_bytes,
                   activations=est.activations_bytes, comm_buffers=0, peak=est.peak_bytes)
        assumptions.append("memory: scalekit.estimate's plan of the built-in GPT (its analytic inventory, per rank; "
                           "communication buffers are inside its activations figure)"
                           + (f"; context_parallel {lay.cp} planned as data parallel over the same ranks (each rank "
                              f"holds as many tokens)" if lay.cp > 1 else ""))
        return mem, "scalekit.estimate (" + est.method + ")"
    return _formula_memory(shape, lay, rows, seq, assumptions)


def _formula_memory(shape: ModelShape, lay: cost.Layout, rows: int, seq: int, assumptions: list[str]):
    from .saved_activations import walked_peak

    n = shape.n_params / (lay.tp * lay.pp)
    shard = lay.grad_ranks
    params = 4 * n / (shard if lay.sharding in ("fsdp", "zero2") else 1)
    grads = 4 * n / (shard if lay.sharding in ("fsdp", "zero2") else 1)
    state = 8 * n / (shard if lay.sharding in ("fsdp", "zero1", "zero2") else 1)
    buffers = 0.0
    if lay.sharding == "fsdp":  # two units gathered (one prefetched) in the compute dtype, one unit's fp32 gradients
        buffers = 2 * shape.block_params * lay.act_bytes / lay.tp + 4 * shape.block_params / lay.tp
    elif lay.sharding == "zero2":
        buffers = n * lay.act_bytes
    elif lay.sharding in ("ddp", "zero1"):
        buffers = grads  # DDP's buckets: a flat copy of every gradient
    autocast = lay.dtype in ("bf16", "fp16")
    bf16_weights = autocast and lay.sharding == "fsdp"  # FSDP's param_dtype: the gathered weights are bf16 (as _counted)
    layers = shape.n_layer // lay.pp
    policy = _walk_policy(lay.checkpointing)
    # the walk: activations and temporaries op by op, a context-parallel rank's 1/cp of every sequence and a
    # tensor-parallel rank's 1/tp of the blocks' (the embeddings and the head stay whole), with the gradients alive
    # at each op (zero_grad(set_to_none=True) before the step)
    walk = walked_peak(shape, layers, rows, seq, policy, 2 if bf16_weights else 4, autocast, lay.flash_attention,
                       grads_bytes=grads, divide=(lay.tp * lay.cp, lay.cp))
    activations = walk.activations
    in_flight = 1
    if lay.pp > 1:  # the first stage holds the most micro-batches as its first backward begins
        in_flight = lay.micro_batches if lay.schedule == "gpipe" else min(lay.pp, lay.micro_batches)
        activations += (in_flight - 1) * layers * walk.held_per_block
    peak = params + state + buffers + activations + grads * walk.grads_fraction
    mem = {k: int(v) for k, v in dict(params=params, grads=grads, optimizer_state=state, activations=activations,
                                      comm_buffers=buffers, peak=peak).items()}
    assumptions.append(_walked_assumption(shape, lay, rows, seq, policy, walk, activations, in_flight))
    return mem, "walked (the counted model's step on fake tensors; 16 bytes per parameter for mixed-precision AdamW)"


def _walked_assumption(shape, lay: cost.Layout, rows: int, seq: int, policy, walk, activations, in_flight) -> str:
    autocast = lay.dtype in ("bf16", "fp16")
    return (
        "memory: fp32 weights, fp32 gradients and AdamW's two fp32 moments (16 bytes per parameter), "
        f"split over {lay.grad_ranks} data-parallel ranks as {lay.sharding} splits them; activations walked op by op: "
        "the counted model (2 layers at 2 and 3 rows, scaled) run forward, loss (logits → fp32 → cross_entropy) and "
        "backward on fake tensors at the real sizes under scalekit's memory timeline, "
        + ("without checkpointing" if policy is None else f"checkpointing {policy!r} applied as torch applies it")
        + (", bf16 weights (FSDP's param_dtype)" if autocast and lay.sharding == "fsdp"
           else ", bf16 autocast (CPU policy)" if autocast else "")
        + f"; a block keeps {walk.held_per_block / GIB:.2f} GiB to its backward (on average), scaled to "
        f"{shape.n_layer // lay.pp} layers (Korthikanti et al. 2022 count 34·s·b·h bytes per GPT layer without "
        f"checkpointing: {34 * seq * rows * shape.d / (lay.tp * lay.cp) / GIB:.2f} GiB; their sum is no longer the peak)"
        + (f", {in_flight} micro-batches in flight on the first stage" if in_flight > 1 else "")
        + (f"; the blocks' bytes ÷ tensor_parallel {lay.tp} (the embeddings, head and loss whole on every rank, as "
           "scalekit's tensor_parallel leaves them)" if lay.tp > 1 else "")
        + (f"; every byte ÷ context_parallel {lay.cp} (each rank holds 1/{lay.cp} of every sequence)" if lay.cp > 1
           else "")
        + f"; the peak is the walk's most bytes alive at once ({walk.where}: {activations / GIB:.1f} GiB of "
        f"activations and temporaries, {100 * walk.grads_fraction:.0f}% of the gradients), not a sum; it is the "
        "allocated peak: a caching allocator reserves more (fragmentation), and torchtitan's 'Memory' is the reserved "
        "peak")


def _walk_policy(checkpointing):
    """The walk's spelling of the layout's checkpointing: None, every k-th block, or a named policy."""
    if checkpointing is None or checkpointing is False:
        return None
    if checkpointing is True:
        return 1
    checkpointing = as_number(checkpointing)
    if isinstance(checkpointing, int):
        if checkpointing < 1:
            raise ConfigError(f"checkpointing every {checkpointing} blocks: give a count of 1 or more")
        return checkpointing
    if checkpointing in ("selective", "selective-torchtitan", "sequential"):
        return checkpointing
    raise ConfigError(f"checkpointing {checkpointing!r} is not one the memory walk knows: True or k (every k-th "
                      "block), 'sequential', 'selective' (scalekit's) or 'selective-torchtitan' (torchtitan's op policy)")
