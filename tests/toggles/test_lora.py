"""lora: exactly the parameters r·(in + out) per adapted layer train, and the gradients and optimizer state
follow that count (the shipped model; the methods side by side are in tests/training/test_finetune.py)."""

from __future__ import annotations

import pytest

from scalekit import run
from tests.finetuning import built, ft, lora_formula


@pytest.mark.parametrize("rank", [4, 8])
def test_lora_trains_exactly_the_parameters_the_formula_gives(rank):
    with built(ft()) as plain:
        expected = lora_formula(plain.base_model, rank)
        only_attn = lora_formula(plain.base_model, rank, ("c_attn",))
    with built(ft({"lora": rank})) as ctx:
        trainable = [p for p in ctx.model.parameters() if p.requires_grad]
        assert sum(p.numel() for p in trainable) == expected
        assert {id(p) for g in ctx.optimizer.param_groups for p in g["params"]} == {id(p) for p in trainable}
    with built(ft({"lora": rank}, adapter_targets=["c_attn"])) as ctx:
        assert sum(p.numel() for p in ctx.model.parameters() if p.requires_grad) == only_attn


def test_gradients_and_optimizer_state_follow_the_trainable_count():
    result = run(ft({"lora": 8}, steps=2, warmup_steps=0))
    assert result.trainable_params == 65_536 and result.total_params == 932_736 + 65_536
    assert result.grads_bytes == 4 * result.trainable_params  # fp32 gradients, only for the adapters
    n_tensors = 2 * 16  # lora_A and lora_B on 16 linear layers
    assert result.optimizer_state_bytes == 8 * result.trainable_params + 4 * n_tensors  # AdamW moments + steps
