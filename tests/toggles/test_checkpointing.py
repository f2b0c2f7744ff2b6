"""grad_accum, checkpointing and empty_cache_steps: same gradients, less memory, clear errors."""

from __future__ import annotations

import pytest
import torch

from scalekit import ConfigError, RunConfig, ToggleUnavailable, run
from scalekit.toggles import TOGGLES
from scalekit.training import train_step
from tests.helpers import CPU, Regressor, built, mse_loss, regression_batch, tiny


def grads_of_one_step(cfg, batch=None) -> dict[str, torch.Tensor]:
    """The gradients the optimizer sees in one train_step of `cfg` (read from a step pre-hook)."""
    seen = {}
    with built(cfg) as ctx:
        names = {p: n for n, p in ctx.base_model.named_parameters()}

        def read(optimizer, args, kwargs):
            seen.update({names[p]: p.grad.clone() for g in optimizer.param_groups for p in g["params"]})

        ctx.optimizer.register_step_pre_hook(read)
        train_step(ctx, batch if batch is not None else next(ctx.batches))
        assert all(p.grad is None for p in ctx.base_model.parameters())  # zero_grad(set_to_none=True)
    return seen


def assert_same_grads(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


# -- values and errors --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,value,expected", [
    ("grad_accum", True, 4), ("grad_accum", 2, 2), ("grad_accum", "8", 8),
    ("empty_cache_steps", True, 1), ("empty_cache_steps", "10", 10),
    ("checkpointing", True, 1), ("checkpointing", 3, 3), ("checkpointing", "2", 2),
    ("checkpointing", "sequential", "sequential"),
])
def test_count_toggles_accept_whole_numbers_and_numeric_strings(name, value, expected):
    assert TOGGLES[name].validate(value) == expected


@pytest.mark.parametrize("name", ["grad_accum", "empty_cache_steps", "checkpointing"])
@pytest.mark.parametrize("bad", [0, -2, 2.5, "four", "0"])
def test_count_toggles_refuse_other_values_naming_the_field(name, bad):
    with pytest.raises(ConfigError, match=rf"toggles\['{name}'\].*positive whole number"):
        RunConfig(toggles={name: bad})


def test_grad_accum_must_divide_the_batch():
    with pytest.raises(ConfigError, match=r"grad_accum'\]=3 must divide batch_size=8.*1, 2, 4, 8"):
        run(tiny(batch_size=8, toggles={"grad_accum": 3}))


# -- gradient accumulation ----------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [2, 4])
def test_accumulation_gives_the_gradients_of_the_whole_batch(k):
    with built(tiny(batch_size=8)) as ctx:
        batch = next(ctx.batches)
    whole = grads_of_one_step(tiny(batch_size=8), batch)
    accumulated = grads_of_one_step(tiny(batch_size=8, toggles={"grad_accum": k}), batch)
    assert_same_grads(whole, accumulated, atol=1e-6)


def test_accumulation_lowers_measured_activation_memory():
    base = run(tiny(batch_size=16, steps=1, warmup_steps=0))
    acc = run(tiny(batch_size=16, steps=1, warmup_steps=0, toggles={"grad_accum": 4}))
    assert acc.params_bytes == base.params_bytes and acc.optimizer_state_bytes == base.optimizer_state_bytes
    assert acc.activations_bytes < 0.5 * base.activations_bytes


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
def test_empty_cache_is_unavailable_on_cpu_with_the_reason():
    ok, why = TOGGLES["empty_cache_steps"].available(CPU)
    assert not ok and "CPU" in why and "cache" in why
    with pytest.raises(ToggleUnavailable, match="empty_cache_steps.*no cache to empty"):
        run(tiny(toggles={"empty_cache_steps": 2}))


def test_empty_cache_every_n_steps_cpu_proxy(monkeypatch):
    # the hook's own logic, on this machine: count the calls it would make on a GPU
    calls = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(True))
    with built(tiny()) as ctx:
        TOGGLES["empty_cache_steps"].apply(ctx, 3)
        for step in range(10):
            for hook in ctx.after_step:
                hook(step)
    assert len(calls) == 3  # after steps 3, 6 and 9 (counted from 1)


@pytest.mark.gpu
def test_empty_cache_runs_on_gpu_and_is_called(monkeypatch):
    calls = []
    real = torch.cuda.empty_cache
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: (calls.append(True), real()))
    result = run(RunConfig(preset="tiny", device="cuda", steps=8, warmup_steps=0, log_every=4,
                           toggles={"empty_cache_steps": 2}))
    assert result.status == "ok" and len(calls) >= 4


@pytest.mark.gpu
def test_checkpointing_lowers_allocator_activation_memory_on_gpu():
    cfg = dict(preset="medium", device="cuda", steps=2, warmup_steps=1, log_every=1)
    plain = run(RunConfig(**cfg))
    every = run(RunConfig(**cfg, toggles=["checkpointing"]))
    assert every.activations_bytes < 0.5 * plain.activations_bytes
