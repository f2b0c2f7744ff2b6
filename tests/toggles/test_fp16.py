"""fp16: the forward under autocast to float16, the loss and the weights in float32, the loss scaled."""

from __future__ import annotations

import torch

from tests.helpers import built, tiny


def test_autocast_dtype_is_seen_inside_forward():
    with built(tiny(toggles=["fp16"])) as ctx:
        seen = []
        ctx.base_model.lm_head.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
        from scalekit.training.build import train_step

        loss = train_step(ctx, next(ctx.batches))
        assert seen == [torch.float16]
        assert loss.dtype == torch.float32  # the loss is computed in fp32
        assert ctx.grad_scaler is not None  # float16's small range: the loss is scaled
        assert all(p.dtype == torch.float32 for p in ctx.base_model.parameters())  # weights stay fp32
