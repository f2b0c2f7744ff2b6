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


def counted_train_flops(step: Callable[[], torch.Tensor], params: list[torch.Tensor] | None = None) -> int:
    """FLOPs of one forward and backward of `step` (which returns the loss), counted by torch.

    Given the parameters that train, backward hands their gradients back to no one: nothing lands in `.grad`
    and no hook a wrapper keeps on them fires (DeepSpeed's ZeRO reduces each gradient from such a hook: the
    count's gradients, queued there, made its first real step reduce them twice).  torch refuses that to a
    model that checkpoints the reentrant way, and a backward that asks autograd which nodes it will run (torchao's
    QAT fake quantizers do): those are counted with a plain backward, as without `params` (a real error of the
    model's is raised again by it)."""
    if params:
        try:
            return _counted(step, lambda loss: torch.autograd.grad(loss, params, allow_unused=True))
        except RuntimeError:
            pass
    return _counted(step, lambda loss: loss.backward())


def _counted(step: Callable[[], torch.Tensor], backward: Callable[[torch.Tensor], object]) -> int:
    counter = FlopCounterMode(display=False)
    with counter:
        backward(step())
    return counter.get_total_flops()


def mfu(flops_per_step: float | None, step_s: float, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation: achieved FLOP/s over the device's dense peak, or None if either is unknown."""
    if not flops_per_step or not peak_tflops or not step_s or step_s != step_s:
        return None
    return flops_per_step / step_s / (peak_tflops * 1e12)


def mfu_dtype(compute_dtype: torch.dtype | None, tf32_matmuls: bool) -> str:
    """The dtype whose dense peak MFU is read against: what a run's matmuls compute in (its autocast dtype,
    else TF32 where the process lets float32 matmuls use it, else FP32)."""
    if compute_dtype is not None:
        return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(compute_dtype, "fp32")
    return "tf32" if tf32_matmuls else "fp32"
