"""Inference in the training loop: RunConfig(eval_every=N) evaluates between steps under the generation
toggles, apart from the steps' times, and reports the share of the wall time it took."""

from __future__ import annotations

import math

import pytest
import torch

from scalekit import ConfigError, RunConfig, run
from scalekit.training.evaluation import Evaluator, heldout_batches
from tests.helpers import CPU, Regressor, built, mse_loss, regression_batch, tiny


def test_a_run_evaluates_every_n_steps_and_reports_the_share_of_wall_time():
    r = run(tiny(steps=6, warmup_steps=1, log_every=2, eval_every=2, eval_new_tokens=12,
                 toggles=["inference_mode", "kv_cache"]), hw=CPU)
    assert r.status == "ok", r.error
    assert [e["step"] for e in r.evals] == [2, 4, 6]  # after measured steps 2, 4 and 6 (warm-up step 0 apart)
    assert all(len(e["text"]) == 12 and e["eval_ms"] > 0 and e["sample_tokens_per_s"] > 0 for e in r.evals)
    assert r.evals[-1]["loss"] < r.evals[0]["loss"]  # the model is learning
    assert r.eval_s == pytest.approx(sum(e["eval_ms"] for e in r.evals) / 1e3)
    assert 0 < r.eval_share < 1 and r.eval_share == pytest.approx(r.eval_s / r.measured_wall_s)
    # evaluation is outside the step times: it is not in any measured step's ms
    assert sum(s.step_ms for s in r.steps if not s.warmup) / 1e3 + r.eval_s <= r.measured_wall_s * 1.01


def test_the_evaluation_runs_under_the_generation_toggles_and_leaves_training_as_it_was():
    with built(tiny(eval_every=3, toggles=["inference_mode", "kv_cache"])) as ctx:
        assert ctx.inference_context is torch.inference_mode and ctx.kv_cache == "dynamic"
        assert isinstance(ctx.evaluator, Evaluator)
        seen = []
        ctx.base_model.lm_head.register_forward_hook(lambda m, i, o: seen.append(torch.is_inference_mode_enabled()))
        ctx.evaluator.loss()
        assert seen and all(seen) and ctx.base_model.training  # back in training mode afterwards
    with built(tiny()) as ctx:
        assert ctx.evaluator is None and ctx.inference_context is torch.no_grad and ctx.kv_cache is None


def test_the_held_out_batches_are_the_validation_split_fixed():
    cfg = tiny(eval_every=1, eval_batches=3).resolve(CPU)
    a, b = heldout_batches(cfg, CPU.device), heldout_batches(cfg, CPU.device)
    assert len(a) == 3 and all(torch.equal(x[0], y[0]) for x, y in zip(a, b, strict=True))
    x, y = a[0]
    assert x.shape == (cfg.batch_size, cfg.seq_len) and torch.equal(x[:, 1:], y[:, :-1])


def test_fine_tuning_data_is_evaluated_on_its_own_held_out_split_not_on_its_training_text():
    import numpy as np

    from scalekit.data import load_tokens

    cfg = tiny(data="new-plays", eval_every=1, eval_batches=1).resolve(CPU)
    x, _ = heldout_batches(cfg, CPU.device)[0]
    heldout = np.asarray(load_tokens("new-plays-heldout"))
    first = torch.from_numpy(heldout[:cfg.seq_len].astype(np.int64))
    assert torch.equal(x[0], first)  # the held-out split's first window, not the corpus's validation text
    val = np.asarray(load_tokens("val"))
    assert not torch.equal(x[0], torch.from_numpy(val[:cfg.seq_len].astype(np.int64)))


def test_your_own_model_is_evaluated_on_batches_made_once():
    r = run(RunConfig(model=Regressor, batch_fn=regression_batch, loss_fn=mse_loss, steps=4, warmup_steps=0,
                      eval_every=2, device="cpu"), hw=CPU)
    assert r.status == "ok" and [e["step"] for e in r.evals] == [1, 3]


@pytest.mark.parametrize("fields,words", [
    (dict(toggles=["kv_cache"]), "set RunConfig.eval_every"),
    (dict(toggles=["inference_mode"]), "set RunConfig.eval_every"),
    (dict(toggles={"quantize": "bnb-nf4"}, eval_every=2), "replaces the model's weights"),
    (dict(eval_new_tokens=5), "set RunConfig.eval_every too"),
    (dict(eval_every=-1), "RunConfig.eval_every"),
    (dict(eval_every=2, eval_batches=0), "RunConfig.eval_batches"),
])
def test_bad_evaluation_settings_are_refused_with_the_field_named(fields, words):
    with pytest.raises(ConfigError, match=words.replace(".", r"\.")):
        tiny(**fields)


def test_a_sample_needs_the_built_in_gpt_on_the_corpus():
    with pytest.raises(ConfigError, match="eval_new_tokens"):
        run(tiny(data="synthetic", eval_every=2, eval_new_tokens=4), hw=CPU)
    with pytest.raises(ConfigError, match="eval_new_tokens must be at most"):
        run(tiny(eval_every=2, eval_new_tokens=1000), hw=CPU)


def test_a_hugging_face_model_is_evaluated_with_its_own_batches_and_writes_a_sample():
    pytest.importorskip("transformers")
    from scalekit.hf import causal_lm

    r = run(RunConfig(model=causal_lm("llama"), eval_every=2, eval_new_tokens=6, steps=4, warmup_steps=0,
                      device="cpu", measure_memory=False, toggles=["inference_mode", "kv_cache"]), hw=CPU)
    assert r.status == "ok", r.error
    assert [e["step"] for e in r.evals] == [1, 3] and all(math.isfinite(e["loss"]) for e in r.evals)
    assert len(r.evals[0]["text"]) == 6 and r.eval_share is not None
