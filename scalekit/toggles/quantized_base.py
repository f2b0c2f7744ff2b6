"""A quantized frozen base under the adapters: QLoRA's 4-bit NormalFloat (or fp4, or int8), bitsandbytes."""

from __future__ import annotations

import importlib.util
import warnings

import torch

from ..models.blocks import is_conv1d
from ..models.lora import adapter_targets
from ..models.quantization import as_linear, bnb_linear
from .base import BuildContext, Spelling, Toggle

MODES = ("nf4", "fp4", "int8")


class QuantizedBase(Toggle):
    name = "quantized_base"
    summary = "QLoRA: the frozen base's block linears in 4-bit NormalFloat (nf4), fp4 or int8 under LoRA/DoRA"
    cost = "weights dequantized in every forward and backward (slower); quantization error in the frozen base"
    helps_when = "the frozen weights are what does not fit: nf4 keeps ≈0.5 byte per weight instead of 4"
    group = "finetune"
    kind = "memory"
    phase = "wrap"
    choices = MODES
    excludes = {"fsdp": "FSDP shards floating-point parameters; bitsandbytes keeps 4-bit weights as packed uint8 with "
                        "separate quantization state, which FSDP2 cannot shard here (Answer.ai's FSDP + QLoRA stores "
                        "them in a float dtype, bnb_4bit_quant_storage, for this)"}
    requires = ("lora", "dora")
    requires_why = "a quantized base is frozen: it trains through adapters (QLoRA)"

    def available(self, hw) -> tuple[bool, str]:
        if importlib.util.find_spec("bitsandbytes") is None:
            return False, "quantized_base needs bitsandbytes, which is not installed (pip install bitsandbytes)"
        return True, ""

    def loaded_quantized(self, mode: str) -> dict:
        # as quantize_targets holds them: LLM.int8() without the outlier split, or 4-bit with a nested absmax
        if mode == "int8":
            return {"load_in_8bit": True, "llm_int8_threshold": 0.0}
        return {"load_in_4bit": True, "bnb_4bit_quant_type": mode, "bnb_4bit_use_double_quant": True}

    def apply(self, ctx: BuildContext, mode: str) -> None:
        # bitsandbytes' int8 matmul on a CPU warns at every call that it casts its inputs to fp16
        ctx.stack.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", message="MatMul8bitLt: inputs will be cast")
        if getattr(ctx.base_model, "hf_quantizer", None) is not None:  # a checkpoint folder, quantized as it loaded
            replaced = loaded_targets(ctx)
            ctx.notes.append(f"quantized_base: {replaced / 2**20:.2f} MiB of fp32 block weights loaded in {mode} "
                             f"from the checkpoint (transformers' BitsAndBytesConfig), never held in fp32")
        else:
            replaced = quantize_targets(ctx, mode)
            ctx.notes.append(f"quantized_base: {replaced / 2**20:.2f} MiB of fp32 block weights held in {mode}")

    def plan(self, facts, value) -> None:
        # bitsandbytes' kernels cannot run on fake tensors: the planner traces the base in fp32 and swaps its sizes
        facts.analytic = False
        facts.quantized_base = value

    # Framework spellings: Trainer arguments, accelerate, Lightning
    spelled_for_transformers_models = True

    def spelling(self, target, mode: str, cfg) -> Spelling:
        bnb = "load_in_8bit=True" if mode == "int8" else f'load_in_4bit=True, bnb_4bit_quant_type="{mode}"'
        # Transformers quantizes weights as it loads them: from your checkpoint, or (here) a copy of the model built
        return Spelling(imports=("from transformers import BitsAndBytesConfig",), model=(
            'model.save_pretrained("base_model")  # quantized_base: Transformers quantizes as it loads a checkpoint',
            f'model = AutoModelForCausalLM.from_pretrained("base_model", quantization_config=BitsAndBytesConfig({bnb}))'))


def quantize_targets(ctx: BuildContext, mode: str) -> int:
    """Swap every adapter target for its quantized layer; returns the fp32 bytes replaced."""
    model = ctx.base_model
    replaced = 0
    for name in adapter_targets(model, ctx.config.adapter_targets):
        old = model.get_submodule(name)
        if is_conv1d(old):  # GPT-2's Conv1D stores its weight (in, out): bitsandbytes takes the nn.Linear form
            old = as_linear(old)
        parent, _, attr = name.rpartition(".")
        # LLM.int8()'s outlier split off (threshold 0) for a base trained through: every column quantized
        setattr(model.get_submodule(parent) if parent else model, attr,
                bnb_linear(old, mode, ctx.compute_dtype or torch.float32, int8_threshold=0.0, for_training=True))
        replaced += old.weight.numel() * old.weight.element_size()
    # peft picks its bitsandbytes LoRA layers only for a model that says it is loaded quantized
    model.is_loaded_in_4bit = mode != "int8"
    model.is_loaded_in_8bit = mode == "int8"
    return replaced


def loaded_targets(ctx: BuildContext) -> int:
    """The adapter targets of a base transformers loaded quantized, made to compute as quantize_targets' layers do
    (in the run's compute dtype, the 4-bit layout backward needs); returns the fp32 bytes they stand for."""
    model = ctx.base_model
    replaced = 0
    for name in adapter_targets(model, ctx.config.adapter_targets):
        layer = model.get_submodule(name)
        if hasattr(layer, "compute_dtype"):  # 4-bit (see models.quantization.bnb_linear for the layout)
            layer.compute_dtype = ctx.compute_dtype or torch.float32
            layer.support_avx512bf16_for_cpu = False
        replaced += 4 * layer.in_features * layer.out_features
    return replaced


TOGGLE = QuantizedBase()
