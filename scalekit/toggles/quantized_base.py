"""A quantized frozen base under the adapters: QLoRA's 4-bit NormalFloat (or fp4, or int8), bitsandbytes."""

from __future__ import annotations

import importlib.util
import warnings

import torch

from ..errors import ToggleUnavailable
from ..models.blocks import is_conv1d, own_model_on_meta
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
    def spelling(self, target, mode: str, cfg) -> Spelling:
        own, why = own_model_on_meta(getattr(cfg, "model", None))
        if own is not None or why:
            return own_model_spelling(mode, own, why, cfg)
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


def own_model_spelling(mode: str, model: torch.nn.Module | None, why: str, cfg) -> Spelling:
    """quantized_base written for your own nn.Module (`model`, built on the meta device; None and `why` when it could
    not be): the layers scalekit quantizes (the adapters' targets) swapped for bitsandbytes layers holding their
    weights in `mode`, as quantize_targets swaps them, and the model marked quantized so that peft's LoRA takes them."""
    if model is None:
        return Spelling(missing=f"{why}, to find the layers to quantize: swap them for bitsandbytes layers by hand")
    try:
        names = adapter_targets(model, cfg.adapter_targets)
    except ToggleUnavailable as exc:
        return Spelling(missing=str(exc))
    if not all(isinstance(model.get_submodule(n), torch.nn.Linear) for n in names):
        return Spelling(missing="the layers to quantize are not all nn.Linear (transformers' Conv1D stores its weight "
                                "transposed): swap them for bitsandbytes layers by hand")
    if mode == "int8":  # LLM.int8() with its outlier split off (threshold 0): every column quantized
        layer = ("    new = bnb.nn.Linear8bitLt(old.in_features, old.out_features, bias=old.bias is not None, "
                 "has_fp16_weights=False, threshold=0.0, device=\"meta\")",
                 "    new.weight = bnb.nn.Int8Params(old.weight.data, requires_grad=False, has_fp16_weights=False)")
    else:
        layer = (f"    new = bnb.nn.Linear4bit(old.in_features, old.out_features, bias=old.bias is not None, "
                 f"quant_type={mode!r}, device=\"meta\")",  # computes in its input's dtype (fp32, bf16)
                 f"    new.weight = bnb.nn.Params4bit(old.weight.data, requires_grad=False, quant_type={mode!r}, "
                 f"blocksize=64, compress_statistics=True)")
    return Spelling(imports=("import bitsandbytes as bnb", "import torch"), model=(
        f"for name in {names!r}:  # quantized_base={mode}: the frozen base's layers in bitsandbytes' {mode}",
        "    old = model.get_submodule(name)", *layer,
        "    if old.bias is not None:",
        "        new.bias = torch.nn.Parameter(old.bias.data, requires_grad=False)",
        "    parent, _, attr = name.rpartition(\".\")",
        "    setattr(model.get_submodule(parent), attr, new.to(old.weight.device))  # quantized as it is moved",
        f"model.is_loaded_in_4bit, model.is_loaded_in_8bit = {mode != 'int8'}, {mode == 'int8'}  "
        f"# peft puts its bitsandbytes LoRA layers on them"))


TOGGLE = QuantizedBase()
