"""Pipeline stages of a Hugging Face decoder laid out as Llama is, in plain PyTorch (no transformers import).

A Llama-style causal LM is `model.embed_tokens` → `model.layers[i]` (each taking the hidden state, the
causal mask, the positions and the rotary position embeddings) → `model.norm` → `lm_head`; transformers
declares that order in the config's `base_model_pp_plan`.  A stage owns a run of consecutive layers: the
first also the token embeddings, the last the final norm and the head.  Every stage computes the rotary
cos/sin and the causal mask for itself (the rotary embedding has no weights, only `inv_freq`): cheaper than
sending them between ranks, as torchtitan keeps its `freqs_cis` on every stage.  Only the hidden state
(batch × sequence × width) travels from stage to stage.

The families split here are those whose forward is exactly that chain (checked against the model's own
forward in tests/test_distributed_pipeline_hf.py); others change the embeddings or the logits inside the
model's forward (Gemma scales its embeddings, Gemma 2 caps its logits) or mix sliding and full layers, and
are refused by name.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from .chunked_loss import IGNORE_INDEX

# transformers' model_type of the families whose forward is the chain above (full causal attention, or one
# sliding window for every layer, Mistral's)
FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
PARTS = ("embed_tokens", "layers", "norm", "rotary_emb")


def decoder_refusal(model: nn.Module) -> str | None:
    """Why `model` cannot be split into decoder stages here (None: it can)."""
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    name = type(model).__name__
    if kind not in FAMILIES:
        return (f"pipeline_parallel: {name}{f' ({kind})' if kind else ''} is not split into stages here; scalekit "
                f"splits the built-in GPT's blocks and the layers of Hugging Face decoders of the families "
                f"{', '.join(FAMILIES)} (embeddings → layers → norm → head, as their base_model_pp_plan declares)")
    inner = getattr(model, "model", None)
    if inner is None or any(getattr(inner, p, None) is None for p in PARTS) or getattr(model, "lm_head", None) is None:
        return f"pipeline_parallel: {name} has no model.{{{', '.join(PARTS)}}} and lm_head to split into stages"
    kinds = set(getattr(config, "layer_types", None) or ())
    if kinds - {"full_attention"}:
        return (f"pipeline_parallel: {name} mixes attention kinds ({', '.join(sorted(kinds))}); its stages build "
                f"one causal mask for every layer")
    return None


def causal_mask(length: int, dtype: torch.dtype, device, window: int | None = None) -> torch.Tensor:
    """(1, 1, T, T) additive mask: 0 where query i may see key j (j ≤ i, and j > i - window), else the dtype's
    minimum (transformers' eager mask)."""
    i = torch.arange(length, device=device)
    seen = i[None, :] <= i[:, None]
    if window is not None:
        seen &= i[None, :] > i[:, None] - window
    mask = torch.zeros(length, length, dtype=dtype, device=device)
    return mask.masked_fill(~seen, torch.finfo(dtype).min)[None, None]


class DecoderStage(nn.Module):
    """Layers [start, stop) of a Llama-style decoder, the embeddings on the first stage, norm and head on the last."""

    def __init__(self, model: nn.Module, start: int, stop: int, first: bool, last: bool):
        super().__init__()
        inner, config = model.model, model.config
        self.first, self.last = first, last
        self.window = getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", True) else None
        self.embed_tokens = inner.embed_tokens if first else None
        self.rotary_emb = inner.rotary_emb  # no weights: every stage computes its own cos/sin
        self.layers = nn.ModuleList(inner.layers[start:stop])
        self.norm, self.lm_head = (inner.norm, model.lm_head) if last else (None, None)

    @property
    def blocks(self) -> nn.ModuleList:
        return self.layers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:  # token ids in
            x = self.embed_tokens(x)  # (B, T, C)
        positions = torch.arange(x.shape[1], device=x.device)[None]  # (1, T)
        rotary = self.rotary_emb(x, positions)  # (cos, sin), each (1, T, head_dim)
        mask = causal_mask(x.shape[1], x.dtype, x.device, self.window)
        for layer in self.layers:
            out = layer(x, attention_mask=mask, position_ids=positions, position_embeddings=rotary)
            x = out[0] if isinstance(out, tuple) else out  # (older transformers return a tuple)
        if not self.last:
            return x  # (B, T, C), sent to the next stage
        return self.lm_head(self.norm(x))  # (B, T, vocab)


def decoder_targets(batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids, the targets each position predicts) of a batch {"input_ids", "labels"}: the labels shifted by
    one, the last position ignored, as transformers' causal-LM loss does."""
    mask = batch.get("attention_mask")
    if mask is not None and not bool(mask.all()):
        raise ConfigError("pipeline_parallel: this batch has padding (attention_mask with zeros), which the stages "
                          "do not carry between ranks; pack the documents into full rows (sequence_packing is not "
                          "composed with it either) or give batches without padding")
    labels = batch.get("labels", batch["input_ids"])
    return batch["input_ids"], F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]


def summed_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The causal-LM cross-entropy summed over the positions that count (the caller divides by the batch's count)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction="sum")
