"""Fine-tuning the shipped model, the methods side by side: the base does not move, every method
learns the new plays, adapters save, load and merge, and the planner predicts the memory.  What each method
alone trains is in its file in tests/toggles (test_lora, test_dora, test_head_only, test_quantized_base)."""

from __future__ import annotations

import os

import pytest
import torch

from scalekit import ConfigError, RunConfig, estimate, run
from scalekit.models import lora_files as adapters
from scalekit.models.pretrained import _files as pretrained_files
from scalekit.optional import quiet_import
from scalekit.training.build import train_step
from scalekit.training.finetune import FINETUNE_RUNGS, finetune_config
from tests.finetuning import built, ft
from tests.helpers import CPU


@pytest.mark.parametrize("toggles", [{"lora": 8}, {"dora": 8}, {"lora": 8, "quantized_base": "nf4"}],
                         ids=["lora", "dora", "qlora"])
def test_the_base_weights_do_not_change_under_adapters(toggles):
    with built(ft(toggles, lr=1e-2)) as ctx:
        frozen = {n: p.detach().clone() for n, p in ctx.base_model.named_parameters() if not p.requires_grad}
        adapters_before = {n: p.detach().clone() for n, p in ctx.base_model.named_parameters() if p.requires_grad}
        for _ in range(3):
            train_step(ctx, next(ctx.batches))
        params = dict(ctx.base_model.named_parameters())
        assert frozen and all(torch.equal(params[n], p) for n, p in frozen.items())
        assert any(not torch.equal(params[n], p) for n, p in adapters_before.items())  # the adapters learned


def finetune_run(toggles):
    return run(finetune_config(toggles=toggles, batch_size=8, seq_len=128, steps=30, warmup_steps=0,
                               measure_memory=False, device="cpu"))


@pytest.mark.slow
@pytest.mark.parametrize("label,toggles", FINETUNE_RUNGS, ids=[label for label, _ in FINETUNE_RUNGS])
def test_every_method_lowers_the_held_out_loss_on_the_new_plays(label, toggles):
    # 30 steps of 8 × 128 tokens
    # the same steps and learning rate for every method (the fine-tuning default, 3e-4)
    result = finetune_run(toggles)
    assert result.status == "ok", result.error
    assert result.heldout_loss_after < result.heldout_loss_before - 0.005, (result.heldout_loss_before,
                                                                            result.heldout_loss_after)


@pytest.mark.parametrize("toggles", [{"lora": 8}, {"dora": 4}, {"lora": 8, "quantized_base": "nf4"}],
                         ids=["lora", "dora", "qlora"])
def test_adapters_save_load_and_merge(tmp_path, toggles):
    path = tmp_path / "adapters.pt"
    with built(ft(toggles, lr=1e-2)) as ctx:
        for _ in range(2):
            train_step(ctx, next(ctx.batches))
        size = adapters.save(ctx.model, path)
        x = next(ctx.batches)[0]
        ctx.model.eval()
        expected = ctx.model(x)[0].detach()
        diff, merged = adapters.merge_logit_difference(ctx.model, x)
    model_bytes = os.path.getsize(str(pretrained_files("shakespeare-char")[0]))
    assert size < 0.1 * model_bytes  # a fraction of the model
    with built(ft(toggles)) as fresh:
        adapters.load(fresh.model, path)
        fresh.model.eval()
        assert torch.equal(fresh.model(x)[0], expected)  # the same adapted outputs, bit for bit
    assert isinstance(merged, torch.nn.Module) and not isinstance(merged, quiet_import("peft").PeftModel)
    if "quantized_base" in toggles:
        assert 1e-3 < diff < 5.0  # re-quantizing the merged weights is lossy: measured, and shown in chapter 09
    else:
        assert diff < 1e-4  # a float base: the same logits up to rounding


def test_adapter_files_refuse_a_mismatch_and_anything_but_tensors(tmp_path):
    path = tmp_path / "a.pt"
    with built(ft({"lora": 4})) as ctx:
        adapters.save(ctx.model, path)
    with built(ft({"lora": 8})) as other, pytest.raises(ConfigError, match="were made as"):
        adapters.load(other.model, path)
    evil = tmp_path / "evil.pt"

    class Payload:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    torch.save({"format": adapters.FORMAT, "config": {}, "state": Payload()}, evil)
    with pytest.raises(ConfigError, match="cannot read the adapter file"):
        adapters.read(evil)
    with built(ft()) as plain, pytest.raises(ConfigError, match="expected a model with LoRA/DoRA adapters"):
        adapters.save(plain.model, tmp_path / "b.pt")


PLAN_CASES = [{}, {"head_only": True}, {"lora": 8}, {"dora": 8}, {"lora": 8, "quantized_base": "nf4"},
              {"lora": 8, "quantized_base": "int8"},
              {"lora": 8, "quantized_base": "nf4", "checkpointing": 1, "optim": "adamw_bnb_8bit"},
              {"dora": 4, "bf16": True, "grad_accum": 2}]


@pytest.mark.parametrize("toggles", PLAN_CASES, ids=lambda t: "+".join(f"{k}={v}" for k, v in t.items()) or "full")
def test_the_planner_predicts_each_finetuning_configuration_within_15_percent(toggles):
    cfg = ft(toggles, steps=1, warmup_steps=0)
    planned, result = estimate(cfg), run(cfg)
    error = (planned.peak_bytes - result.peak_mem_bytes) / result.peak_mem_bytes
    assert abs(error) < 0.15, f"planned {planned.peak_bytes:,} vs measured {result.peak_mem_bytes:,}: {error:+.1%}"
    assert (planned.params_bytes, planned.grads_bytes, planned.optimizer_state_bytes) == \
        (result.params_bytes, result.grads_bytes, result.optimizer_state_bytes)


@pytest.mark.parametrize("kwargs,words", [
    (dict(preset="tiny", init="pretrained"), "needs a preset that ships weights: shakespeare-char"),
    (dict(init="trained"), "RunConfig.init must be one of"),
    (dict(adapter_targets="c_attn"), "RunConfig.adapter_targets"),
    (dict(toggles={"quantized_base": "nf4"}), "'quantized_base' needs 'lora' or 'dora'"),
    (dict(toggles={"lora": 8, "dora": 8}), "cannot be on together"),
    (dict(toggles={"head_only": True, "quantized_base": "nf4", "lora": 4}), "cannot be on together"),
])
def test_bad_finetuning_input_names_the_field(kwargs, words):
    with pytest.raises(ConfigError, match=words):
        RunConfig(**kwargs)


def test_adapters_say_why_when_the_targets_do_not_exist():
    result = run(ft({"lora": 8}, adapter_targets=["q_proj"], steps=1, warmup_steps=0), catch_errors=True)
    assert result.status == "failed" and "none named ['q_proj']" in result.error




def test_the_lab_offers_the_finetuning_methods_and_shows_what_trains():
    from scalekit import Lab

    lab = Lab(preset="shakespeare-char", init="pretrained", data="new-plays", seq_len=32, batch_size=4, steps=2,
              warmup_steps=0, device="cpu", hw=CPU, measure_memory=False)
    offered = list(lab.controls["finetune"].choices)
    assert offered[0] == "full fine-tuning" and "head_only" in offered and "lora 8" in offered and "dora 8" in offered
    lab.set(finetune="lora 8", quantized_base="nf4")
    assert lab.start() and lab.wait(300).status == "ok"
    row = lab.results.iloc[-1]
    assert row["trainable_params"] == 65_536 and row["heldout_after"] < row["heldout_before"] + 0.05
