"""Every optimization scalekit can switch, and the one function that fixes the order they apply in."""

from __future__ import annotations

from . import (
    bf16,
    checkpointing,
    compile,
    cpu_offload,
    data_echo,
    dataloader_num_workers,
    dataloader_pin_memory,
    ddp,
    deepspeed,
    dora,
    drop_last,
    empty_cache_steps,
    fp16,
    fsdp,
    fused_adamw,
    grad_accum,
    head_only,
    inference_mode,
    kv_cache,
    lora,
    nice_numbers,
    non_blocking,
    optim,
    quantize,
    quantized_base,
    sdpa,
    tf32,
    training_format,
    vectorized_transforms,
)
from .base import LOOPS, PHASES, BuildContext, OptimizerStep, Toggle

# Application order (after torchtitan), phase by phase (base.PHASES): process-wide flags first; then the
# precision the run computes in, which the wrappers below read; then the data pipeline; then changes to the
# model's architecture, made before it is built; then module swaps on the built model (fine-tuning freezes
# the base, quantizes it and adds adapters; optim's StableEmbedding) and wrappers, innermost first (activation checkpointing, then compile, then DDP/FSDP, so
# the wrapper that shards sees compiled blocks; cpu_offload is a policy fsdp reads, so it comes just before
# it); then the optimizer, which must see the final parameters; last the per-step behaviour (accumulation,
# hooks after each step, and DeepSpeed, which takes over the model and optimizer built above).
# Generation walks the same phases (loop="generate") with the toggles that apply to it: kv_cache is an
# architecture choice, read by compile after it; quantize swaps the blocks' linear layers before compile
# wraps the model; inference_mode is the context the decode loop runs in.
ORDER: tuple[Toggle, ...] = (
    tf32.TOGGLE,
    bf16.TOGGLE,
    fp16.TOGGLE,
    drop_last.TOGGLE,
    training_format.TOGGLE,
    vectorized_transforms.TOGGLE,
    dataloader_num_workers.TOGGLE,
    dataloader_pin_memory.TOGGLE,
    non_blocking.TOGGLE,
    data_echo.TOGGLE,
    sdpa.TOGGLE,
    nice_numbers.TOGGLE,
    kv_cache.TOGGLE,
    head_only.TOGGLE,
    quantized_base.TOGGLE,
    lora.TOGGLE,
    dora.TOGGLE,
    optim.TOGGLE,
    quantize.TOGGLE,
    checkpointing.TOGGLE,
    compile.TOGGLE,
    ddp.TOGGLE,
    cpu_offload.TOGGLE,
    fsdp.TOGGLE,
    fused_adamw.TOGGLE,
    grad_accum.TOGGLE,
    empty_cache_steps.TOGGLE,
    inference_mode.TOGGLE,
    deepspeed.TOGGLE,
)
TOGGLES: dict[str, Toggle] = {t.name: t for t in ORDER}

# Toggles that cannot be on together, and why.
EXCLUSIVE: tuple[tuple[str, str, str], ...] = (
    ("bf16", "fp16", "both set the autocast dtype: pick one"),
    ("optim", "fused_adamw", "both choose the optimizer: use optim='adamw_torch_fused' for fused AdamW"),
    ("ddp", "fsdp", "both spread training over ranks: DDP replicates the model, FSDP shards it; pick one"),
    ("ddp", "deepspeed", "DeepSpeed does its own data parallelism: pick one"),
    ("fsdp", "deepspeed", "both shard the training state: pick one"),
    ("cpu_offload", "deepspeed", "DeepSpeed has its own offload: use deepspeed='zero2-offload' or 'zero3-offload'"),
    ("fp16", "deepspeed", "DeepSpeed scales fp16 losses itself: use bf16, or DeepSpeed's own fp16 config"),
    ("head_only", "lora", "both choose what trains: the new head alone, or adapters"),
    ("head_only", "dora", "both choose what trains: the new head alone, or adapters"),
    ("lora", "dora", "DoRA is LoRA with a magnitude split off: pick one"),
    ("fsdp", "quantized_base", "FSDP shards floating-point parameters; bitsandbytes keeps 4-bit weights as packed "
                               "uint8 with separate quantization state, which FSDP2 cannot shard here (Answer.ai's "
                               "FSDP + QLoRA stores them in a float dtype, bnb_4bit_quant_storage, for this)"),
)

# Toggles that only work with another one on (or any one of several), and why.
REQUIRES: tuple[tuple[str, str | tuple[str, ...], str], ...] = (
    ("cpu_offload", "fsdp", "CPU offload is FSDP2's offload policy (DeepSpeed has its own: deepspeed='zero3-offload')"),
    ("quantized_base", ("lora", "dora"), "a quantized base is frozen: it trains through adapters (QLoRA)"),
)


def apply_toggles(ctx: BuildContext, phase: str, toggles: dict, loop: str = "train") -> None:
    """Apply the chosen `toggles` that act at `phase` in `loop`, in ORDER; one that says it changes nothing for
    this configuration (Toggle.changes_nothing) is not applied, and the run's notes say why."""
    assert phase in PHASES, phase
    for toggle in ORDER:
        if toggle.phase == phase and toggle.name in toggles and loop in toggle.loops:
            nothing = toggle.changes_nothing(ctx.config)
            if nothing:
                ctx.notes.append(nothing)
                continue
            toggle.apply(ctx, toggles[toggle.name])


def needs_process_group(toggles) -> bool:
    """Whether any of `toggles` (names) needs the run to join a process group before it is built."""
    return any(TOGGLES[name].needs_process_group for name in toggles)


__all__ = ["ORDER", "TOGGLES", "EXCLUSIVE", "REQUIRES", "apply_toggles", "needs_process_group", "Toggle",
           "BuildContext", "OptimizerStep", "PHASES", "LOOPS"]
