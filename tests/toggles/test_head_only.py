"""head_only: only the (untied) output head trains; every other weight stays bit for bit."""

from __future__ import annotations

import torch

from scalekit.training.build import train_step
from tests.finetuning import built, ft


def test_head_only_trains_only_the_head_and_leaves_the_rest_bit_identical():
    with built(ft({"head_only": True}, lr=1e-2)) as ctx:
        before = {n: p.detach().clone() for n, p in ctx.base_model.named_parameters()}
        for _ in range(3):
            train_step(ctx, next(ctx.batches))
        changed = {n for n, p in ctx.base_model.named_parameters() if not torch.equal(p, before[n])}
        assert changed == {"lm_head.weight"}
        assert ctx.base_model.lm_head.weight is not ctx.base_model.transformer.wte.weight  # untied
