"""Quantization-aware training with torchao: fake-quantized linears in training, real quantized ones after.

`prepare` swaps the target linears (models.quantization.target_linears: those of the repeated blocks) for
torchao's FakeQuantizedLinear through `quantize_(model, QATConfig(base, step="prepare"))`: the forward rounds
weights (and, for the dynamic-activation mode, activations) as the quantized model will, while the gradients
flow straight through the rounding, so training learns weights that survive it.  `convert` then swaps them
back and quantizes for real with the same base config (`step="convert"`); `quantize` is post-training
quantization of the same layers with that config, the baseline QAT is measured against.
"""

from __future__ import annotations

import warnings

import torch

from ..optional import quiet_import, silence_known_warnings
from .quantization import plain_linears, target_linears

GROUP = 32  # input features per int4 scale
# mode -> (what it does, a function of torchao.quantization giving the base config)
MODES = {
    "int4-weight": ("int4 weights in groups of 32 input features with a scale each (IntxWeightOnlyConfig); "
                    "activations stay in float",
                    lambda q: q.IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=q.PerGroup(GROUP))),
    "int8-dynamic-int4-weight": ("int8 activations quantized per token at run time, int4 weights in groups of 32 "
                                 "(Int8DynamicActivationIntxWeightConfig: the ExecuTorch / XNNPACK scheme)",
                                 lambda q: q.Int8DynamicActivationIntxWeightConfig(
                                     weight_dtype=torch.int4, weight_granularity=q.PerGroup(GROUP))),
}


def target_names(model: torch.nn.Module) -> set[str]:
    """Qualified names of the linears QAT acts on: the blocks' linear layers whose inputs split into groups."""
    names = {id(m): n for n, m in model.named_modules()}
    return {names[id(linear)] for _, _, linear in target_linears(model) if linear.in_features % GROUP == 0}


def _quantize(model: torch.nn.Module, config, names: set[str], device_type: str) -> None:
    q = quiet_import("torchao.quantization", device_type)
    silence_known_warnings("torchao")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q.quantize_(model, config(q), filter_fn=lambda module, fqn: fqn in names)


def prepare(model: torch.nn.Module, mode: str, device_type: str = "cpu") -> int:
    """Fake-quantize the target linears in place; returns how many.  Subclasses of nn.Linear (FalconLinear) become
    plain nn.Linear first: torchao's QATConfig swaps nn.Linear layers."""
    plain_linears(model)
    names = target_names(model)
    base = MODES[mode][1]
    _quantize(model, lambda q: quiet_import("torchao.quantization.qat", device_type).QATConfig(base(q), step="prepare"),
              names, device_type)
    return len(names)


def fake_quantized_names(model: torch.nn.Module) -> set[str]:
    return {n for n, m in model.named_modules() if type(m).__name__ == "FakeQuantizedLinear"}


def convert(model: torch.nn.Module, mode: str, device_type: str = "cpu") -> int:
    """The fake-quantized linears made really quantized, in place (after training); returns how many."""
    names = fake_quantized_names(model)
    base = MODES[mode][1]
    _quantize(model, lambda q: quiet_import("torchao.quantization.qat", device_type).QATConfig(base(q), step="convert"),
              names, device_type)
    return len(names)


def quantize(model: torch.nn.Module, mode: str, device_type: str = "cpu") -> int:
    """Post-training quantization of the same layers with the same config (the baseline QAT is measured against)."""
    plain_linears(model)
    names = target_names(model)
    _quantize(model, MODES[mode][1], names, device_type)
    return len(names)
