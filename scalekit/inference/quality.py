"""Quality beside speed: perplexity on held-out text, and agreement with the model as built.

Both read the same held-out windows (token ids you give, GenerateConfig.quality_tokens, or else the shipped
corpus' validation split: the last 10%, never trained on): consecutive, non-overlapping windows from its
start, each predicting its next tokens.  Any model that returns logits is measured: its family
(ctx.model_adapter) says where the logits are.
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
from ..errors import ConfigError
from ..models.kv_cache import INT8_KINDS
from ..toggles import BuildContext
from .loop import family_of, positions_shortfall, prepare_caches, probe_positions, step_contexts


def heldout_windows(seq_len: int, n_windows: int, tokens=None) -> torch.Tensor:
    """(n, seq_len + 1) token windows from the start of `tokens` (None: the shipped corpus' validation split);
    a sequence shorter than one window gives one window of all of it."""
    tokens = np.asarray(load_tokens("val") if tokens is None else
                        (tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)))
    seq_len = min(seq_len, len(tokens) - 1)
    n = min(n_windows, (len(tokens) - 1) // seq_len)
    data = torch.from_numpy(tokens[: n * seq_len + 1].astype(np.int64))
    return torch.stack([data[k * seq_len: k * seq_len + seq_len + 1] for k in range(n)])


def unmeasurable(vocab_size: int | None, tokens) -> str | None:
    """Why quality cannot be measured on the shipped corpus for this model (None: it can)."""
    if tokens is None and vocab_size is not None and vocab_size < CORPUS_VOCAB:
        return (f"quality not measured: the shipped corpus has {CORPUS_VOCAB} character ids and the model reads "
                f"{vocab_size}; give held-out token ids as GenerateConfig.quality_tokens")
    return None


CORPUS_VOCAB = 65  # the shipped corpus' characters


@torch.no_grad()
def measure_quality(ctx: BuildContext, seq_len: int, n_windows: int, tokens=None, batch_size: int = 8) -> dict:
    """{'heldout_loss', 'perplexity', 'reference_loss', 'reference_perplexity', 'agreement'} on held-out tokens."""
    model, reference = ctx.base_model, ctx.reference_model
    family = family_of(ctx)
    windows = heldout_windows(seq_len, n_windows, tokens)
    loss_sum = ref_sum = agree = count = 0.0
    for first in range(0, len(windows), batch_size):
        batch = windows[first: first + batch_size].to(ctx.device)
        x, y = batch[:, :-1], batch[:, 1:]
        prepare_caches(ctx, family, model, x.shape[0], x.shape[1])  # (a model keeping its own cache allocates it)
        with step_contexts(ctx):  # this configuration: its grad mode, autocast and a lossy cache's rounding
            logits = _config_logits(ctx, family, model, x).float()
        family.prepare(reference, x.shape[0], x.shape[1])  # (the same module, maybe: its cache in fp32 again)
        ref_logits = family.logits(reference, x).float()  # the reference: fp32, no autocast
        why = positions_shortfall(reference, ref_logits, x.shape[1]) or positions_shortfall(model, logits, x.shape[1])
        if why:
            raise ConfigError(every_position_needed(why))
        if logits.size(-1) <= int(y.max()):
            raise ConfigError(f"GenerateConfig.quality_tokens: the held-out tokens hold id {int(y.max())}, and the "
                              f"model's logits cover {logits.size(-1)} ids; give held-out ids the model reads")
        loss_sum += F.cross_entropy(logits.transpose(1, 2), y, reduction="sum").item()
        ref_sum += F.cross_entropy(ref_logits.transpose(1, 2), y, reduction="sum").item()
        agree += (logits.argmax(-1) == ref_logits.argmax(-1)).sum().item()
        count += y.numel()
    loss, ref_loss = loss_sum / count, ref_sum / count
    return {"heldout_loss": loss, "perplexity": math.exp(loss), "reference_loss": ref_loss,
            "reference_perplexity": math.exp(ref_loss), "agreement": agree / count}


def every_position_needed(shortfall: str) -> str:
    """Why perplexity cannot be measured for a model whose forward returns fewer positions than it is given."""
    return (f"quality not measured (perplexity, agreement): {shortfall}; perplexity needs every position: pass "
            f"quality=False, or give the model a forward that returns all positions")


def heldout_unmeasurable(ctx: BuildContext) -> str | None:
    """Why held-out perplexity and agreement cannot be measured for this build's model (None: they can), found
    before measuring from one short forward of the reference (the model as built)."""
    shortfall = probe_positions(family_of(ctx), ctx.reference_model, ctx.device)
    return every_position_needed(shortfall) if shortfall else None


def lossy_cache(ctx: BuildContext) -> bool:
    """Whether the KV cache rounds what it keeps (int8): then quality reads the windows through it."""
    return ctx.kv_cache in INT8_KINDS


def _config_logits(ctx: BuildContext, family, model, x: torch.Tensor) -> torch.Tensor:
    """This configuration's logits of the windows x: through a fresh cache of its kind when that cache rounds
    keys and values (every position then attends to the rounded ones, as in decoding), else one plain forward."""
    if not lossy_cache(ctx):
        return family.logits(model, x)
    cache = family.new_cache(model, ctx.kv_cache, x.shape[0], x.shape[1], x.device)
    return family.logits(model, x, cache, torch.arange(x.shape[1], device=x.device))


def same_prefix(tokens: torch.Tensor, reference: torch.Tensor) -> list[int]:
    """Per row, how many generated tokens equal the reference's before the first that differs."""
    n = min(tokens.shape[1], reference.shape[1])
    equal = (tokens[:, :n] == reference[:, :n]).cpu()
    return [int(row.cumprod(0).sum()) for row in equal.long()]
