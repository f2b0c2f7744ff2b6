"""checkpointing='selective': the gradients of no checkpointing, memory between none and full, no matmul run twice."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from scalekit import RunConfig, estimate, run
from tests.helpers import (
    Regressor,
    assert_same_grads,
    built,
    grads_of_one_step,
    mse_loss,
    regression_batch,
    tiny,
)


@pytest.mark.parametrize("toggles", [{}, {"sdpa": True}])
def test_selective_gives_the_gradients_of_no_checkpointing(toggles):
    cfg = dict(preset="tiny", batch_size=4, seq_len=32)
    with built(tiny(**cfg)) as ctx:
        batch = next(ctx.batches)
    plain = grads_of_one_step(tiny(**cfg, toggles=toggles), batch)
    selective = grads_of_one_step(tiny(**cfg, toggles={**toggles, "checkpointing": "selective"}), batch)
    assert_same_grads(plain, selective, atol=0)  # the same ops on the same inputs


def test_selective_on_a_hugging_face_model_and_one_of_your_own():
    pytest.importorskip("transformers")
    from scalekit.hf import causal_lm

    cfg = dict(model=causal_lm("llama", preset="tiny"), batch_size=2, seq_len=16, data="synthetic")
    with built(tiny(**cfg)) as ctx:
        batch = next(ctx.batches)
    assert_same_grads(grads_of_one_step(tiny(**cfg), batch),
                      grads_of_one_step(tiny(**cfg, toggles={"checkpointing": "selective"}), batch), atol=0)
    own = dict(model=Regressor, batch_fn=regression_batch, loss_fn=mse_loss, batch_size=8)
    batch = regression_batch(8, torch.device("cpu"))
    assert_same_grads(grads_of_one_step(tiny(**own), batch),
                      grads_of_one_step(tiny(**own, toggles={"checkpointing": "selective"}), batch), atol=0)


def counted_flops(toggles) -> int:
    with built(RunConfig(preset="tiny", device="cpu", toggles=toggles)) as ctx:
        batch = next(ctx.batches)
        counter = FlopCounterMode(display=False)
        with counter:
            ctx.loss_fn(ctx.model, batch).backward()
        return counter.get_total_flops()


def test_selective_runs_no_matmul_twice_and_full_does():
    # FLOPs count matmuls only: the selective policy keeps every matmul's output, so backward recomputes none
    plain = counted_flops({})
    assert counted_flops({"checkpointing": "selective"}) == plain
    assert counted_flops({"checkpointing": True}) > plain


def test_selective_keeps_less_than_none_and_more_than_full_and_is_planned():
    # live-tensor bytes on the CPU: what each keeps, whatever the hardware (small preset, B=8, T=128)
    cfg = dict(preset="small", batch_size=8, steps=1, warmup_steps=0, device="cpu")
    plain, selective, full = (run(RunConfig(**cfg, toggles=t)) for t in
                              ({}, {"checkpointing": "selective"}, {"checkpointing": True}))
    assert full.activations_bytes < selective.activations_bytes < plain.activations_bytes
    assert selective.final_loss == plain.final_loss
    planned = estimate(RunConfig(**cfg, toggles={"checkpointing": "selective"}))
    assert planned.method.startswith("traced")  # what the policy keeps depends on the ops: the trace counts them
    assert abs(planned.peak_bytes - selective.peak_mem_bytes) < 0.15 * selective.peak_mem_bytes
