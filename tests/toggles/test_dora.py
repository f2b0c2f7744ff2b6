"""dora: LoRA on each weight's direction with its magnitude trained apart: LoRA's parameters plus one
magnitude per output row train, the adapted model starts as the base, and the magnitudes move in training
(the methods side by side are in tests/training/test_finetune.py)."""

from __future__ import annotations

import torch

from scalekit.models.blocks import block_linears
from scalekit.training.build import train_step
from tests.finetuning import built, ft, lora_formula


def test_dora_trains_loras_parameters_plus_one_magnitude_per_output_row():
    with built(ft()) as plain:
        lora = lora_formula(plain.base_model, 4)
        rows = sum(plain.base_model.get_submodule(n).out_features for n in block_linears(plain.base_model))
    with built(ft({"dora": 4})) as ctx:
        trainable = [p for p in ctx.model.parameters() if p.requires_grad]
        assert sum(p.numel() for p in trainable) == lora + rows
        assert {id(p) for g in ctx.optimizer.param_groups for p in g["params"]} == {id(p) for p in trainable}


def test_dora_starts_as_the_base_and_its_magnitudes_learn():
    with built(ft()) as plain:
        layers = len(block_linears(plain.base_model))
        x = next(plain.batches)[0]
        plain.model.eval()
        base_logits = plain.model(x)[0].detach()
    with built(ft({"dora": 4}, lr=1e-2)) as ctx:
        ctx.model.eval()
        torch.testing.assert_close(ctx.model(x)[0].detach(), base_logits, rtol=0, atol=1e-5)  # B = 0, m = ‖W‖
        ctx.model.train()
        magnitudes = {n: p.detach().clone() for n, p in ctx.model.named_parameters() if "magnitude" in n}
        assert len(magnitudes) == layers  # one vector per adapted layer
        for _ in range(2):
            train_step(ctx, next(ctx.batches))
        params = dict(ctx.model.named_parameters())
        assert all(not torch.equal(params[n], before) for n, before in magnitudes.items())
