"""Which kernel F.scaled_dot_product_attention ran: flash, memory-efficient, cuDNN or math.

SDPA picks its kernel per call from the inputs: their device, dtype, shapes and strides, the mask, dropout, and
the `sdpa_kernel` context a caller set.  An attention mask on an older GPU, fp32 inputs on CUDA, dropout on the
CPU or 3-D inputs send it to the math kernel, which writes the T×T scores to memory, silently: a row labelled
`sdpa` may measure no fused attention at all (transformers#30461's users could not tell that their mask kept
flash attention from running).  The watch asks torch which kernel it picks, per call, with the function SDPA
itself asks before it runs (`torch._fused_sdp_choice`: metadata only, well under a microsecond on a CPU), and
counts the answers.

It watches by replacing `torch.nn.functional.scaled_dot_product_attention` with a function that records the
choice and calls the original with the same arguments: the numbers are the original's.  Code that imported the
function by name before the watch began, and attention inside compiled graphs (the callers leave compiled runs
unwatched), is not seen; nothing seen is reported as nothing ({}), never as a guess.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

BACKENDS = {int(SDPBackend.MATH): "math", int(SDPBackend.FLASH_ATTENTION): "flash",
            int(SDPBackend.EFFICIENT_ATTENTION): "efficient", int(SDPBackend.CUDNN_ATTENTION): "cudnn",
            int(SDPBackend.OVERRIDEABLE): "overrideable", int(SDPBackend.ERROR): "none"}
FUSED = ("flash", "efficient", "cudnn")  # the kernels that never hold the T×T scores in memory


def _as_autocast(*tensors):
    """The tensors as SDPA sees them under autocast (which casts its floating inputs to the autocast dtype first):
    empty stand-ins of that dtype, same shape and strides, since the choice reads only metadata."""
    device_type = tensors[0].device.type
    if not torch.is_autocast_enabled(device_type):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t if t is None or not t.is_floating_point() or t.dtype == dtype else torch.empty_like(t, dtype=dtype)
                 for t in tensors)


def chosen_backend(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False) -> str:
    """The kernel SDPA runs for these arguments: "flash", "efficient", "cudnn", "math" (or "overrideable", a
    device's own kernel; "none": no kernel takes them, and SDPA raises)."""
    query, key, value, attn_mask = _as_autocast(query, key, value, attn_mask)
    index = torch._fused_sdp_choice(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                                    enable_gqa=enable_gqa)
    return BACKENDS.get(int(index), f"backend {index}")


class AttentionWatch:
    """Counts the kernel of each SDPA call made inside its measured steps (`calls`: backend name -> calls).
    `enabled=False` (a compiled model, whose attention runs inside graphs) watches nothing."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.calls: Counter[str] = Counter()

    @contextlib.contextmanager
    def step(self, measured: bool) -> Iterator[None]:
        """SDPA watched over this step when it is measured (warm-up steps are not counted)."""
        if not (self.enabled and measured):
            yield
            return
        original = F.scaled_dot_product_attention
        F.scaled_dot_product_attention = self._observed(original)
        try:
            yield
        finally:
            F.scaled_dot_product_attention = original

    def _observed(self, original):
        @functools.wraps(original)
        def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                         scale=None, enable_gqa=False):
            if not torch.compiler.is_compiling():
                self.calls[chosen_backend(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)] += 1
            return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                            scale=scale, enable_gqa=enable_gqa)

        return scaled_dot_product_attention


def backends_said(calls: dict[str, int]) -> str:
    """'flash ×12' or 'math ×8, flash ×4' (the most calls first); '' when no call was seen."""
    return ", ".join(f"{name} ×{n}" for name, n in sorted(calls.items(), key=lambda kv: (-kv[1], kv[0])))


def backends_note(calls: dict[str, int]) -> str:
    """The sentence a run's notes carry: which SDPA kernel ran, and what a call that fell back to math means."""
    if not calls:
        return ""
    said = f"SDPA ran {backends_said(calls)}"
    if calls.get("math"):
        said += " (math: the unfused kernel, the T×T scores written to memory)"
    return said
