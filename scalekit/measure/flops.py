"""FLOPs per training step and MFU.

For the built-in GPT: 6N FLOPs per token for the weights' matmuls (forward 2N, backward 4N) plus the
attention scores and their use, 12·L·d·T per token (PaLM paper, appendix B; nanoGPT's estimate_mfu).
N counts non-embedding parameters of the real vocabulary: padded vocab rows do work, but not model work.
For a user's model: torch's FlopCounterMode counts one forward and backward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode


def gpt_train_flops_per_token(n_params: int, n_layer: int, n_embd: int, seq_len: int) -> int:
    return 6 * n_params + 12 * n_layer * n_embd * seq_len


def counted_train_flops(step: Callable[[], torch.Tensor]) -> int:
    """FLOPs of one forward and backward of `step` (which returns the loss), counted by torch."""
    counter = FlopCounterMode(display=False)
    with counter:
        step().backward()
    return counter.get_total_flops()


def mfu(flops_per_step: float | None, step_s: float, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation: achieved FLOP/s over the device's dense peak, or None if either is unknown."""
    if not flops_per_step or not peak_tflops or not step_s or step_s != step_s:
        return None
    return flops_per_step / step_s / (peak_tflops * 1e12)
