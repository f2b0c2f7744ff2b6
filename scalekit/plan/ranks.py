"""Per-rank figures for a run spread over ranks (the toggles that need a process group).

The planner first plans one rank's step as a single process: the rank's slice of the batch, no
distributed toggle.  Then it moves the parts the toggles say they move (their `plan` sets PlanFacts'
`sharded`, `offloaded`, `gathers_blocks`, `keeps_gathered` and `grad_buckets`), as each strategy does:
- DDP keeps everything on every rank, plus its gradient buckets: a flat copy of every gradient
  (`gradient_as_bucket_view=False`, DDP's default).
- FSDP2 keeps 1/W of the weights, gradients and optimizer state, and gathers one block's full weights at
  a time (two while the next is prefetched), reduce-scattering one block's gradients; CPU offload moves
  the shards to host memory.
- scalekit's zero: ZeRO-1 (ZeroRedundancyOptimizer under DDP) shards the optimizer state and keeps DDP's
  buckets; ZeRO-2 (FSDP2 without resharding after forward) holds 1/W of everything at rest, and the full
  weights from forward to backward.
- tensor_parallel splits each block's weights (and their gradients and state) over its degree; the ranks
  of a group share one batch, so the rank is planned with batch / (ranks / degree).  Its activations are
  planned at full width (the replicated norms and residuals are; the split attention and MLP are not):
  an upper bound.  With fsdp too (2-D), fsdp shards over the data-parallel ranks: ranks / degree.
- pipeline_parallel keeps 1/stages of the blocks per rank (the embeddings and head counted on every rank);
  every stage sees the whole batch, and keeps its own blocks' activations of every micro-batch (GPipe): the
  built-in GPT's analytic plan counts a stage's blocks, a traced model's (a Hugging Face decoder) activations
  are divided by the stages, except the head's: the last stage holds the logits, the loss's fp32
  log-probabilities and their gradient (each rows × seq × vocab) whole, and the plan is that stage's.  1F1B
  keeps fewer micro-batches in flight: for it the plan is an upper bound.  With `stages=S` and fsdp, S-stage
  pipelines run side by side and fsdp shards over them: ranks / S; torch's schedules keep each stage's weights
  gathered and its gradients unsharded from the first micro-batch's backward to the last, then reduce-scatter
  them once: the stage's whole weights and, twice, its whole gradients on top of the shards.  With
  tensor_parallel too (3-D, one (pipeline, data, tensor) mesh), a stage's blocks are split over the degree.
- DeepSpeed ZeRO-1 shards the optimizer state, ZeRO-2 also the gradients, ZeRO-3 also the weights
  (gathered per block like FSDP); `-offload` moves the optimizer state (and ZeRO-3's weights) to the host.
Collective buffers beyond these (NCCL's own, the allocator's rounding of shards) are not predicted.
"""

from __future__ import annotations

import dataclasses

from .estimate import FP32, Estimate

PARTS = ("params", "grads", "state")
LOGITS_COPIES = 3  # vocab-wide tensors a pipeline's last stage holds at its peak: logits, log-probabilities, their gradient


@dataclasses.dataclass(frozen=True)
class Parts:
    params: int
    grads: int
    state: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.state


def split_blocks(full: Parts, blocks_bytes: int, degree: int) -> Parts:
    """Tensor parallelism: the blocks' weights, and their gradients and optimizer state in proportion, 1/degree
    per rank (the small replicated norms and biases counted as split: within a few per cent)."""
    if degree == 1 or not full.params:
        return full
    kept = 1 - (1 - 1 / degree) * min(1.0, blocks_bytes / full.params)
    return Parts(*(int(getattr(full, p) * kept) for p in PARTS))


def per_rank(single: Estimate, facts, world: int, on_gpu: bool) -> Estimate:
    """`single` (one rank's step planned as one process) with each part where the toggles put it (`facts`:
    scalekit.toggles.PlanFacts: which parts are split over the ranks, which live in host memory, whether
    blocks are gathered, whether gradients have DDP's buckets)."""
    block_bytes = single.largest_block_bytes
    full = Parts(single.params_bytes, single.grads_bytes, single.optimizer_state_bytes)
    activations = single.peak_bytes - full.total  # activations and temporaries of the rank's slice
    if facts.pipeline_stages > 1 and single.method.startswith("traced"):  # (the GPT's analytic plan splits them)
        # a stage keeps its own blocks' activations (of every micro-batch); the last also the head's: the logits,
        # the loss's fp32 log-probabilities and, in backward, their gradient, each rows × seq × vocab, not split
        head = min(LOGITS_COPIES * single.logits_bytes, activations)
        activations = (activations - head) // facts.pipeline_stages + head
    full = split_blocks(full, single.blocks_bytes, facts.tensor_parallel * facts.pipeline_stages)
    dp = world // facts.tensor_parallel // facts.pipeline_stages  # the ranks a sharding toggle splits over
    held = Parts(*(-(-getattr(full, p) // dp) if p in facts.sharded else getattr(full, p) for p in PARTS))
    away = facts.offloaded if on_gpu else frozenset()
    device = Parts(*(0 if p in away else getattr(held, p) for p in PARTS))
    host = Parts(*(getattr(held, p) if p in away else 0 for p in PARTS))
    extra = full.grads if facts.grad_buckets else 0
    if facts.gathers_blocks and facts.pipeline_stages > 1:
        # torch's pipeline schedules keep an fsdp stage's weights gathered and its gradients unsharded from its first
        # micro-batch's backward to its last, then reduce-scatter them once (a flat copy of them as its input): the
        # stage's whole weights, and its whole gradients twice
        extra += full.params * facts.wrapper_param_bytes // FP32 + 2 * full.grads
    elif facts.gathers_blocks:  # two gathered blocks (one prefetched), one block's gradients reduce-scattered
        extra += 2 * (block_bytes * facts.wrapper_param_bytes // FP32) + block_bytes
    if facts.keeps_gathered:  # every block gathered in forward and kept to backward; one block's grads unsharded
        extra += full.params * facts.wrapper_param_bytes // FP32 + block_bytes
    note = "; ".join(facts.rank_notes)
    if facts.offloaded and not on_gpu:
        note += "; on a CPU-only run the host is the device, so offloading saves nothing here"
    peak = device.total + activations + extra
    return dataclasses.replace(single, params_bytes=device.params, grads_bytes=device.grads,
                               optimizer_state_bytes=device.state, activations_bytes=peak - device.total,
                               peak_bytes=peak, host_bytes=host.total, world_size=world,
                               notes=[*single.notes, f"per rank of {world}: {note}"])
