"""Hugging Face models (GPT-2 and Llama, built offline from configs) through scalekit's toggles, the Transformers way."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the Transformers bridge needs transformers installed")

from scalekit import ConfigError, RunConfig, ToggleUnavailable, estimate, run  # noqa: E402
from scalekit.hf import HFCausalLM, causal_lm, model_config  # noqa: E402
from scalekit.models.blocks import find_blocks  # noqa: E402
from scalekit.training.ladder import ladder  # noqa: E402
from tests.helpers import assert_same_grads, built, grads_of_one_step, learns  # noqa: E402

FAMILIES = ["gpt2", "llama"]


def hf(family: str, preset: str = "tiny", dropout: float = 0.0, **kwargs) -> RunConfig:
    """An HF model of `family` on the shipped corpus, few steps, on the CPU (dropout 0 unless asked: comparable runs)."""
    base = dict(model=causal_lm(family, preset, dropout=dropout), steps=8, warmup_steps=1, log_every=2, device="cpu",
                batch_size=8, lr=3e-3)
    base.update(kwargs)
    return RunConfig(**base)


# -- building ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_small_models_are_built_offline_in_a_presets_shape(family):
    config = model_config(family, "small")
    model = HFCausalLM(config).build()
    assert isinstance(model, transformers.PreTrainedModel) and model.training
    blocks = find_blocks(model)
    assert blocks is not None and len(blocks) == 4  # the small preset: 4 layers
    assert model.config.vocab_size == 65 and model.get_input_embeddings().weight.shape == (65, 128)
    assert model.config._attn_implementation == "eager"  # scalekit's baseline: explicit attention
    assert config.vocab_size == 65  # building did not change the config it was given


def test_a_config_is_not_changed_by_the_runs_built_from_it():
    spec = causal_lm("gpt2", "tiny")
    run(RunConfig(model=spec, steps=1, warmup_steps=0, device="cpu", toggles=["nice_numbers", "sdpa"]))
    assert spec.hf_config.vocab_size == 65 and spec.build().config._attn_implementation == "eager"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("toggles", [[], ["bf16"], ["sdpa"], {"checkpointing": 1}, {"grad_accum": 4},
                                     {"optim": "adamw_bnb_8bit"}],
                         ids=["baseline", "bf16", "sdpa", "checkpointing", "grad_accum", "adamw_bnb_8bit"])
def test_hf_models_learn_with_each_toggle(family, toggles):
    result = run(hf(family, toggles=toggles))
    assert result.status == "ok", result.error
    assert learns(result, drop=0.2), result.losses
    assert result.tokens_per_step == 8 * 64 and result.config["data"] == "shakespeare"
    assert result.peak_mem_bytes > result.params_bytes > 0


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_hf_models_learn_compiled(family):
    result = run(hf(family, toggles=["compile"], steps=4, log_every=1))
    assert result.status == "ok", result.error
    assert learns(result, drop=0.1), result.losses
    assert result.compile_s is not None
    assert (result.graphs_compiled, result.graph_breaks, result.recompiles_measured) == (1, 0, 0), result.notes


# -- the same results ----------------------------------------------------------------------------------------
def one_batch(cfg: RunConfig):
    with built(cfg) as ctx:
        return next(ctx.batches)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("every", [1, 2])
def test_checkpointing_gives_the_same_gradients(family, every):
    cfg = hf(family, preset="small", batch_size=4)
    batch = one_batch(cfg)
    plain = grads_of_one_step(cfg, batch)
    checkpointed = grads_of_one_step(hf(family, preset="small", batch_size=4, toggles={"checkpointing": every}), batch)
    assert_same_grads(plain, checkpointed, atol=0)


def test_checkpointing_with_dropout_gives_the_same_gradients():
    # GPT-2's dropout 0.1 is on: torch's checkpoint replays the RNG state, so the recomputed masks are the same
    cfg = dict(preset="small", batch_size=4, dropout=0.1)
    batch = one_batch(hf("gpt2", **cfg))
    with torch.random.fork_rng():
        plain = grads_of_one_step(hf("gpt2", **cfg), batch)
    checkpointed = grads_of_one_step(hf("gpt2", **cfg, toggles={"checkpointing": 1}), batch)
    assert_same_grads(plain, checkpointed, atol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_grad_accum_gives_the_gradients_of_the_whole_batch(family):
    cfg = hf(family, batch_size=8)
    batch = one_batch(cfg)
    whole = grads_of_one_step(cfg, batch)
    accumulated = grads_of_one_step(hf(family, batch_size=8, toggles={"grad_accum": 4}), batch)
    assert_same_grads(whole, accumulated, atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_sdpa_matches_eager_attention(family):
    cfg = hf(family, preset="small", batch_size=4)  # dropout 0: eager and SDPA would draw different masks
    batch = one_batch(cfg)
    eager = grads_of_one_step(cfg, batch)
    fused = grads_of_one_step(hf(family, preset="small", batch_size=4, toggles=["sdpa"]), batch)
    assert_same_grads(eager, fused, atol=1e-5)
    with built(hf(family, toggles=["sdpa"])) as ctx:
        assert ctx.base_model.config._attn_implementation == "sdpa"
        ctx.base_model.eval()
        loss_sdpa = ctx.loss_fn(ctx.base_model, batch).item()
    with built(hf(family)) as ctx:
        ctx.base_model.eval()
        assert abs(ctx.loss_fn(ctx.base_model, batch).item() - loss_sdpa) < 1e-5


# -- each toggle, the Transformers way -------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_checkpointing_uses_the_models_own_switch(family):
    with built(hf(family, preset="small", toggles={"checkpointing": 2})) as ctx:
        layers = list(ctx.blocks)
        assert [layer.gradient_checkpointing for layer in layers] == [True, False, True, False]  # every_n_layers=2
        assert not any("forward" in vars(layer) for layer in layers)  # not scalekit's own wrapping
        assert any("activation_checkpointing_enable" in n for n in ctx.notes)


def test_sequential_checkpointing_says_why_it_does_not_apply():
    with pytest.raises(ToggleUnavailable, match="checkpoint_sequential passes one tensor.*checkpointing=1"):
        run(hf("gpt2", toggles={"checkpointing": "sequential"}))


@pytest.mark.parametrize("family,preset,padded", [("gpt2", "tiny", 128), ("gpt2", "gpt2-124m", 50304),
                                                  ("llama", "tiny", 128)])
def test_nice_numbers_resizes_the_token_embeddings(family, preset, padded):
    spec = causal_lm(family, preset)
    spec_copy = spec.copy()
    spec_copy.pad_vocab(64)
    with torch.device("meta"):
        model = spec_copy.build()
    assert model.get_input_embeddings().weight.shape[0] == padded == model.config.vocab_size
    assert model.get_output_embeddings().weight.shape[0] == padded
    assert spec.hf_config.vocab_size == PRESET_VOCAB[preset]


PRESET_VOCAB = {"tiny": 65, "gpt2-124m": 50257}


def test_a_model_without_sdpa_says_why():
    class NoSDPA(transformers.GPT2LMHeadModel):
        _supports_sdpa = False

    config = model_config("gpt2", "tiny")
    with pytest.raises(ToggleUnavailable, match="'sdpa' needs attn_implementation='sdpa', which NoSDPA does not"):
        RunConfig(model=HFCausalLM(lambda: NoSDPA(config)), toggles=["sdpa"])


def test_a_plain_module_still_refuses_the_gpt_toggles():
    from tests.helpers import Regressor, mse_loss, regression_batch

    with pytest.raises(ToggleUnavailable, match=r"'nice_numbers' needs a vocabulary to pad, which your model \(Regressor\) does not have"):
        RunConfig(model=Regressor, batch_fn=regression_batch, loss_fn=mse_loss, toggles=["nice_numbers"])


# -- what a user passes -----------------------------------------------------------------------------------
def test_a_pretrained_model_instance_runs_and_is_not_trained_in_place():
    model = transformers.AutoModelForCausalLM.from_config(model_config("llama", "tiny"), attn_implementation="eager")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = run(RunConfig(model=model, steps=2, warmup_steps=0, device="cpu", toggles=["sdpa"]))
    assert result.status == "ok", result.error
    assert result.config["model"] == "LlamaForCausalLM"
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)
    assert model.config._attn_implementation == "eager"  # the run switched its copy, not the model passed in
    assert result.tokens_per_step == 8 * 64


def test_your_own_batches_with_an_hf_model():
    def batch_fn(batch_size, device):
        ids = torch.randint(0, 65, (batch_size, 32), device=device)
        return {"input_ids": ids, "labels": ids}

    result = run(RunConfig(model=causal_lm("gpt2"), batch_fn=batch_fn, tokens_per_sample=32, batch_size=4, steps=2,
                           warmup_steps=0, device="cpu"))
    assert result.status == "ok" and result.tokens_per_step == 4 * 32 and result.config["data"] == "custom"


def test_synthetic_tokens_span_the_models_vocabulary():
    cfg = hf("gpt2", preset="gpt2-124m", data="synthetic", batch_size=2, seq_len=16)
    batch = one_batch(cfg)
    assert batch["input_ids"].shape == (2, 16) and int(batch["input_ids"].max()) > 65


def test_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"RunConfig.seq_len=4096 is longer than the model's context of 64"):
        run(hf("gpt2", seq_len=4096))
    with pytest.raises(ConfigError, match="unknown family 'bert'.*gpt2, llama"):
        causal_lm("bert")
    with pytest.raises(ConfigError, match="must be a transformers config, a PreTrainedModel"):
        HFCausalLM(42)
    tiny_vocab = causal_lm("gpt2", vocab_size=32)
    with pytest.raises(ConfigError, match="data='shakespeare' needs a vocabulary of at least 65"):
        run(RunConfig(model=tiny_vocab, steps=1, device="cpu"))
    assert run(RunConfig(model=tiny_vocab, data="synthetic", steps=1, warmup_steps=0, device="cpu")).ok


# -- the planner, the ladder ------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("toggles", [[], ["sdpa"], {"checkpointing": 1}, ["bf16"], {"grad_accum": 2},
                                     ["nice_numbers"], {"optim": "adamw_bnb_8bit"}],
                         ids=["baseline", "sdpa", "checkpointing", "bf16", "grad_accum", "nice_numbers", "adamw8bit"])
def test_planned_peak_is_within_15_percent_of_measured(family, toggles):
    cfg = hf(family, preset="small", steps=1, warmup_steps=0, toggles=toggles)
    measured = run(cfg)
    planned = estimate(cfg)
    error = (planned.peak_bytes - measured.peak_mem_bytes) / measured.peak_mem_bytes
    assert abs(error) < 0.15, f"planned {planned.peak_bytes:,} vs measured {measured.peak_mem_bytes:,}: {error:+.1%}"
    assert planned.params_bytes == measured.params_bytes and planned.grads_bytes == measured.grads_bytes
    assert planned.flops_per_step == measured.flops_per_step


def test_the_ladder_climbs_an_hf_model_and_skips_what_this_machine_cannot_run():
    results = ladder(hf("gpt2", steps=2, warmup_steps=0), rungs=("tf32", "sdpa", "nice_numbers"))
    assert [r.label for r in results] == ["baseline", "+ tf32", "+ sdpa", "+ nice_numbers"]
    assert results[1].status == "skipped" and "TF32" in results[1].error
    assert all(r.status == "ok" for r in (results[0], results[2], results[3]))


def test_the_lab_offers_the_architecture_toggles_for_an_hf_model_only():
    from scalekit import Lab
    from tests.helpers import Regressor, mse_loss, regression_batch

    lab = Lab(model=causal_lm("gpt2"), device="cpu")
    for name in ("sdpa", "nice_numbers"):
        assert not lab.controls[name].reasons and not lab.controls[name].widget.disabled
    plain = Lab(model=Regressor, batch_fn=regression_batch, loss_fn=mse_loss, device="cpu")
    assert "needs an attention switch, which your model (Regressor) does not have" in \
        plain.controls["sdpa"].reasons["sdpa"]
    lab.set(sdpa=True)
    assert lab.config().toggles == {"sdpa": True}
