"""quantized_base: the frozen base's block linears stored in NF4, half a byte per weight plus their
quantization state."""

from __future__ import annotations

from scalekit.measure.memory import parameter_counts
from scalekit.models.blocks import block_linears
from scalekit.plan.traced import quantized_bytes
from tests.finetuning import built, ft


def test_the_nf4_base_holds_half_a_byte_per_weight_plus_its_quantization_state():
    with built(ft()) as plain:  # no adapters yet: the block linears are the base's own
        shapes = [tuple(plain.base_model.get_submodule(n).weight.shape) for n in block_linears(plain.base_model)]
        fp32_frozen = parameter_counts(plain.base_model)["trainable_weight_bytes"]  # all of it trains here
    with built(ft({"lora": 8, "quantized_base": "nf4"})) as ctx:
        counts = parameter_counts(ctx.base_model)
    quantized = sum(sum(quantized_bytes("nf4", r, c)) for r, c in shapes)
    assert counts["frozen_weight_bytes"] == fp32_frozen - sum(4 * r * c for r, c in shapes) + quantized
    assert counts["total_params"] == 932_736 + 65_536  # a 4-bit weight still counts its values
