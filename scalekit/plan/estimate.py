"""The planner's answer for one configuration: `Estimate`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

FP32 = 4
INT64 = 8


@dataclass
class Estimate:
    """What `estimate` predicts for one training step of a config (bytes and FLOPs; per rank when the run
    is spread over ranks)."""

    label: str
    params_bytes: int  # weights and buffers
    grads_bytes: int
    optimizer_state_bytes: int
    activations_bytes: int  # the peak minus the other three, as RunResult measures it
    peak_bytes: int
    saved_activations_bytes: int | None  # what forward keeps for backward (one micro-batch), where known
    flops_per_step: float | None  # model FLOPs (6N per token plus attention), as the engine reports for MFU
    hardware_flops_per_step: float | None  # plus the forward that activation checkpointing recomputes
    n_params: int
    largest_block_bytes: int = 0  # fp32 bytes of the largest repeated block's weights (what FSDP gathers at once)
    method: str = ""  # how it was worked out
    world_size: int = 1  # ranks the figures are per (1: one process)
    host_bytes: int = 0  # training state kept in host memory by an offload toggle (not in peak_bytes on a GPU)
    blocks_bytes: int = 0  # fp32 bytes of all repeated blocks' weights (what tensor parallelism splits)
    logits_bytes: int = 0  # fp32 bytes of one step's logits (rows × seq × vocab), where traced: a pipeline's last stage's
    # of saved_activations_bytes, what tensor parallelism splits (attention's and the MLP's, between their column- and
    # row-split layers), where traced with tensor_parallel; 1/degree of it per rank
    split_activations_bytes: int = 0
    # where traced: the most bytes beyond the weights and optimizer state before the step's first gradient exists
    # (forward, and backward until then): a moment gradients split over ranks do not lower
    activations_before_grads_bytes: int = 0
    # a traced pipeline's planned peak on the ranks of each stage, first stage first (peak_bytes is the highest)
    stage_peaks_bytes: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def memory_breakdown(self) -> dict[str, int]:
        return {"params": self.params_bytes, "grads": self.grads_bytes,
                "optimizer_state": self.optimizer_state_bytes, "activations": self.activations_bytes,
                "peak": self.peak_bytes}

    def to_dict(self) -> dict:
        return asdict(self)
