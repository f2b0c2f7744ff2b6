"""What a training step's toggles change in its memory, as the planner reads it: each toggle's `plan` sets the
fields of PlanFacts it changes (scalekit.toggles.plan_facts gathers them for a config's toggles); the planner
reads the fields, never a toggle's name."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..models.pipeline import InFlight


@dataclass(slots=True)
class PlanFacts:
    """What a training step's toggles change in its memory, as the planner (scalekit.plan) needs to know it: each
    toggle's `plan` sets the fields it changes; the planner reads the fields, never a toggle's name."""

    world_size: int = 1  # ranks the run is planned over (set by the planner before the toggles speak)
    activation_bytes: int = 4  # bytes per value in autocast regions (bf16, fp16: 2)
    wrapper_param_bytes: int = 4  # bytes per weight value sharding wrappers gather and compute with (bf16: 2)
    optimizer: str = "adamw_torch"  # the optimizer built, by optim's names (scalekit.toggles.optim.OPTIMIZERS)
    checkpointing: int | str | None = None  # every k-th block checkpointed, or "sequential"; None: none
    micro_batches: int = 1  # micro-batches per optimizer step (the batch split along dim 0)
    analytic: bool = True  # the built-in GPT's analytic plan covers the run (False: only a trace can tell)
    quantized_base: str | None = None  # bitsandbytes mode the frozen base's block linears are held in
    packed_rows: bool = False  # the dataset's documents are packed into full rows (data.packing): trace a packed batch
    # -- a run over ranks (scalekit.plan.ranks) --
    grad_buckets: bool = False  # every rank keeps a flat copy of every gradient (DDP's buckets)
    sharded: frozenset = frozenset()  # parts split over the ranks: of "params", "grads", "state"
    offloaded: frozenset = frozenset()  # parts kept in host memory (on a GPU): of "params", "grads", "state"
    gathers_blocks: bool = False  # one block's full weights gathered at a time (two while the next is prefetched)
    keeps_gathered: bool = False  # every block's full weights stay gathered from its forward to its backward (ZeRO-2)
    # the mesh's sizes (parallel.mesh_shape of the toggles' mesh_dims), set by the planner before the toggles speak
    tensor_parallel: int = 1  # ranks each block's linear layers are split over (weights, gradients, state); they share a batch
    pipeline_stages: int = 1  # stages the blocks are split into, one per rank; every stage sees the whole batch
    # the micro-batches each stage holds as its backwards begin, from the pipeline's schedule (models.pipeline.InFlight)
    pipeline_in_flight: InFlight | None = None
    rank_notes: list[str] = field(default_factory=list)  # how the ranks hold the parts, said beside the plan
