"""Pipeline stages of a Hugging Face decoder, in the order transformers declares for it (no transformers import).

transformers gives a decoder's base model a `base_model_pp_plan`: its parts in the order its forward runs them
(Llama's `embed_tokens` → `layers` → `norm`; GPT-NeoX's `embed_in` → `emb_dropout` → `layers` →
`final_layer_norm`).  The part that is a list of modules is the decoder layers; the parts before it turn the
token ids into the first layer's input, the parts after it lead to the head (`get_output_embeddings()`).  A stage
owns a run of consecutive layers: the first stage also the parts before them, the last the parts after and the
head.  Only the hidden state (batch × sequence × width) travels from stage to stage.

What the model's own forward computes between those parts, each stage computes for itself, read from the config:
- the rotary cos/sin (the rotary embedding has no weights, only `inv_freq`): cheaper than sending them, as
  torchtitan keeps its `freqs_cis` on every stage;
- a causal mask per kind of layer: `config.layer_types` ('full_attention' or 'sliding_attention': Gemma 2
  alternates them), or, without it, one sliding window for every layer where the config sets one (Mistral's);
- the logits capped (`config.final_logit_softcapping`, Gemma 2's tanh cap), as the causal LM's forward does.
What lives inside a module (Gemma's scaled embeddings, GPT-NeoX's parallel residual) runs as it is.  Each family
split here is checked against the model's own forward (tests/distributed/test_distributed_parallel_families.py).

Refused, naming the model and what stops it: a model transformers declares no such order for (GPT-2, OPT and
Falcon in transformers 5.25), layers of another kind than full or sliding attention, a rotary embedding that
differs by layer kind (Gemma 3's), embeddings or logits scaled in the forward by a config field (Granite's, Cohere's).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from .chunked_loss import IGNORE_INDEX

# the families whose stages are checked against their own forward (the rest of the rule is the config's)
CHECKED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gpt_neox")
LAYER_KINDS = ("full_attention", "sliding_attention")
# config fields a family's forward multiplies by outside its modules (Granite's embeddings, Cohere's and Granite's
# logits), which the stages do not
FORWARD_SCALES = ("embedding_multiplier", "logit_scale", "logits_scaling")


def config_refusal(config, name: str) -> str | None:
    """Why a model of class `name` with transformers config `config` cannot be split into stages (None: it can)."""
    kind = getattr(config, "model_type", None)
    named = f"{name}{f' ({kind})' if kind else ''}"
    if not getattr(config, "base_model_pp_plan", None):
        return (f"pipeline_parallel: {named} is not split into stages here; scalekit splits the built-in GPT's "
                f"blocks and the layers of Hugging Face decoders whose config declares their order "
                f"(config.base_model_pp_plan; {', '.join(CHECKED_FAMILIES)} checked), and "
                f"{'transformers declares none for this model' if kind else 'this model has no such config'}")
    other = sorted(set(getattr(config, "layer_types", None) or ()) - set(LAYER_KINDS))
    if other:
        return (f"pipeline_parallel: {named} has layers of kind {', '.join(other)}; its stages build causal masks "
                f"for {' and '.join(LAYER_KINDS)} layers only")
    scaled = [field for field in FORWARD_SCALES if getattr(config, field, None) not in (None, 1, 1.0)]
    if scaled:
        return (f"pipeline_parallel: {named} scales its embeddings or logits in its forward ({', '.join(scaled)}), "
                f"which its stages do not do")
    return None


def decoder_refusal(model: nn.Module) -> str | None:
    """Why `model` cannot be split into decoder stages here (None: it can)."""
    name = type(model).__name__
    why = config_refusal(getattr(model, "config", None), name)
    if why is not None:
        return why
    try:
        parts = decoder_parts(model)
    except (AttributeError, ValueError) as error:
        return f"pipeline_parallel: {name}'s base_model_pp_plan does not lead to its parts ({error})"
    if parts.rotary is not None and "layer_type" in inspect.signature(parts.rotary.forward).parameters:
        return (f"pipeline_parallel: {name}'s rotary embedding differs by layer kind (its forward takes a "
                f"layer_type), which the stages do not compute")
    return None


@dataclass
class DecoderParts:
    """A Hugging Face decoder taken apart in its forward's order."""

    before: list[nn.Module]  # token ids → the first layer's input (the embeddings, their dropout)
    layers: nn.ModuleList
    after: list[nn.Module]  # the last layer's output → the head's input (the final norm)
    rotary: nn.Module | None  # the rotary position embedding (no weights), None where the model has none
    head: nn.Module
    embedding: nn.Module


def decoder_parts(model: nn.Module) -> DecoderParts:
    """`model`'s parts by its base model's base_model_pp_plan: the list of modules in it is the layers."""
    base = model.base_model
    names = list(model.config.base_model_pp_plan)
    lists = [n for n in names if isinstance(base.get_submodule(n), nn.ModuleList)]
    if len(lists) != 1:
        raise ValueError(f"{len(lists)} lists of layers among {', '.join(names)}")
    at = names.index(lists[0])
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError("no output embeddings (the head)")
    return DecoderParts([base.get_submodule(n) for n in names[:at]], base.get_submodule(names[at]),
                        [base.get_submodule(n) for n in names[at + 1:]], getattr(base, "rotary_emb", None), head,
                        model.get_input_embeddings())


def causal_mask(length: int, dtype: torch.dtype, device, window: int | None = None) -> torch.Tensor:
    """(1, 1, T, T) additive mask: 0 where query i may see key j (j ≤ i, and j > i - window), else the dtype's
    minimum (transformers' eager mask)."""
    i = torch.arange(length, device=device)
    seen = i[None, :] <= i[:, None]
    if window is not None:
        seen &= i[None, :] > i[:, None] - window
    mask = torch.zeros(length, length, dtype=dtype, device=device)
    return mask.masked_fill(~seen, torch.finfo(dtype).min)[None, None]


def layer_windows(config) -> list[int | None]:
    """Each layer's sliding window (None: full causal attention), as the model's forward builds its masks."""
    window = getattr(config, "sliding_window", None)
    kinds = getattr(config, "layer_types", None)
    if kinds is None:  # one kind for every layer: sliding where the config sets a window (and does not turn it off)
        every = window if getattr(config, "use_sliding_window", True) else None
        return [every] * config.num_hidden_layers
    return [window if kind == "sliding_attention" else None for kind in kinds]


class DecoderStage(nn.Module):
    """Layers [start, stop) of a Hugging Face decoder, what precedes them on the first stage, the norm and head on
    the last."""

    def __init__(self, model: nn.Module, start: int, stop: int, first: bool, last: bool):
        super().__init__()
        parts, config = decoder_parts(model), model.config
        self.first, self.last = first, last
        self.before = nn.ModuleList(parts.before if first else [])
        self.rotary_emb = parts.rotary  # no weights: every stage computes its own cos/sin
        self.layers = nn.ModuleList(parts.layers[start:stop])
        self.windows = layer_windows(config)[start:stop]
        self.after = nn.ModuleList(parts.after if last else [])
        self.lm_head = parts.head if last else None
        self.softcap = getattr(config, "final_logit_softcapping", None)

    @property
    def blocks(self) -> nn.ModuleList:
        return self.layers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for part in self.before:  # token ids in, on the first stage
            x = part(x)  # (B, T, C)
        positions = torch.arange(x.shape[1], device=x.device)[None]  # (1, T)
        rotary = self.rotary_emb(x, positions) if self.rotary_emb is not None else None  # (cos, sin)
        masks = {w: causal_mask(x.shape[1], x.dtype, x.device, w) for w in set(self.windows)}
        for layer, window in zip(self.layers, self.windows, strict=True):
            out = layer(x, attention_mask=masks[window], position_ids=positions, position_embeddings=rotary)
            x = out[0] if isinstance(out, tuple) else out  # (older transformers return a tuple)
        if not self.last:
            return x  # (B, T, C), sent to the next stage
        for part in self.after:
            x = part(x)
        logits = self.lm_head(x)  # (B, T, vocab)
        if self.softcap is not None:  # Gemma 2: the logits squashed into (-cap, cap), as its forward does
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


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
