"""ModelAdapter: how scalekit builds, feeds and changes a family of models other than its own GPT.

The built-in GPT is changed through its `GPTConfig` (BuildContext.gpt_config).  A model of another family
(Hugging Face transformers: `scalekit.hf.HFCausalLM`) brings an adapter instead, which the build puts in
BuildContext.model_adapter.  The toggles that change a model's architecture (sdpa, nice_numbers) or
checkpoint its blocks call the methods below, so they learn what the model can do from the adapter and
never from a model's name.  A method left as it is here means the family cannot make that change; the
`*_support` methods say why, and the config, the CLI and the Lab show that reason.

Generation asks a family four more things (the "generation" methods below): which KV caches it keeps
(`kv_cache_support`, `new_cache`, `cache_bytes`), how one forward gives logits with or without a cache
(`logits`: the built-in GPT's `forward(idx, cache=..., input_pos=...)`, gpt-fast's `forward(idx, input_pos)`
after `setup_caches`, transformers' `past_key_values` and `cache_position`), whether prompts of different
lengths can be left-padded, and its context and vocabulary.  The defaults are a plain language model:
forward(idx) gives logits (a tensor, a tuple that starts with them, or an object with `.logits`), and it
keeps no cache.  The two conventions a model of your own can follow to get one are in
scalekit.models.conventions.

A run builds from `copy()`: the toggles change the copy, never the adapter the user passed.
"""

from __future__ import annotations

import copy as copy_module
from collections.abc import Iterator
from typing import Any

import torch

from ..errors import ConfigError, ToggleUnavailable, toggle_why

# what a model of your own must do for scalekit to keep a KV cache for it: said wherever it cannot
CACHE_CONVENTIONS = ("forward(idx, cache=..., input_pos=...) as the built-in GPT takes them (scalekit makes and fills "
                     "the cache), or setup_caches(max_batch_size, max_seq_length) with forward(idx, input_pos) as "
                     "gpt-fast and Llama 3's reference code write it")


def logits_of(output) -> torch.Tensor:
    """The logits in a model's output: a tensor, the first item of a tuple (the built-in GPT returns
    (logits, loss)), or the `.logits` of an output object (transformers' ModelOutput)."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    raise ConfigError(f"the model's forward returned a {type(output).__name__}: generation needs logits (B, T, "
                      f"vocab) as a tensor, a tuple starting with them, or an object with .logits")


class ModelAdapter:
    """The interface; every method has a default that says "this family cannot"."""

    family: str = "your model"  # in messages: what the model is

    # -- building and feeding ------------------------------------------------------------------------
    def copy(self) -> ModelAdapter:
        """A fresh adapter for one build: what the toggles change (attention, vocabulary) starts unset."""
        return copy_module.copy(self)

    def build(self) -> torch.nn.Module:
        """The model, built fresh (a copy when the adapter wraps a model instance)."""
        raise NotImplementedError

    def __call__(self) -> torch.nn.Module:
        # an adapter is also a model factory, so RunConfig(model=adapter) passes as "a function returning one"
        return self.build()

    def resolve(self, cfg: Any, preset: Any) -> dict:
        """RunConfig fields made concrete for this model (seq_len, data, tokens_per_sample); {} keeps the defaults."""
        return {}

    def batches(self, cfg: Any, device: torch.device, loader_kwargs: dict) -> Iterator:
        """Endless batches for a run without a batch_fn."""
        raise ConfigError(f"RunConfig.batch_fn: {self.family} has no default batches; give batch_fn and loss_fn")

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        """The default loss_fn(model, batch)."""
        raise ConfigError(f"RunConfig.loss_fn: {self.family} has no default loss; give loss_fn")

    def batch_of(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        """A batch of this family's loss from windows of token ids and their next tokens (held-out evaluation)."""
        return x, y

    # -- what the toggles ask of it --------------------------------------------------------------------
    def attention_support(self) -> tuple[bool, str]:
        """Whether set_attention can switch this model to fused SDPA attention, and why not (said of the toggle)."""
        return False, f"needs an attention switch, which {self.family} does not have"

    def set_attention(self, implementation: str) -> None:
        raise ToggleUnavailable(self.attention_support()[1])

    def vocab_padding_support(self) -> tuple[bool, str]:
        """Whether pad_vocab can pad this model's vocabulary, and why not (said of the toggle)."""
        return False, f"needs a vocabulary to pad, which {self.family} does not have"

    def pad_vocab(self, multiple: int) -> None:
        """Pad the vocabulary of the model to be built to a multiple of `multiple`."""
        raise ToggleUnavailable(self.vocab_padding_support()[1])

    @property
    def architecture(self) -> str | None:
        """The model's architecture as its library names it (transformers' model_type: 'llama', 'gpt2'), or None."""
        return None

    def packed_sequences_support(self) -> tuple[bool, str]:
        """Whether the model's forward takes packed rows (per-document position_ids and a 4-D additive
        attention_mask, scalekit.data.packing), and why not (said of the toggle)."""
        return False, (f"needs a forward that takes per-document position_ids and a 4-D attention mask, which "
                       f"{self.family} does not say it takes (its loss_fn would see them and could not use them)")

    def checkpoint(self, model: torch.nn.Module, every: int) -> str | None:
        """Checkpoint every `every`-th block the family's own way, returning a note; None: scalekit wraps the
        blocks itself (the rule for any model)."""
        return None

    def sequential_checkpoint_support(self) -> tuple[bool, str]:
        """Whether torch's checkpoint_sequential can run the blocks (each takes and returns one tensor), and why not."""
        return True, ""

    def loss_chunking_support(self) -> tuple[bool, str]:
        """Whether chunk_loss can compute this family's training loss head chunk by chunk, and why not (said of the
        toggle): it needs the model's final hidden state and its output head, apart from each other."""
        return False, (f"needs the model's final hidden state and output head apart, which {self.family} does not "
                       f"expose (its loss is computed from whole logits)")

    def chunk_loss(self, mode: int | str) -> None:
        """Make the model to be built compute its training loss's head and loss in `mode` chunks of tokens (or
        through Liger's fused kernel: 'liger'), never the whole logits (scalekit.models.chunked_loss)."""
        raise ToggleUnavailable(self.loss_chunking_support()[1])

    # -- generation ----------------------------------------------------------------------------------------
    @property
    def context_len(self) -> int | None:
        """Positions the model holds (None: unknown, its limits are its own)."""
        return None

    @property
    def vocab_size(self) -> int | None:
        """Token ids the model reads (None: unknown)."""
        return None

    def kv_cache_support(self, kind: str | None = None) -> tuple[bool, str]:
        """Whether generation can keep a KV cache of `kind` (models.kv_cache.CACHE_KINDS; None: any) for this family,
        and why not (said of the toggle)."""
        return False, f"needs a KV cache convention, and {self.family} follows neither of the two: {CACHE_CONVENTIONS}"

    def prepare(self, model: torch.nn.Module, batch: int, max_len: int) -> None:
        """Called before each generation of `batch` rows and at most `max_len` positions (gpt-fast's models
        allocate their caches here)."""

    def new_cache(self, model: torch.nn.Module, kind: str, batch: int, max_len: int, device) -> Any:
        """A fresh KV cache of `kind` for one generation."""
        raise ToggleUnavailable(toggle_why("kv_cache", self.kv_cache_support(kind)[1]))

    def cache_bytes(self, cache: Any) -> int:
        """Bytes the cache holds now."""
        return cache.nbytes()

    def rollback(self, cache: Any, length: int) -> None:
        """Cut the cache back to its first `length` positions (speculative decoding's rejected draft tokens);
        NotImplementedError where the family's cache cannot be cut back."""
        cache.crop(length)

    def pads_prompts(self) -> bool:
        """Whether prompts of different lengths can be left-padded (the model is told where each row starts)."""
        return False

    def logits(self, model: torch.nn.Module, ids: torch.Tensor, cache: Any = None,
               input_pos: torch.Tensor | None = None, pad: torch.Tensor | None = None,
               last_only: bool = False) -> torch.Tensor:
        """(B, T, vocab) logits of `ids`: without a cache the whole sequence so far; with one, the new tokens at
        the absolute positions `input_pos` (T,).  `pad`: each row's left padding (None: none).  last_only: only
        the last position's logits are read (a family may then compute only those)."""
        return logits_of(model(ids))
