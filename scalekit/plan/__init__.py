"""Predict a run's memory and FLOPs before running it: `scalekit.estimate(config)`.

Memory of a training step has four parts (EleutherAI, "Transformer Math 101"): parameters, gradients,
optimizer state, and activations (what forward keeps for backward, and the temporaries alive at the peak).
Two methods, one answer shape (`Estimate`):
- the built-in GPT is planned analytically from its shapes (`plan.gpt`: Korthikanti's per-layer
  inventory, walked through backward block by block);
- any other model is planned by tracing one training step on fake tensors (`plan.traced`), with the
  same accounting the engine uses to measure a CPU run's peak.
A run spread over ranks is planned per rank (`plan.ranks`).  Every toggle is either part of the
prediction (it tells the planner what it changes: Toggle.plan, read into PlanFacts) or says in its
`plan_note` what the plan leaves out: none is silently ignored, and the planner names no toggle.
"""

from __future__ import annotations

import contextlib
import dataclasses
from types import SimpleNamespace
from typing import TYPE_CHECKING

from ..checks import micro_batch_rows
from ..distributed import runtime
from ..distributed.sharding import mesh_shape
from ..errors import ConfigError, PlanUnavailable
from ..machine.hardware import detect, gpu_count_without_cuda_init
from ..machine.memory_limit import MemoryLimit, machine_limit
from ..models import GPT
from ..models.blocks import block_linears
from ..models.presets import PRESETS
from ..toggles import TOGGLES, BuildContext, PlanFacts, apply_toggles, mesh_dims, plan_facts
from ..training.config import RunConfig
from .estimate import Estimate
from .gpt import gpt_estimate
from .ranks import per_rank
from .traced import planning_hardware, traced_estimate

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Estimate", "estimate", "check_fits", "planned_vs_measured", "plan_facts"]


def estimate(config: RunConfig, device: str | None = None, world_size: int | None = None) -> Estimate:
    """Predict params, grads, optimizer state, activations, the peak and the FLOPs of one step of `config`.

    `device` ('cpu' or 'cuda') picks autocast's rules; by default the device the config would run on.
    `world_size` is the number of ranks for ddp/fsdp/deepspeed runs (default: one per GPU here, else 2);
    their figures are per rank.
    """
    device_type = _device_type(config, device)
    cfg = config.resolve(SimpleNamespace(device_type=device_type))  # planning needs only the kind of device
    spread = [n for n in cfg.toggles if TOGGLES[n].needs_process_group]
    world = _world_size(world_size) if spread else 1
    dims = mesh_dims(cfg.toggles)  # the run's mesh, checked as the run checks it (parallel.mesh_shape)
    facts = plan_facts(cfg.toggles, world, mesh_shape(dims, world) if dims else None)
    # the ranks of a tensor-parallel group, and a pipeline's stages, share their rows
    local = _one_rank(cfg, world // facts.tensor_parallel // facts.pipeline_stages, spread, facts.micro_batches)
    if cfg.custom_model or not facts.analytic:
        single = traced_estimate(local, facts, device_type, cfg.label, _quantized_shapes(local, facts, device_type))
    else:
        single = gpt_estimate(local, facts, _gpt_config(local, device_type), device_type, cfg.label)
    if spread:
        single = per_rank(single, facts, world, device_type == "cuda")
    single.notes.extend(TOGGLES[n].plan_note for n in cfg.toggles if TOGGLES[n].plan_note)
    return single


def _device_type(config: RunConfig, device: str | None) -> str:
    device_type = (device or detect(config.device).device_type).split(":")[0]
    if device_type not in ("cpu", "cuda"):
        raise ConfigError(f"estimate: device must be 'cpu' or 'cuda', got {device!r}")
    return device_type


def _world_size(world_size) -> int:
    if world_size is None:
        return gpu_count_without_cuda_init() or 2
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"estimate: world_size must be a positive integer (ranks), got {world_size!r}")
    return world_size


def _one_rank(cfg: RunConfig, world: int, spread: list[str], micro_batches: int) -> RunConfig:
    """The config one rank runs, as a single process: its slice of the batch, no distributed toggle."""
    micro_batch_rows(cfg.batch_size, world, micro_batches)
    toggles = {n: v for n, v in cfg.toggles.items() if n not in spread}
    return dataclasses.replace(cfg, batch_size=cfg.batch_size // world, toggles=toggles)


def _quantized_shapes(cfg: RunConfig, facts: PlanFacts, device_type: str) -> list[tuple[int, int]] | None:
    """(out, in) of each weight of the frozen base held quantized: the adapter targets, read off the model built
    on the meta device."""
    if facts.quantized_base is None:
        return None
    import torch

    with torch.device("meta"):
        if cfg.custom_model:
            model = cfg.model if isinstance(cfg.model, torch.nn.Module) else cfg.model()
        else:
            model = GPT(_gpt_config(cfg, device_type))
    return [tuple(model.get_submodule(n).weight.shape) for n in block_linears(model, cfg.adapter_targets)]


def _gpt_config(cfg: RunConfig, device_type: str):
    """The GPT the run would build: the preset's shape with the architecture toggles applied to it."""
    with contextlib.ExitStack() as stack:
        hw = planning_hardware(device_type)
        ctx = BuildContext(config=cfg, hw=hw, device=hw.device, stack=stack,
                           gpt_config=PRESETS[cfg.preset].gpt_config(cfg.seq_len))
        apply_toggles(ctx, "model_config", cfg.toggles)
    return ctx.gpt_config


def planned_vs_measured(results) -> pd.DataFrame:
    """One row per measured run of the built-in GPT: planned and measured peak (MiB) and the planner's error."""
    import pandas as pd

    rows = []
    for r in results:
        if r.memory_breakdown() is None:
            continue
        fields = {k: v for k, v in r.config.items() if k not in ("model", "batch_fn", "loss_fn")}
        planned = estimate(RunConfig(**fields))
        rows.append({"run": r.label, "planned peak MiB": planned.peak_bytes / 2**20,
                     "measured peak MiB": r.peak_mem_bytes / 2**20,
                     "error %": 100 * (planned.peak_bytes - r.peak_mem_bytes) / r.peak_mem_bytes,
                     "planned activations MiB": planned.activations_bytes / 2**20,
                     "measured activations MiB": r.activations_bytes / 2**20})
    return pd.DataFrame(rows)


# How far a plan may exceed the machine's limit before the run is refused: the planner's measured error, so that
# a run that would fit is not refused for the plan's sake, and one that cannot fit is refused before it allocates
# (in a container, past its cgroup's limit, the kernel kills the process: exit 137 and no message).
# The built-in GPT's analytic plan: -4.9% to +2.8% of the measured peak over tests/plan/test_plan.py's 13 CPU cases
# (checkpointing the lowest), within 10% of CUDA's allocator on its GPU cases (the test's bound).  Only a plan
# over the measurement could refuse a run that fits; one under it (explicit attention at 4× the preset's context,
# preset small at seq_len 512: -10.5%) lets a run through that may not.
ANALYTIC_MARGIN = 1.10
# A traced plan (any other model): to the byte for test_plan.py's 18 single-process cases of your own models on the
# CPU (the trace counts what the run's tracker counts), within the tests' 15% for Hugging Face models and
# pipelines (a Llama's per-rank stages: -5.9% to +3.8%); no GPU measurement of a traced plan yet, hence the room.
TRACED_MARGIN = 1.20
# Your own model is checked on its parameters alone, at 16 bytes each: exact for fp32 AdamW, but several times too
# many for a frozen or quantized base (LoRA) or an 8-bit optimizer's state, so this check stays loose.
WEIGHTS_MARGIN = 2.0


def check_fits(cfg: RunConfig, hw) -> str | None:
    """Refuse (ConfigError) a resolved `cfg` whose planned peak exceeds the memory this run may use (the smallest
    of RAM, the container's cgroup limit and, on a GPU, its free memory: `memory_limit.machine_limit`) by more
    than the plan's error, before anything is allocated.  For the built-in GPT the whole plan is checked; for your
    own model only its weights, gradients and AdamW state (read off the parameters: tracing its step would run
    your batch_fn and loss_fn an extra time).  Returns a note when nothing could be checked."""
    limit = machine_limit(hw)
    if limit is None:
        return None
    ranks = runtime.world_size()  # in a launched rank, the launch's size
    ranks_here = ranks if hw.device_type == "cpu" else 1  # ranks on one CPU share its memory
    if cfg.custom_model:
        need = _weights_and_state_bytes(cfg) * ranks_here
        what, margin = f"weights, gradients and AdamW state alone come to {need / 2**30:.1f} GiB", WEIGHTS_MARGIN
    else:
        try:
            plan = estimate(cfg, device=hw.device_type, world_size=ranks if ranks > 1 else None)
        except PlanUnavailable as exc:  # the run itself will say what is wrong, in its own words
            return f"memory not checked before the run: {str(exc).splitlines()[0][:160]}"
        need, what = plan.peak_bytes * ranks_here, _planned_peak_words(plan, ranks_here)
        margin = ANALYTIC_MARGIN if plan.method.startswith("analytic") else TRACED_MARGIN
    if need > margin * limit.limit_bytes:
        raise ConfigError(_too_big_message(what, ranks_here, limit, margin))
    return None


def _planned_peak_words(plan: Estimate, ranks_here: int) -> str:
    gib = 2**30
    return (f"planned peak comes to {plan.peak_bytes * ranks_here / gib:.1f} GiB (parameters "
            f"{plan.params_bytes / gib:.2f}, gradients {plan.grads_bytes / gib:.2f}, optimizer state "
            f"{plan.optimizer_state_bytes / gib:.2f}, activations {plan.activations_bytes / gib:.2f} GiB"
            f"{' per rank' if ranks_here > 1 else ''})")


def _too_big_message(what: str, ranks_here: int, limit: MemoryLimit, margin: float) -> str:
    return (f"RunConfig.check_memory: this run's {what}{f' ({ranks_here} ranks on this machine)' if ranks_here > 1 else ''}"
            f", more than {margin:g}× this machine's limit of {limit.limit_bytes / 2**30:.1f} GiB ({limit.source}; "
            f"{margin:g}× allows for the plan's error): lower RunConfig.batch_size or RunConfig.seq_len (or pick a "
            f"smaller RunConfig.preset), or set check_memory=False (--no-memory-check) if you know better")


def _weights_and_state_bytes(cfg: RunConfig) -> int:
    """fp32 weights + gradients + AdamW's two moments: 16 bytes per parameter (the model built on meta)."""
    import torch

    if isinstance(cfg.model, torch.nn.Module):
        model = cfg.model
    else:
        with torch.device("meta"):
            model = cfg.model()
    return 16 * sum(p.numel() for p in model.parameters())
