"""Which adapter a model gets: RunConfig.model as given (an adapter such as scalekit.hf.causal_lm(...)), a
Hugging Face model wrapped in scalekit.hf.HFCausalLM, or None for any other nn.Module (toggles then treat it
by the rules for any model).  In generation every model has a family (`generation_family`): the built-in GPT
and models of your own by the convention they follow (scalekit.models.conventions), Hugging Face models
(a PreTrainedModel, a transformers config, or causal_lm(...)) through HFCausalLM."""

from __future__ import annotations

import sys
from typing import Any

import torch

from ..models.conventions import BUILTIN, ScalekitCacheLM, built_class, module_family
from ..models.family import ModelAdapter
from ..models.gpt import GPT
from .model import HFCausalLM, is_hf_config, is_hf_model


def model_adapter(model: Any) -> ModelAdapter | None:
    """The adapter for RunConfig.model, or None (a plain nn.Module, a function returning one, or no model)."""
    if isinstance(model, ModelAdapter):
        return model
    if is_hf_model(model) or builds_hf_model(model):  # a Transformers model, or a function returning one
        return HFCausalLM(model)
    return None


def builds_hf_model(source: Any) -> bool:
    """`source` is a function (or class) that returns a Transformers model, read by building it on the meta device
    (RunConfig(model=lambda: AutoModelForCausalLM.from_config(config)), a factory named by --model)."""
    if source is None or isinstance(source, (torch.nn.Module, str)) or not callable(source):
        return False
    cls = built_class(source)
    return cls is not None and is_hf_model_class(cls)


def toggle_family(model: Any) -> ModelAdapter:
    """The family the toggles' applies_to is asked about for RunConfig.model: its adapter, or, for a plain
    nn.Module, scalekit.models.conventions' description of it (what it can and cannot have changed)."""
    return model_adapter(model) or module_family(model)


def is_hf_source(model: Any) -> bool:
    """A Hugging Face model as generation takes it: a PreTrainedModel, a transformers config, or an HFCausalLM."""
    return isinstance(model, HFCausalLM) or is_hf_model(model) or is_hf_config(model)


def generation_family(model: Any) -> ModelAdapter:
    """How `model` (GenerateConfig.model: a name, a module, a function, a config, an adapter) generates."""
    if isinstance(model, ModelAdapter):
        return model
    if is_hf_model(model) or is_hf_config(model):
        return HFCausalLM(model)
    if model is None or isinstance(model, str):
        return BUILTIN
    if isinstance(model, GPT):  # a built-in GPT you made: its own context and vocabulary
        return ScalekitCacheLM(model)
    if builds_hf_model(model):
        return HFCausalLM(model)  # a function that builds a Hugging Face model
    return module_family(model)


def is_hf_model_class(cls: type) -> bool:
    module = sys.modules.get("transformers.modeling_utils")
    return module is not None and issubclass(cls, module.PreTrainedModel)
