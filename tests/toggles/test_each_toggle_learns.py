"""Each toggle does what it says, and a run with it still learns."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from scalekit import run
from scalekit.models import GPT, GPTConfig
from scalekit.toggles import ORDER, PHASES, TOGGLES
from tests.helpers import CPU, built, learns, tiny

STEPS = dict(steps=30, warmup_steps=1, log_every=5)



def test_order_follows_phases_and_every_toggle_explains_itself():
    phases = [PHASES.index(t.phase) for t in ORDER]
    assert phases == sorted(phases)
    for t in ORDER:
        assert t.summary and t.cost and t.helps_when and t.group
        assert len(t.explainer) > len(t.summary), f"{t.name} has no explainer .md beside it"


def test_tf32_sets_and_restores_the_flags_cpu_proxy():
    # CPUs have no TF32: pretend the hardware has it, to check the toggle's own work on this machine
    ampere = dataclasses.replace(CPU, tf32_supported=True)
    assert not TOGGLES["tf32"].available(CPU)[0]
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    seen = {}

    def spy(record):
        seen["flags"] = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32

    result = run(tiny(toggles=["tf32"], **STEPS), hw=ampere, on_step=spy)
    assert seen["flags"] == (True, True)
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before
    assert learns(result)


@pytest.mark.gpu
def test_tf32_on_gpu_runs():
    result = run(tiny(toggles=["tf32"], device="cuda", **STEPS))
    assert learns(result)


@pytest.mark.parametrize("name,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_autocast_dtype_is_seen_inside_forward(name, dtype):
    with built(tiny(toggles=[name])) as ctx:
        seen = []
        ctx.base_model.lm_head.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
        from scalekit.training import train_step

        loss = train_step(ctx, next(ctx.batches))
        assert seen == [dtype]
        assert loss.dtype == torch.float32  # the loss is computed in fp32
        assert (ctx.grad_scaler is not None) == (name == "fp16")
        assert all(p.dtype == torch.float32 for p in ctx.base_model.parameters())  # weights stay fp32


@pytest.mark.parametrize("name", ["bf16", "fp16", "sdpa", "nice_numbers", "fused_adamw", "drop_last"])
def test_run_with_toggle_learns(name):
    result = run(tiny(toggles=[name], **STEPS))
    assert result.status == "ok"
    assert learns(result), result.losses


@pytest.mark.slow
def test_compile_wraps_the_model_and_learns():
    with built(tiny(toggles={"compile": "default"})) as ctx:
        assert isinstance(ctx.model, torch._dynamo.eval_frame.OptimizedModule)
        assert ctx.model._orig_mod is ctx.base_model
    result = run(tiny(toggles=["compile"], **STEPS))
    assert learns(result)
    assert result.compile_s is not None and result.compile_s > 0


def test_sdpa_equals_manual_attention():
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=32, vocab_size=65, n_layer=2, n_head=4, n_embd=64)
    manual = GPT(cfg)
    fused = GPT(dataclasses.replace(cfg, attention="sdpa"))
    fused.load_state_dict(manual.state_dict())
    idx = torch.randint(0, 65, (3, 32))
    (lm, loss_m), (lf, loss_f) = manual(idx, idx), fused(idx, idx)
    torch.testing.assert_close(lf, lm, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss_f, loss_m, rtol=1e-6, atol=1e-6)
    with built(tiny(toggles=["sdpa"])) as ctx:
        assert ctx.base_model.config.attention == "sdpa"


def test_nice_numbers_pads_vocab_and_padding_gets_no_probability():
    with built(tiny(toggles=["nice_numbers"], batch_size=6)) as ctx:
        g = ctx.base_model.config
        assert g.vocab_size == 65 and g.padded_vocab_size == 128 and g.padded_vocab_size % 64 == 0
        assert ctx.base_model.lm_head.weight.shape[0] == 128
        assert any("batch_size=6 is not a multiple of 8" in n for n in ctx.notes)
    # the same weights with and without padding give the same loss: padded rows carry no probability
    torch.manual_seed(0)
    plain = GPT(GPTConfig(block_size=16, vocab_size=65, n_layer=1, n_head=2, n_embd=32))
    padded = GPT(GPTConfig(block_size=16, vocab_size=65, padded_vocab_size=128, n_layer=1, n_head=2, n_embd=32))
    state = plain.state_dict()
    padded_state = padded.state_dict()
    for k, v in state.items():
        if v.shape == padded_state[k].shape:
            padded_state[k] = v
        else:  # embedding rows: real rows copied, padded rows left random (they must not matter)
            padded_state[k][:65] = v
    padded.load_state_dict(padded_state)
    idx = torch.randint(0, 65, (4, 16))
    (_, loss_plain), (logits, loss_padded) = plain(idx, idx), padded(idx, idx)
    torch.testing.assert_close(loss_padded, loss_plain)
    assert logits.shape[-1] == 65
    loss_padded.backward()
    assert torch.count_nonzero(padded.lm_head.weight.grad[65:]) == 0  # padded rows learn nothing
    out = padded.generate(idx[:, :4], max_new_tokens=40, generator=torch.Generator().manual_seed(0))
    assert int(out.max()) < 65  # sampling never picks a padded id


def test_fused_adamw_makes_a_fused_optimizer():
    with built(tiny(toggles=["fused_adamw"])) as ctx:
        assert ctx.optimizer.defaults["fused"] is True
    with built(tiny()) as ctx:
        assert not ctx.optimizer.defaults.get("fused")


def test_drop_last_gives_full_batches_only():
    from scalekit.data import window_loader

    tokens = torch.arange(1000).numpy().astype("uint16")  # 1000 tokens, seq 10 → 99 windows
    full = list(window_loader(tokens, 10, 8, seed=0, drop_last=True))
    ragged = list(window_loader(tokens, 10, 8, seed=0, drop_last=False))
    assert {x.shape[0] for x, _ in full} == {8} and len(full) == 12
    assert ragged[-1][0].shape[0] == 99 % 8
    with built(tiny(toggles=["drop_last"])) as ctx:
        assert ctx.loader_kwargs == {"drop_last": True}
