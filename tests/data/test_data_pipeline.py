"""The raw data source gives the same batches, in the same order, as the pre-tokenized one without its transform;
its noise; its settings.  The data toggles' own checks are in tests/toggles/test_<name>.py."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from scalekit import RunConfig, run
from scalekit.data import noise
from scalekit.errors import ConfigError
from scalekit.toggles import TOGGLES
from tests.helpers import (
    CPU,
    SHAPES,
    Regressor,
    assert_same,
    batches,
    built,
    learns,
    mse_loss,
    regression_batch,
    tiny,
)


def test_the_raw_source_cuts_the_same_windows_in_the_same_order_as_the_training_format_source():
    # without its transform, the raw source is the pre-tokenized "shakespeare" source, batch for batch
    raw = batches(tiny(**{**SHAPES, "transform_rounds": 0}))
    assert_same(raw, batches(tiny(seq_len=4096, batch_size=100, data="shakespeare")))


def test_the_noise_touches_inputs_only_about_5_percent_and_fresh_each_epoch(raw_batches):
    clean = batches(tiny(**{**SHAPES, "transform_rounds": 0}))
    xs, ys = torch.cat([x for x, _ in raw_batches]), torch.cat([y for _, y in raw_batches])
    clean_x, clean_y = torch.cat([x for x, _ in clean]), torch.cat([y for _, y in clean])
    assert torch.equal(ys, clean_y)  # the targets stay clean
    changed = (xs != clean_x).float().mean().item()
    assert 0.03 < changed < noise.NOISE_RATE  # a replacement can draw the same character
    assert torch.equal(xs[:, 1:] == clean_x[:, 1:], xs[:, 1:] == ys[:, :-1])  # x is y shifted, where not noised
    # the first epoch's 245 windows come back in the next: the same windows, with different noise
    first = {tuple(c.tolist()): x for c, x in zip(clean_y[:245], xs[:245], strict=True)}
    again = [(first[tuple(c.tolist())], x) for c, x in zip(clean_y[245:490], xs[245:490], strict=True)]
    assert len(again) == 245 and sum(not torch.equal(a, b) for a, b in again) > 240


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**63 - 1), first_draw=st.integers(0, 2**40), rounds=st.integers(1, 6),
       vocab=st.integers(2, 50257), rows=st.integers(1, 4), length=st.integers(1, 40))
def test_noise_on_a_batch_is_the_per_sample_loop_number_for_number(seed, first_draw, rounds, vocab, rows, length):
    x = torch.randint(0, vocab, (rows, length))
    draws = torch.arange(first_draw, first_draw + rows)
    looped = [noise.noise_sample(x[r].tolist(), first_draw + r, seed, rounds, vocab) for r in range(rows)]
    assert noise.noise_batch(x, draws, seed, rounds, vocab).tolist() == looped


def test_a_run_on_the_raw_source_learns_and_reports_its_data_wait():
    result = run(tiny(data="shakespeare-raw", transform_rounds=2, steps=24, warmup_steps=1, log_every=6))
    assert result.status == "ok" and learns(result), result.losses
    assert result.config["transform_rounds"] == 2 and result.data_wait_frac > 0


@pytest.mark.parametrize("kwargs,words", [
    (dict(data="shakespeare", transform_rounds=4), "RunConfig.transform_rounds"),
    (dict(data="shakespeare-raw", transform_rounds=-1), "RunConfig.transform_rounds must be an integer >= 0"),
    (dict(data="shakespeare-raw", transform_rounds=True), "RunConfig.transform_rounds"),
    (dict(data="shakespeare-raw", transform_rounds="8"), "RunConfig.transform_rounds"),
    (dict(data="shakespeare-raws"), "allowed: auto, shakespeare, shakespeare-raw, synthetic"),
])
def test_bad_data_settings_are_refused_naming_the_field(kwargs, words):
    with pytest.raises(ConfigError, match=words):
        RunConfig(**kwargs)


def test_the_raw_source_resolves_its_default_cost():
    from scalekit.data import DEFAULT_TRANSFORM_ROUNDS

    assert RunConfig(data="shakespeare-raw").resolve(CPU).transform_rounds == DEFAULT_TRANSFORM_ROUNDS
    assert RunConfig(data="shakespeare").resolve(CPU).transform_rounds is None
    with pytest.raises(ConfigError, match="RunConfig.transform_rounds"):  # 'auto' that is not the raw source
        RunConfig(data="auto", transform_rounds=3).resolve(CPU)


@pytest.mark.parametrize("name", ["training_format", "vectorized_transforms"])
def test_data_toggles_say_when_they_change_nothing_also_for_a_users_model(name):
    with built(tiny(data="synthetic", toggles=[name])) as ctx:
        assert any(name in note and "changes nothing" in note for note in ctx.notes)
    # a user's batch_fn makes its own batches: the toggle says so, not that it "changes the built-in GPT"
    with built(RunConfig(model=Regressor, batch_fn=regression_batch, loss_fn=mse_loss, toggles=[name],
                         device="cpu")) as ctx:
        said = [note for note in ctx.notes if name in note]
        assert said and "changes nothing" in said[0] and "built-in GPT" not in said[0]
    assert TOGGLES[name].available(CPU)[0]
