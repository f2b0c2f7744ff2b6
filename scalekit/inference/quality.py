"""Quality beside speed: perplexity on held-out text, and agreement with the model as built.

Both read the same held-out windows (the shipped corpus' validation split: the last 10%, never trained
on): consecutive, non-overlapping windows from its start, each predicting its next tokens.
- perplexity: exp of the mean cross-entropy, in nats per token, of this configuration's model (quantized,
  under bf16 autocast and the grad mode the toggles chose), beside the reference's on the same windows;
- agreement: the share of positions where this configuration's greedy (argmax) token equals the
  reference's, the reference being the model as built: fp32 and unquantized.
The unwrapped model runs here (a compiled one would compile again for the windows' shape).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from ..data import load_tokens
from ..toggles import BuildContext
from .loop import logits_of, step_contexts


def heldout_windows(seq_len: int, n_windows: int, vocab_size: int) -> torch.Tensor:
    """(n, seq_len + 1) token windows from the start of the validation split."""
    tokens = np.asarray(load_tokens("val"))
    fit = (len(tokens) - 1) // seq_len
    n = min(n_windows, fit)
    data = torch.from_numpy(tokens[: n * seq_len + 1].astype(np.int64))
    windows = torch.stack([data[k * seq_len: k * seq_len + seq_len + 1] for k in range(n)])
    if int(windows.max()) >= vocab_size:
        raise ValueError(f"the held-out text has token ids up to {int(windows.max())}, beyond the model's vocab "
                         f"of {vocab_size}")
    return windows


@torch.no_grad()
def measure_quality(ctx: BuildContext, seq_len: int, n_windows: int, batch_size: int = 8) -> dict:
    """{'heldout_loss', 'perplexity', 'reference_loss', 'reference_perplexity', 'agreement'} on held-out text."""
    model, reference = ctx.base_model, ctx.reference_model
    windows = heldout_windows(seq_len, n_windows, ctx.gpt_config.vocab_size)
    loss_sum = ref_sum = agree = count = 0.0
    for first in range(0, len(windows), batch_size):
        batch = windows[first: first + batch_size].to(ctx.device)
        x, y = batch[:, :-1], batch[:, 1:]
        with step_contexts(ctx):  # this configuration: its grad mode and autocast
            logits = logits_of(model(x)).float()
        ref_logits = logits_of(reference(x)).float()  # the reference: fp32, no autocast
        loss_sum += F.cross_entropy(logits.transpose(1, 2), y, reduction="sum").item()
        ref_sum += F.cross_entropy(ref_logits.transpose(1, 2), y, reduction="sum").item()
        agree += (logits.argmax(-1) == ref_logits.argmax(-1)).sum().item()
        count += y.numel()
    loss, ref_loss = loss_sum / count, ref_sum / count
    return {"heldout_loss": loss, "perplexity": math.exp(loss), "reference_loss": ref_loss,
            "reference_perplexity": math.exp(ref_loss), "agreement": agree / count}


def same_prefix(tokens: torch.Tensor, reference: torch.Tensor) -> list[int]:
    """Per row, how many generated tokens equal the reference's before the first that differs."""
    n = min(tokens.shape[1], reference.shape[1])
    equal = (tokens[:, :n] == reference[:, :n]).cpu()
    return [int(row.cumprod(0).sum()) for row in equal.long()]
