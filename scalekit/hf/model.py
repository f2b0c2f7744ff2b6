"""Hugging Face causal LMs in scalekit: small models built offline from a config, and the adapter that lets
the toggles reach them the Transformers way.

    spec = scalekit.hf.causal_lm("gpt2", preset="tiny")     # or "llama", a transformers config, or a model
    scalekit.run(RunConfig(model=spec, toggles=["sdpa", "checkpointing"]))

`HFCausalLM` is a `ModelAdapter` (scalekit.models.family): every run builds the model fresh from it (from
the config, or as a copy of a model you passed), with the toggles' changes made the Transformers way:
`attn_implementation="sdpa"` (else "eager"), `resize_token_embeddings(..., pad_to_multiple_of=64)`,
`activation_checkpointing_enable(...)` (`gradient_checkpointing_enable` on older transformers).  Its default
batches are windows of the shipped corpus as `{"input_ids", "labels"}` (labels = input_ids: the model shifts
them, as Trainer users write it), and its default loss is the model's own `.loss`.

transformers is imported only inside these functions: `import scalekit` never loads it.  Nothing here goes
to the network: models are built from configs, or copied from the model you pass.
"""

from __future__ import annotations

import copy
import inspect
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from ..data import sample_tokens, shakespeare_batches, synthetic_batches
from ..errors import ConfigError, ToggleUnavailable
from ..models.chunked_loss import IGNORE_INDEX, head_loss
from ..models.family import ModelAdapter
from ..models.presets import CHAR_VOCAB, PRESETS
from ..optional import quiet_import
from . import generation

FAMILIES = ("gpt2", "llama")


def _transformers():
    try:
        transformers = quiet_import("transformers")
        # its model code imports torchao where installed, whose kernels cannot load on a CPU: said quietly
        quiet_import("transformers.modeling_utils")
    except ImportError as exc:  # scalekit itself does not need it
        raise ConfigError("Hugging Face models need transformers: pip install 'scalekit[hf]'") from exc
    return transformers


def is_hf_model(obj: Any) -> bool:
    """A transformers PreTrainedModel, checked without importing transformers (if it is not imported, obj is none)."""
    module = sys.modules.get("transformers.modeling_utils")
    return module is not None and isinstance(obj, module.PreTrainedModel)


def is_hf_config(obj: Any) -> bool:
    module = sys.modules.get("transformers.configuration_utils")
    return module is not None and isinstance(obj, module.PretrainedConfig)


def model_config(family: str = "gpt2", preset: str = "tiny", dropout: float | None = None, **overrides):
    """A transformers config of `family` ('gpt2' or 'llama') in the shape of a scalekit preset (layers, heads,
    width, context, vocabulary); `dropout` None keeps the family's default (GPT-2: 0.1; Llama: 0.0)."""
    if family not in FAMILIES:
        raise ConfigError(f"scalekit.hf.model_config: unknown family {family!r}; allowed: {', '.join(FAMILIES)}")
    if preset not in PRESETS:
        raise ConfigError(f"scalekit.hf.model_config: unknown preset {preset!r}; allowed: {', '.join(PRESETS)}")
    p = PRESETS[preset]
    special = min(50256, p.vocab_size - 1)  # GPT-2's <|endoftext|>, or the last id of a small vocabulary
    # loss_type named: transformers otherwise logs that it fell back to the causal-LM loss on the first forward
    common = dict(vocab_size=p.vocab_size, bos_token_id=special, eos_token_id=special, loss_type="ForCausalLM")
    t = _transformers()
    if family == "gpt2":
        kwargs = dict(common, n_layer=p.n_layer, n_head=p.n_head, n_embd=p.n_embd, n_positions=p.block_size)
        if dropout is not None:
            kwargs.update(resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout)
        return t.GPT2Config(**{**kwargs, **overrides})
    # Llama's SwiGLU MLP has three matrices: 8/3·d keeps its parameters near a 4·d two-matrix MLP's
    hidden = -(-8 * p.n_embd // 3 // 64) * 64
    kwargs = dict(common, num_hidden_layers=p.n_layer, num_attention_heads=p.n_head, num_key_value_heads=p.n_head,
                  hidden_size=p.n_embd, intermediate_size=hidden, max_position_embeddings=p.block_size)
    if dropout is not None:
        kwargs["attention_dropout"] = dropout
    return t.LlamaConfig(**{**kwargs, **overrides})


def causal_lm(source: Any = "gpt2", preset: str = "tiny", dropout: float | None = None, **overrides) -> HFCausalLM:
    """A Hugging Face causal LM for RunConfig(model=...): a family name ('gpt2', 'llama') built from
    model_config(family, preset, dropout, **overrides); or a transformers config, a PreTrainedModel, or a
    function returning one."""
    if isinstance(source, str):
        source = model_config(source, preset, dropout, **overrides)
    elif overrides or dropout is not None:
        raise ConfigError("scalekit.hf.causal_lm: dropout and config overrides go with a family name ('gpt2', "
                          "'llama'); change your own config or model directly")
    return HFCausalLM(source)


# config fields by which a family scales or caps its logits after the head (Gemma, Cohere, Granite)
LOGIT_SCALINGS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def chunked_loss_forward(model: torch.nn.Module, mode: int | str) -> None:
    """Make `model`'s forward, when given labels, run its base model for the final hidden state and compute the
    head and the loss chunk by chunk (scalekit.models.chunked_loss); without labels it is the model's own forward.
    The loss is transformers' causal-LM loss: labels shifted by one, -100 ignored, the mean over the rest."""
    own = model.forward

    def forward(input_ids=None, attention_mask=None, labels=None, **kwargs):
        if labels is None:
            return own(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        kwargs.pop("num_items_in_batch", None)
        hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)[0]  # (B, T, d)
        head = model.get_output_embeddings()  # read each call: resizing the vocabulary replaces it
        shifted = torch.nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
        loss = head_loss(hidden, head.weight, shifted, mode, bias=head.bias)
        return _transformers().modeling_outputs.CausalLMOutputWithPast(loss=loss)

    model.forward = forward


class HFCausalLM(ModelAdapter):
    """A Hugging Face causal LM, built fresh for each run with the toggles' changes made the Transformers way."""

    def __init__(self, source: Any):
        if not (is_hf_config(source) or is_hf_model(source) or callable(source)):
            raise ConfigError(f"scalekit.hf.HFCausalLM: source must be a transformers config, a PreTrainedModel or "
                              f"a function returning one, got {type(source).__name__}")
        self.source = source
        self.attn_implementation = "eager"  # the sdpa toggle switches it: off means explicit attention
        self.vocab_multiple: int | None = None  # set by nice_numbers: resize_token_embeddings' pad_to_multiple_of
        self.loss_chunks: int | str | None = None  # set by chunked_cross_entropy: the training loss's head in chunks
        self._config = None  # the model's transformers config, read once
        self._class: type | None = None  # the class a function source returns, read once

    def copy(self) -> HFCausalLM:
        fresh = HFCausalLM(self.source)
        fresh._config, fresh._class = self._config, self._class
        return fresh

    # -- what the model is -----------------------------------------------------------------------------
    @property
    def hf_config(self):
        """The transformers config of the model (a function source is built once on the meta device to read it)."""
        if self._config is None:
            if is_hf_config(self.source):
                self._config = self.source
            elif is_hf_model(self.source):
                self._config = self.source.config
            else:
                self._read_function_source()
        return self._config

    def _read_function_source(self) -> None:
        with torch.device("meta"):  # shapes only: no memory, no initialisation
            model = self.source()
        if not is_hf_model(model):
            raise ConfigError(f"RunConfig.model: the function returned a {type(model).__name__}, not a "
                              f"transformers PreTrainedModel")
        self._config, self._class = model.config, type(model)

    @property
    def model_class(self) -> type:
        if is_hf_model(self.source):
            return type(self.source)
        if not is_hf_config(self.source):
            if self._class is None:
                self._read_function_source()
            return self._class
        config = self.hf_config
        mapping = _transformers().AutoModelForCausalLM._model_mapping
        if type(config) not in mapping:
            raise ConfigError(f"RunConfig.model: {type(config).__name__} has no causal-LM model in transformers")
        return mapping[type(config)]

    @property
    def family(self) -> str:
        return f"Hugging Face {self.model_class.__name__}"

    @property
    def context_len(self) -> int | None:
        c = self.hf_config
        return getattr(c, "n_positions", None) or getattr(c, "max_position_embeddings", None)

    @property
    def vocab_size(self) -> int:
        return self.hf_config.vocab_size

    # -- building and feeding --------------------------------------------------------------------------
    def build(self) -> torch.nn.Module:
        model = self._make()
        if getattr(model, "loss_type", "") is None:  # a class name without "ForCausalLM" (GPT2LMHeadModel):
            model.loss_type = "ForCausalLM"  # the loss transformers falls back to anyway, without its log line
        if self.vocab_multiple:
            # the padded rows are never an input or a target; mean_resizing=False skips fitting a Gaussian to
            # the old rows (and its log line), which a model built from a config has no use for
            model.resize_token_embeddings(model.config.vocab_size, pad_to_multiple_of=self.vocab_multiple,
                                          mean_resizing=False)
        return model.train()

    def _make(self) -> torch.nn.Module:
        if is_hf_config(self.source):
            # a copy: the model keeps its config and changes it (resize_token_embeddings sets vocab_size), which
            # would leak into the next run built from the same config
            return _transformers().AutoModelForCausalLM.from_config(copy.deepcopy(self.source),
                                                                    attn_implementation=self.attn_implementation)
        model = copy.deepcopy(self.source) if isinstance(self.source, torch.nn.Module) else self.source()
        if not is_hf_model(model):
            raise ConfigError(f"RunConfig.model: the function returned a {type(model).__name__}, not a "
                              f"transformers PreTrainedModel")
        if model.config._attn_implementation != self.attn_implementation:
            model.set_attn_implementation(self.attn_implementation)
        return model

    def resolve(self, cfg: Any, preset: Any) -> dict:
        limit = self.context_len
        seq = cfg.seq_len or (min(preset.block_size, limit) if limit else preset.block_size)
        if limit and seq > limit:
            raise ConfigError(f"RunConfig.seq_len={seq} is longer than the model's context of {limit} positions "
                              f"({type(self.hf_config).__name__}); allowed: 1 to {limit}")
        if cfg.batch_fn is not None:
            return {"seq_len": seq, "data": "custom"}
        if cfg.dataset is not None:  # your tokenized dataset: tokens per sample are its input_ids' length
            return {"seq_len": seq, "data": "dataset", "tokens_per_sample": sample_tokens(cfg.dataset) or seq}
        data = "shakespeare" if cfg.data == "auto" else cfg.data
        if data == "shakespeare" and self.vocab_size < CHAR_VOCAB:
            raise ConfigError(f"RunConfig.data='shakespeare' needs a vocabulary of at least {CHAR_VOCAB} ids (the "
                              f"corpus's characters); the model has {self.vocab_size}: use data='synthetic'")
        return {"seq_len": seq, "data": data, "tokens_per_sample": seq}

    def batches(self, cfg: Any, device: torch.device, loader_kwargs: dict) -> Iterator:
        if cfg.data == "synthetic":
            pairs = synthetic_batches(self.vocab_size, cfg.seq_len, cfg.batch_size, cfg.seed, device)
        else:  # the shipped corpus: its characters are ids 0..64 of the model's vocabulary
            pairs = ((x.to(device, non_blocking=True), y) for x, y in
                     shakespeare_batches(cfg.seq_len, cfg.batch_size, cfg.seed, **loader_kwargs))
        return (self.batch_of(x, y) for x, y in pairs)

    def batch_of(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        # labels are the inputs: the model shifts them by one inside its loss, as in a Trainer script
        return {"input_ids": x, "labels": x}

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        if not isinstance(batch, Mapping):
            return model(input_ids=batch, labels=batch, use_cache=False).loss
        if "labels" not in batch:  # a tokenized dataset without labels: the inputs, padding left out of the loss
            labels = batch["input_ids"]
            if "attention_mask" in batch:
                labels = labels.masked_fill(batch["attention_mask"] == 0, -100)
            batch = {**batch, "labels": labels}
        return model(**batch, use_cache=False).loss

    # -- what the toggles ask of it --------------------------------------------------------------------
    def attention_support(self) -> tuple[bool, str]:
        if getattr(self.model_class, "_supports_sdpa", False):
            return True, ""
        return False, f"needs attn_implementation='sdpa', which {self.model_class.__name__} does not support"

    def set_attention(self, implementation: str) -> None:
        self.attn_implementation = implementation  # from_config(attn_implementation=...) / set_attn_implementation

    def vocab_padding_support(self) -> tuple[bool, str]:
        return True, ""

    @property
    def architecture(self) -> str | None:
        return getattr(self.hf_config, "model_type", None)

    def packed_sequences_support(self) -> tuple[bool, str]:
        takes = inspect.signature(self.model_class.forward).parameters
        if "position_ids" in takes and "attention_mask" in takes:
            return True, ""
        return False, f"needs position_ids and attention_mask in the forward of {self.model_class.__name__}, which has no such arguments"

    def pad_vocab(self, multiple: int) -> None:
        self.vocab_multiple = multiple

    def checkpoint(self, model: torch.nn.Module, every: int) -> str | None:
        if not model.supports_gradient_checkpointing:
            raise ToggleUnavailable(f"{type(model).__name__} does not support activation checkpointing")
        kwargs = {"use_reentrant": False}  # as scalekit checkpoints: works with kwargs, compile, any input grads
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None and "every_n_layers" in inspect.signature(enable).parameters:
            enable(activation_checkpointing_kwargs=kwargs, every_n_layers=every)
            return (f"checkpointing the Transformers way: activation_checkpointing_enable(every_n_layers={every}, "
                    f"use_reentrant=False)")
        if every != 1:
            return None  # this transformers checkpoints every layer or none: scalekit wraps every k-th block
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        return "checkpointing the Transformers way: gradient_checkpointing_enable(use_reentrant=False)"

    def loss_chunking_support(self) -> tuple[bool, str]:
        config = self.hf_config
        for name in LOGIT_SCALINGS:  # a head whose logits are scaled or capped: the chunked loss would skip that
            if getattr(config, name, None) not in (None, 1, 1.0):
                return False, (f"computes the loss of a plain linear head, and {self.model_class.__name__} changes its "
                               f"logits after the head ({name}={getattr(config, name)})")
        return True, ""

    def chunk_loss(self, mode: int | str) -> None:
        self.loss_chunks = mode  # build() makes the model's forward with labels compute the loss chunk by chunk

    def sequential_checkpoint_support(self) -> tuple[bool, str]:
        return False, (f"checkpoint_sequential passes one tensor from block to block, and the blocks of Hugging Face "
                       f"{self.model_class.__name__} also take masks and position embeddings: use checkpointing=1 "
                       f"(every block) or k")

    # -- generation (scalekit.hf.generation: transformers' caches, positions and masks) ----------------------
    def kv_cache_support(self, kind: str | None = None) -> tuple[bool, str]:
        return generation.kv_cache_support(self.model_class, kind, self.hf_config)

    def new_cache(self, model, kind, batch, max_len, device):
        return generation.new_cache(model, kind, max_len)

    def cache_bytes(self, cache) -> int:
        return generation.cache_bytes(cache)

    def rollback(self, cache, length: int) -> None:
        generation.rollback(cache, length)

    def pads_prompts(self) -> bool:
        return True

    def logits(self, model, ids, cache=None, input_pos=None, pad=None, last_only=False):
        return generation.logits(model, ids, cache, input_pos, pad, last_only)

    def __repr__(self) -> str:
        return f"HFCausalLM({self.model_class.__name__})"
