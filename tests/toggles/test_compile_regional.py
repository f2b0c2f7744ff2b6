"""compile='regional': each repeated block compiled in place, one graph reused by all; eager's outputs (whole-model
compile against eager is tests/toggles/test_compile.py); refused in one line for a model without blocks."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from scalekit import RunConfig, run
from tests.helpers import Regressor, built, mse_loss, regression_batch, tiny


def one_step(toggles: dict, batch=None):
    """Loss and gradients of one forward/backward of the tiny GPT with `toggles`, and the graphs dynamo made."""
    counters.clear()
    # the preset's own batch and sequence length: chapter 01's regional run compiles the same block graph, so a
    # test run compiles it once (inductor's cache is shared by the suite's processes)
    with built(tiny(toggles=toggles)) as ctx:
        batch = batch if batch is not None else next(ctx.batches)
        loss = ctx.loss_fn(ctx.model, batch)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in ctx.base_model.named_parameters()}
        return batch, loss.detach(), grads, dict(counters["stats"]), ctx


def assert_close(a: dict, b: dict, rel: float) -> None:
    for name in a:
        scale = b[name].abs().max().clamp_min(1e-12)
        assert ((a[name] - b[name]).abs().max() / scale) <= rel, name


def test_regional_compiles_every_block_once_with_the_eager_backend(monkeypatch):
    # the wiring, fast: dynamo's eager backend runs the captured graphs as they are, so results are bitwise eager's
    real = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: real(self, backend="eager"))
    batch, loss, grads, _, _ = one_step({})
    _, loss_r, grads_r, stats, ctx = one_step({"compile": "regional"}, batch)
    blocks = ctx.base_model.transformer.h
    assert all(b._compiled_call_impl is not None for b in blocks) and ctx.compiled
    assert ctx.model is ctx.base_model  # the model itself is not wrapped: names and state_dict unchanged
    assert stats["unique_graphs"] == 1  # one graph, reused by both blocks
    assert torch.equal(loss_r, loss)
    assert_close(grads_r, grads, rel=0)


def test_regional_is_refused_in_one_line_for_a_model_without_blocks():
    class NoBlocks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(16, 1)

        def forward(self, x):
            return self.w(x).squeeze(-1)

    result = run(RunConfig(model=NoBlocks, batch_fn=regression_batch, loss_fn=mse_loss, steps=1, warmup_steps=0,
                           device="cpu", toggles={"compile": "regional"}), catch_errors=True)
    assert result.status == "failed" and "NoBlocks" in result.error and "\n" not in result.error.strip()
    own = run(RunConfig(model=Regressor, batch_fn=regression_batch, loss_fn=mse_loss, steps=1, warmup_steps=0,
                        device="cpu", measure_memory=False, toggles={"compile": "regional"}))
    assert own.status == "ok"


@pytest.mark.slow
def test_regional_compile_agrees_with_eager():
    # (whole-model compile against eager: tests/toggles/test_compile.py; one compile here keeps this under a minute)
    batch, loss, grads, _, _ = one_step({})
    _, loss_r, grads_r, stats, _ = one_step({"compile": "regional"}, batch)
    assert stats["unique_graphs"] == 1
    assert abs(loss_r - loss) <= 1e-5 * loss
    assert_close(grads_r, grads, rel=1e-4)  # inductor fuses and reorders float sums
