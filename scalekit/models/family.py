"""ModelAdapter: how scalekit builds, feeds and changes a family of models other than its own GPT.

The built-in GPT is changed through its `GPTConfig` (BuildContext.gpt_config).  A model of another family
(Hugging Face transformers: `scalekit.hf.HFCausalLM`) brings an adapter instead, which the build puts in
BuildContext.model_adapter.  The toggles that change a model's architecture (sdpa, nice_numbers) or
checkpoint its blocks call the methods below, so they learn what the model can do from the adapter and
never from a model's name.  A method left as it is here means the family cannot make that change; the
`*_support` methods say why, and the config, the CLI and the Lab show that reason.

A run builds from `copy()`: the toggles change the copy, never the adapter the user passed.
"""

from __future__ import annotations

import copy as copy_module
from collections.abc import Iterator
from typing import Any

import torch

from ..errors import ConfigError, ToggleUnavailable


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

    def checkpoint(self, model: torch.nn.Module, every: int) -> str | None:
        """Checkpoint every `every`-th block the family's own way, returning a note; None: scalekit wraps the
        blocks itself (the rule for any model)."""
        return None

    def sequential_checkpoint_support(self) -> tuple[bool, str]:
        """Whether torch's checkpoint_sequential can run the blocks (each takes and returns one tensor), and why not."""
        return True, ""
