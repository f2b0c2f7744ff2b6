"""The host work of the DTensor wrappers in the cost model (predict/host_work.py): what it counts per mode, worked by
hand for the `small` preset; its seconds added to the step where a part carries calibrated figures, and nothing
changed where it carries none (every datasheet part: a GPU's host work is taken as hidden)."""

from __future__ import annotations

import dataclasses

import pytest

from scalekit.predict import PARTS, predict
from scalekit.predict.cost import PUBLISHED, Layout, step_collectives
from scalekit.predict.host_work import COUNTED, host_seconds
from scalekit.predict.parts import register
from scalekit.predict.shapes import shape_of

SMALL = shape_of("small")  # 4 blocks of 12 tensors (2 LayerNorms' weight and bias, 4 linears' weight and bias)
FIGURES = dict(fsdp_call_s=400e-6, fsdp_host_bandwidth=2e9, dtensor_param_s=70e-6, tp_linear_s=600e-6,
               tp_host_bandwidth=2.5e9)
EFF = dataclasses.replace(PUBLISHED, **FIGURES)


def test_fsdp_pays_per_gather_and_reduce_scatter_call_and_byte_and_per_sharded_parameter():
    lay = Layout(world=2, dp=2, sharding="fsdp")
    colls = step_collectives(SMALL, lay, 8, 128)
    seconds, counts = host_seconds(SMALL, lay, EFF, colls, 8, 128)
    # 5 units (the root, 4 blocks): gathered in forward and again in backward, reduce-scattered once
    assert counts == {"fsdp_call_s": 15, "dtensor_param_s": 4 + 4 * 12, "tp_linear_s": 0}
    moved = sum(c.bytes for c in colls if c.op in ("all_gather", "reduce_scatter"))
    assert seconds == pytest.approx(15 * 400e-6 + moved / 2e9 + 52 * 70e-6)
    # ZeRO-2 keeps the gathered weights through backward: 10 calls, the same parameters
    zero2 = Layout(world=2, dp=2, sharding="zero2")
    assert host_seconds(SMALL, zero2, EFF, step_collectives(SMALL, zero2, 8, 128), 8, 128)[1]["fsdp_call_s"] == 10


def test_tensor_parallel_pays_per_split_linear_and_its_activation_and_per_split_parameter():
    lay = Layout(world=2, dp=1, tp=2)
    seconds, counts = host_seconds(SMALL, lay, EFF, step_collectives(SMALL, lay, 16, 128), 16, 128)
    # 4 linears a block are split; their weights and biases are DTensors, the norms' are not
    assert counts == {"fsdp_call_s": 0, "dtensor_param_s": 4 * 8, "tp_linear_s": 4 * 4}
    activation = 16 * 128 * 128 * 4  # rows × tokens × width × fp32, each linear's full-width side
    assert seconds == pytest.approx(16 * 600e-6 + 16 * activation / 2.5e9 + 32 * 70e-6)
    # DDP and ZeRO-1 use no DTensor: nothing to pay
    for sharding in ("ddp", "zero1"):
        dp = Layout(world=2, dp=2, sharding=sharding)
        assert host_seconds(SMALL, dp, EFF, step_collectives(SMALL, dp, 8, 128), 8, 128) == \
            (0.0, dict.fromkeys(COUNTED, 0))


def test_a_part_with_figures_adds_them_to_the_step_and_names_them_and_a_datasheet_part_adds_nothing():
    h100 = PARTS["H100-SXM"]
    assert h100.efficiency is None and all(getattr(PUBLISHED, f) == 0 for f in COUNTED)  # it predicts with these
    register(dataclasses.replace(h100, name="h100-inline-host", efficiency=EFF))
    try:
        for toggles in (["fsdp"], {"tensor_parallel": 2}):
            plain = predict("small", "2xH100-SXM", toggles=toggles)
            inline = predict("small", "2xh100-inline-host", toggles=toggles)
            assert "host work (DTensor, FSDP2 hooks)" not in plain.compute_parts
            host = inline.compute_parts["host work (DTensor, FSDP2 hooks)"]
            assert host > 0 and not any(a.startswith("host work") for a in plain.assumptions)
            assert any(a.startswith("host work of the DTensor wrappers") for a in inline.assumptions)
            # FSDP's copy-in and copy-out are the calls' host work there, not memory traffic besides
            def traffic(p):
                return next(a for a in p.assumptions if a.startswith("memory traffic"))

            copies = "FSDP copy-out and copy-in"
            assert copies not in traffic(inline) and (copies in traffic(plain)) == ("fsdp" in toggles)
            assert inline.compute_s == pytest.approx(plain.compute_s + host - (
                plain.compute_parts["memory traffic"] - inline.compute_parts["memory traffic"]))
    finally:
        PARTS.pop("h100-inline-host", None)
