"""drop_last: the loader's last, short batch is dropped, so every step sees a full batch."""

from __future__ import annotations

import torch

from tests.helpers import built, tiny


def test_drop_last_gives_full_batches_only():
    from scalekit.data import window_loader

    tokens = torch.arange(1000).numpy().astype("uint16")  # 1000 tokens, seq 10 → 99 windows
    full = list(window_loader(tokens, 10, 8, seed=0, drop_last=True))
    ragged = list(window_loader(tokens, 10, 8, seed=0, drop_last=False))
    assert {x.shape[0] for x, _ in full} == {8} and len(full) == 12
    assert ragged[-1][0].shape[0] == 99 % 8
    with built(tiny(toggles=["drop_last"])) as ctx:
        assert ctx.loader_kwargs == {"drop_last": True}
