"""A user's own nn.Module runs through the same engine, toggles and measurement."""

from __future__ import annotations

import torch

from scalekit import RunConfig, run
from tests.helpers import Regressor, learns, mse_loss, regression_batch


def test_your_own_model_trains_and_is_measured():
    cfg = RunConfig(model=Regressor, batch_fn=regression_batch, loss_fn=mse_loss, batch_size=32, steps=40,
                    warmup_steps=2, log_every=10, lr=1e-2, device="cpu", tokens_per_sample=16,
                    toggles=["bf16", "fused_adamw"])
    result = run(cfg)
    assert result.status == "ok"
    assert result.tokens_per_step == 32 * 16
    assert result.tokens_per_s > 0 and result.peak_mem_bytes > 0
    assert learns(result, drop=1.0)
    assert result.config["model"] == "Regressor" and result.config["data"] == "custom"


def test_a_model_instance_is_copied_not_trained_in_place():
    model = Regressor()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    run(RunConfig(model=model, batch_fn=regression_batch, loss_fn=mse_loss, batch_size=8, steps=3, device="cpu"))
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)


def test_a_failing_model_becomes_a_failed_result_when_asked():
    def broken(model, batch):
        raise RuntimeError("shapes do not match\nlong torch detail")

    result = run(RunConfig(model=Regressor, batch_fn=regression_batch, loss_fn=broken, batch_size=8, steps=2,
                           device="cpu"), catch_errors=True)
    assert result.status == "failed"
    assert result.error == "RuntimeError: shapes do not match"
