"""optim='muon': torch's Muon on the blocks' 2-D weights, AdamW on the rest; it trains on every kind of model with
such blocks, its state is what the planner says, and its checkpoint round-trips."""

from __future__ import annotations

import copy

import pytest
import torch

from scalekit import RunConfig, ToggleUnavailable, estimate, run
from scalekit.models.muon import MuonWithAdamW, muon_with_adamw
from scalekit.training.build import train_step
from tests.helpers import (
    ConvNet,
    NanoStyleGPT,
    built,
    classify_loss,
    image_batch,
    learns,
    nano_loss,
    tiny,
    token_batch,
)

STEPS = dict(steps=20, warmup_steps=1, log_every=5)


def test_muon_trains_the_built_in_gpt():
    result = run(tiny(toggles={"optim": "muon"}, **STEPS))
    assert result.status == "ok", result.error
    assert learns(result), result.losses


def test_blocks_matrices_get_one_momentum_the_rest_adamw_moments():
    with built(tiny(toggles={"optim": "muon"})) as ctx:
        train_step(ctx, next(ctx.batches))
        model, state = ctx.base_model, ctx.optimizer.state
        assert isinstance(ctx.optimizer, MuonWithAdamW)
        block = model.transformer.h[0]
        for p in (block.attn.c_attn.weight, block.mlp.c_fc.weight, block.mlp.c_proj.weight):
            assert set(state[p]) == {"momentum_buffer"} and state[p]["momentum_buffer"].shape == p.shape
        for p in (model.transformer.wte.weight, model.transformer.wpe.weight, block.ln_1.weight):
            assert set(state[p]) == {"step", "exp_avg", "exp_avg_sq"}
        n_matrices = sum(p.numel() for p in model.transformer.h.parameters() if p.ndim == 2)
        n_rest = sum(p.numel() for p in model.parameters()) - n_matrices
        n_adam_tensors = sum(1 for p in model.parameters() if not (p.ndim == 2 and p in set(model.transformer.h.parameters())))
        assert sum(v.numel() * v.element_size() for s in state.values() for v in s.values()) == \
            4 * n_matrices + 8 * n_rest + 4 * n_adam_tensors


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_planned_state_is_measured_state(preset):
    cfg = RunConfig(preset=preset, batch_size=2, seq_len=32, device="cpu", steps=1, warmup_steps=0,
                    toggles={"optim": "muon"})
    result, planned = run(cfg), estimate(cfg)
    assert planned.optimizer_state_bytes == result.optimizer_state_bytes
    adamw = estimate(RunConfig(preset=preset, batch_size=2, seq_len=32, device="cpu"))
    assert planned.optimizer_state_bytes < 0.7 * adamw.optimizer_state_bytes  # most weights are block matrices


def test_own_model_runs_and_its_traced_plan_counts_the_state():
    cfg = RunConfig(model=NanoStyleGPT, batch_fn=token_batch, loss_fn=nano_loss, device="cpu", steps=2,
                    warmup_steps=0, batch_size=4, toggles={"optim": "muon"})
    result = run(cfg)  # (random tokens: nothing to learn; the GPT and Llama tests show it learning)
    assert result.status == "ok", result.error
    assert estimate(cfg).optimizer_state_bytes == result.optimizer_state_bytes


def test_hf_llama_trains_and_its_traced_plan_counts_the_state():
    pytest.importorskip("transformers")
    from scalekit.hf import causal_lm

    cfg = RunConfig(model=causal_lm("llama", preset="tiny"), seq_len=16, batch_size=4, device="cpu", steps=8,
                    warmup_steps=1, log_every=2, toggles={"optim": "muon"})
    result = run(cfg)
    assert result.status == "ok", result.error
    assert learns(result, drop=0.2), result.losses
    assert estimate(cfg).optimizer_state_bytes == result.optimizer_state_bytes


def test_a_model_without_block_matrices_is_refused_naming_it():
    with pytest.raises(ToggleUnavailable, match="no 2-D weight matrix in the repeated blocks of ConvNet") as refused:
        run(RunConfig(model=ConvNet, batch_fn=image_batch, loss_fn=classify_loss, device="cpu", steps=1,
                      warmup_steps=0, toggles={"optim": "muon"}))
    assert "\n" not in str(refused.value)


def test_state_dict_round_trips_and_steps_the_same():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)),
                                torch.nn.Linear(8, 10))  # the blocks: the inner Sequential, holding the most parameters

    def step(opt):
        opt.zero_grad()
        model(torch.arange(6)).square().sum().backward()
        opt.step()

    a = muon_with_adamw(model, list(model.parameters()), lr=1e-2)
    step(a)
    saved_model = {k: v.clone() for k, v in model.state_dict().items()}
    b = muon_with_adamw(model, list(model.parameters()), lr=1e-2)
    b.load_state_dict(copy.deepcopy(a.state_dict()))  # (loading shares tensors that a then steps in place)
    step(a)
    after_a = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(saved_model)
    step(b)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, after_a[k], rtol=0, atol=0)
    assert b.muon.state is b.state and b.adamw.param_groups[0] is b.param_groups[1]
