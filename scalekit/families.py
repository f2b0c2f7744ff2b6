"""Which adapter a model gets: RunConfig.model as given (an adapter such as scalekit.hf.causal_lm(...)), a
Hugging Face model wrapped in scalekit.hf.HFCausalLM, or None for any other nn.Module (toggles then treat it
by the rules for any model)."""

from __future__ import annotations

from typing import Any

from .hf.model import HFCausalLM, is_hf_model
from .models.family import ModelAdapter


def model_adapter(model: Any) -> ModelAdapter | None:
    """The adapter for RunConfig.model, or None (a plain nn.Module, a function returning one, or no model)."""
    if isinstance(model, ModelAdapter):
        return model
    if is_hf_model(model):
        return HFCausalLM(model)
    return None
