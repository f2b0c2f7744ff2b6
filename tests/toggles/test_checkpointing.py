"""checkpointing: identical gradients, less activation memory, the chosen blocks only, a model of your own."""

from __future__ import annotations

import pytest
import torch

from scalekit import ConfigError, RunConfig, ToggleUnavailable, run
from tests.helpers import (
    Regressor,
    assert_same_grads,
    built,
    grads_of_one_step,
    mse_loss,
    regression_batch,
    tiny,
)

# -- values and errors --------------------------------------------------------------------------------------


# -- gradient accumulation ----------------------------------------------------------------------------------


# -- activation checkpointing -------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", [1, 2, "sequential"])
def test_checkpointing_gives_identical_gradients(mode):
    cfg = dict(preset="small", batch_size=4, seq_len=64)
    with built(tiny(**cfg)) as ctx:
        batch = next(ctx.batches)
    plain = grads_of_one_step(tiny(**cfg), batch)
    checkpointed = grads_of_one_step(tiny(**cfg, toggles={"checkpointing": mode}), batch)
    assert_same_grads(plain, checkpointed, atol=0)  # the same ops on the same inputs, recomputed


def test_checkpointing_lowers_measured_activation_memory():
    # small preset, B=8, T=128: activations are ≈75% of the peak, so the effect is plain to see
    cfg = dict(preset="small", batch_size=8, steps=1, warmup_steps=0)
    plain = run(tiny(**cfg))
    every = run(tiny(**cfg, toggles={"checkpointing": True}))
    every_2nd = run(tiny(**cfg, toggles={"checkpointing": 2}))
    sequential = run(tiny(**cfg, toggles={"checkpointing": "sequential"}))
    assert every.activations_bytes < 0.4 * plain.activations_bytes
    assert every.activations_bytes < sequential.activations_bytes < plain.activations_bytes
    assert every.activations_bytes < every_2nd.activations_bytes < plain.activations_bytes
    assert every.final_loss == plain.final_loss  # same gradients, so the same training


def test_checkpointing_wraps_the_chosen_blocks_only():
    with built(tiny(preset="small", toggles={"checkpointing": 2})) as ctx:
        blocks = ctx.base_model.transformer.h
        patched = ["forward" in vars(b) for b in blocks]
        assert patched == [False, True, False, True]  # blocks 2 and 4, counted from 1
        assert any("2 of 4" in n for n in ctx.notes)
    with pytest.raises(ConfigError, match="only 2 blocks"):
        with built(tiny(toggles={"checkpointing": 3})):
            pass


def test_checkpointing_a_model_of_your_own():
    cfg = dict(model=Regressor, batch_fn=regression_batch, loss_fn=mse_loss, batch_size=8)
    batch = regression_batch(8, torch.device("cpu"))
    plain = grads_of_one_step(tiny(**cfg), batch)
    checkpointed = grads_of_one_step(tiny(**cfg, toggles=["checkpointing"]), batch)
    assert_same_grads(plain, checkpointed, atol=0)

    class NoBlocks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(16, 1)

        def forward(self, x):
            return self.w(x).squeeze(-1)

    with pytest.raises(ToggleUnavailable, match="no nn.ModuleList or nn.Sequential"):
        run(tiny(model=NoBlocks, batch_fn=regression_batch, loss_fn=mse_loss, toggles=["checkpointing"]))


# -- empty_cache_steps --------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_checkpointing_lowers_allocator_activation_memory_on_gpu():
    cfg = dict(preset="medium", device="cuda", steps=2, warmup_steps=1, log_every=1)
    plain = run(RunConfig(**cfg))
    every = run(RunConfig(**cfg, toggles=["checkpointing"]))
    assert every.activations_bytes < 0.5 * plain.activations_bytes
