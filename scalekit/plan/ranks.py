"""Per-rank figures for a run spread over ranks (the toggles that need a process group).

The planner first plans one rank's step as a single process: the rank's slice of the batch, no
distributed toggle.  Then it moves the parts the toggles say they move (their `plan` sets PlanFacts'
`sharded`, `offloaded`, `gathers_blocks`, `keeps_gathered`, `grad_buckets` and `pipeline_in_flight`), as each
strategy does:
- DDP keeps everything on every rank, plus its gradient buckets: a flat copy of every gradient
  (`gradient_as_bucket_view=False`, DDP's default).
- FSDP2 keeps 1/W of the weights, gradients and optimizer state, and gathers one block's full weights at
  a time (two while the next is prefetched), reduce-scattering one block's gradients; CPU offload moves
  the shards to host memory.
- scalekit's zero: ZeRO-1 (ZeroRedundancyOptimizer under DDP) shards the optimizer state and keeps DDP's
  buckets; ZeRO-2 (FSDP2 without resharding after forward) holds 1/W of everything at rest, and the full
  weights from forward to backward.
- tensor_parallel splits each block's weights (and their gradients and optimizer state) over its degree; the
  ranks of a group share one batch, so the rank is planned with batch / (ranks / degree).  Of the activations,
  what its split layers keep is 1/degree per rank: in a traced plan, the tensors made in each block from a
  column-split layer's output to the row-split layer's input (attention's heads, the MLP's hidden units), counted
  apart during the trace (`Estimate.split_activations_bytes`); the norms, the residual stream, the embeddings and
  the head are whole (with sequence-parallel norms, theirs too: an upper bound).  The built-in GPT's analytic plan
  splits them in its per-layer inventory.  With fsdp too (2-D), fsdp shards over the data-parallel ranks:
  ranks / degree.
- pipeline_parallel keeps 1/stages of the blocks per rank (the embeddings and head counted on every rank), and
  every stage sees the whole batch.  A traced model's (a Hugging Face decoder's) stage is planned at the moments
  its memory peaks, as a backward begins, from the micro-batches its schedule keeps in flight there
  (`PlanFacts.pipeline_in_flight`: GPipe all of them; 1F1B min(stages - s, micro-batches) on stage s, the first
  stage the most; interleaved its own count): what one forward keeps for backward
  (`Estimate.saved_activations_bytes`, the whole slice through the whole model) less the head's, divided by the
  stages, for each micro-batch's share it holds.  The step's first backward finds no gradient yet; a later one
  finds the stage's gradients as well, and fewer micro-batches.  The last stage also holds the head's: one fp32
  log-probability tensor (rows × seq × vocab per micro-batch) for each micro-batch its head holds, and at the
  head's backward that micro-batch's gradient of them and of the logits (LOGITS_COPIES in all).  The plan is the
  rank whose peak is the highest (the notes say which).  The built-in GPT's analytic plan is one figure, its
  fullest stage's: a stage's blocks with the most micro-batches any stage holds as a backward begins, and its head
  with all of them (at or above the last stage's 1F1B head).  With `stages=S` and fsdp,
  S-stage pipelines run side by side and fsdp shards over them: ranks / S; torch's schedules keep each stage's
  weights gathered and its gradients unsharded from the first micro-batch's backward to the last, then
  reduce-scatter them once (a flat copy of them as its input): the stage's whole weights at every moment, its
  whole gradients at the later backwards, and twice at the end.  With tensor_parallel too (3-D, one (pipeline,
  data, tensor) mesh), a stage's blocks are split over the degree.
- DeepSpeed ZeRO-1 shards the optimizer state, ZeRO-2 also the gradients, ZeRO-3 also the weights
  (gathered per block like FSDP); `-offload` moves the optimizer state (and ZeRO-3's weights) to the host.
Collective buffers beyond these (NCCL's own, the allocator's rounding of shards, a pipeline's receive buffers) and
the backward's own temporaries in a pipeline's blocks are not predicted.
"""

from __future__ import annotations

import dataclasses

from .estimate import FP32, Estimate

PARTS = ("params", "grads", "state")
# vocab-wide fp32 tensors of one micro-batch a pipeline's last stage holds at its head's backward: the loss's
# log-probabilities (saved by forward), their gradient and the logits' gradient
LOGITS_COPIES = 3


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


def tensor_parallel_saving(single: Estimate, degree: int) -> int:
    """The bytes of a traced step's activations a rank of a tensor-parallel group does not hold: all but 1/degree
    of what the split layers keep."""
    return int(single.split_activations_bytes * (1 - 1 / degree))


def held_bytes(blocks: int, logits: int, micro_batches: int, held: float, head: int) -> int:
    """What a pipeline stage's activations come to as a backward begins: `held` of the `micro_batches` of its blocks'
    (`blocks`: of all of them) and, on the last stage, the log-probabilities of the `head` micro-batches its head
    holds, with that backward's gradients of them and of the logits (`logits`: one copy, of all of them)."""
    return int(blocks * held / micro_batches) + (logits * (head + LOGITS_COPIES - 1) // micro_batches if head else 0)


def stage_peaks(single: Estimate, facts, device: Parts, stage: Parts) -> list[int]:
    """The peak of each rank of a pipeline (first stage first) for a traced model: `device` is what the rank holds
    at rest, `stage` its stage's whole weights and gradients (what fsdp gathers and leaves unsharded)."""
    flight = facts.pipeline_in_flight
    stages, m = facts.pipeline_stages, flight.micro_batches
    saved = single.saved_activations_bytes - tensor_parallel_saving(single, facts.tensor_parallel)
    logits = single.logits_bytes
    blocks = max(0, saved - logits) // stages  # a stage's share of forward's activations, every micro-batch's
    fsdp = facts.gathers_blocks  # its stage gathered whole and its gradients unsharded through the backwards
    gathered = stage.params * facts.wrapper_param_bytes // FP32 if fsdp else 0
    unsharded = stage.grads if fsdp else 0
    peaks = []
    for rank, (first, later) in enumerate(zip(flight.first, flight.later, strict=True)):
        last = rank == stages - 1
        moments = [held_bytes(blocks, logits, m, first, flight.head_first if last else 0)]  # no gradient yet
        if later:  # the stage's gradients exist
            moments.append(device.grads + unsharded + held_bytes(blocks, logits, m, later,
                                                                 flight.head_later if last else 0))
        moments.append(device.grads + 2 * unsharded)  # the last backward done: its gradients reduce-scattered
        peaks.append(device.params + device.state + gathered + max(moments))
    return peaks


def per_rank(single: Estimate, facts, world: int, on_gpu: bool) -> Estimate:
    """`single` (one rank's step planned as one process) with each part where the toggles put it (`facts`:
    scalekit.toggles.PlanFacts: which parts are split over the ranks, which live in host memory, whether
    blocks are gathered, whether gradients have DDP's buckets, what a pipeline's stages hold)."""
    block_bytes = single.largest_block_bytes
    full = Parts(single.params_bytes, single.grads_bytes, single.optimizer_state_bytes)
    traced = single.method.startswith("traced")  # (the GPT's analytic plan splits its stages and layers itself)
    saving = tensor_parallel_saving(single, facts.tensor_parallel) if traced else 0  # (traced: split layers counted)
    activations = single.peak_bytes - full.total - saving  # activations and temporaries of the rank's slice
    full = split_blocks(full, single.blocks_bytes, facts.tensor_parallel * facts.pipeline_stages)
    dp = world // facts.tensor_parallel // facts.pipeline_stages  # the ranks a sharding toggle splits over
    held = Parts(*(-(-getattr(full, p) // dp) if p in facts.sharded else getattr(full, p) for p in PARTS))
    away = facts.offloaded if on_gpu else frozenset()
    device = Parts(*(0 if p in away else getattr(held, p) for p in PARTS))
    host = Parts(*(getattr(held, p) if p in away else 0 for p in PARTS))
    note = "; ".join(facts.rank_notes)
    # (a pipeline is not composed with DDP's buckets nor ZeRO-2's gathered blocks: the toggles exclude them)
    peaks = stage_peaks(single, facts, device, full) if facts.pipeline_stages > 1 and traced else []
    if peaks:
        peak = max(peaks)
        note += (f"; the plan is the ranks of the pipeline's stage {peaks.index(peak)} (stages 0-{len(peaks) - 1}: "
                 f"{', '.join(f'{p / 2**20:.2f}' for p in peaks)} MiB)")
    else:
        extra = full.grads if facts.grad_buckets else 0
        if facts.gathers_blocks and facts.pipeline_stages > 1:
            # torch's pipeline schedules keep an fsdp stage's weights gathered and its gradients unsharded from its
            # first micro-batch's backward to its last, then reduce-scatter them once (a flat copy of them as its
            # input): the stage's whole weights, and its whole gradients twice
            extra += full.params * facts.wrapper_param_bytes // FP32 + 2 * full.grads
        elif facts.gathers_blocks:  # two gathered blocks (one prefetched), one block's gradients reduce-scattered
            extra += 2 * (block_bytes * facts.wrapper_param_bytes // FP32) + block_bytes
        if facts.keeps_gathered:  # every block gathered in forward and kept to backward; one block's grads unsharded
            extra += full.params * facts.wrapper_param_bytes // FP32 + block_bytes
        # at the single process's peak every gradient is taken to exist; before its first one (a traced step's
        # moment), the rank's gradients are not there to be smaller
        early = single.activations_before_grads_bytes - saving if traced else 0
        peak = max(device.total + activations, device.params + device.state + early) + extra
    if facts.offloaded and not on_gpu:
        note += "; on a CPU-only run the host is the device, so offloading saves nothing here"
    return dataclasses.replace(single, params_bytes=device.params, grads_bytes=device.grads,
                               optimizer_state_bytes=device.state, activations_bytes=peak - device.total,
                               peak_bytes=peak, host_bytes=host.total, world_size=world, stage_peaks_bytes=peaks,
                               notes=[*single.notes, f"per rank of {world}: {note}"])
