"""Quantize: store the linear layers' weights in 8, 4 or 2 bits (torchao, bitsandbytes, HQQ, torch.ao)."""

from __future__ import annotations

from ..errors import ConfigError, ToggleUnavailable
from ..models import quantization
from ..models.quantization import INT4_METHODS, INT8_METHODS, METHODS, method_available, quantize_model
from .base import BuildContext, Toggle, Tune


class Quantize(Toggle):
    name = "quantize"
    summary = "weights in 8/4/2 bits: torchao int8/int4, bitsandbytes int8/nf4/fp4, HQQ, torch dynamic int8"
    cost = "rounding error in every quantized matmul (perplexity rises, more at fewer bits); dequantizing costs time"
    helps_when = "decoding is memory-bound (large models, batch 1): fewer weight bytes to read per token"
    group = "inference"
    kind = "both"
    phase = "wrap"  # a module swap on the built model, before compile wraps it
    loops = ("generate",)
    choices = tuple(METHODS)  # the methods (models/quantization.py): each library imported only when chosen
    changes_weights = True
    # the first int8 and the first 4-bit method that run here, as the inference ladder picks them
    tuning = (Tune(INT8_METHODS, rank=70, loop="generate", label="int8 weights"),
              Tune(INT4_METHODS, rank=80, loop="generate", label="4-bit weights"))
    plan_note = 'quantize applies to generation only (scalekit.generate): it never runs in a training step'

    def available(self, hw) -> tuple[bool, str]:
        reasons = [method_available(m, hw.device_type) for m in METHODS]
        if any(ok for ok, _ in reasons):
            return True, ""
        return False, "no quantization method can run here: " + "; ".join(why for _, why in reasons)

    def choice_available(self, hw, value) -> tuple[bool, str]:
        return method_available(value, hw.device_type)

    def applies_to(self, adapter) -> tuple[bool, str]:
        # a model of your own with no linear layer would come out unchanged: refused before the run, not run as a
        # row that compares the model with itself (a Hugging Face model or one not buildable on meta: at the build)
        model = quantization.own_model_to_inspect(adapter)
        if model is not None and not quantization.quantizable_layers(model):
            return False, quantization.no_linear_why(model)
        return True, ""

    def apply(self, ctx: BuildContext, value: str) -> None:
        ok, why = self.choice_available(ctx.hw, value)
        if not ok:
            raise ToggleUnavailable(f"toggle 'quantize' is unavailable on this machine: {why}")
        if value == "torch-dynamic-int8" and ctx.compute_dtype is not None:
            raise ConfigError("toggles: quantize='torch-dynamic-int8' takes fp32 activations only (torch's dynamic "
                              "int8 Linear); it cannot run under bf16 autocast: pick a torchao, bnb or hqq method")
        compute_dtype = ctx.compute_dtype or next(ctx.base_model.parameters()).dtype
        if value.startswith("torchao-"):
            keep_inductor_config(ctx.stack)
        n = quantize_model(ctx.base_model, value, compute_dtype, ctx.device.type)
        ctx.model = ctx.base_model
        ctx.notes.append(f"quantize={value}: {n} linear layers of the blocks ({METHODS[value][1]}); "
                         f"embeddings and the tied output head kept in {str(compute_dtype).removeprefix('torch.')}")


def keep_inductor_config(stack) -> None:
    """torchao's quantize_ sets the inductor flags it recommends for quantized models (coordinate-descent tuning,
    int_mm fusion), process-wide and for good: they hold for this run, as for any torchao user, and the whole
    inductor configuration is put back when the run ends, so no later run in the process inherits them."""
    import torch._inductor.config as inductor_config  # torchao imports it anyway

    stack.callback(inductor_config.load_config, inductor_config.get_config_copy())


TOGGLE = Quantize()
