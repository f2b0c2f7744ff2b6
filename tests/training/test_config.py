"""Bad input gets a clear error naming the field and the allowed values; fuzzed with hypothesis."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scalekit import ConfigError, RunConfig, ToggleUnavailable, detect, run
from scalekit.toggles import TOGGLES
from scalekit.training.config import PRESET_NAMES
from tests.helpers import Regressor, mse_loss, regression_batch


@pytest.mark.parametrize("kwargs,words", [
    (dict(batch_size=-1), ["RunConfig.batch_size", "positive integer", "-1"]),
    (dict(batch_size=0), ["RunConfig.batch_size"]),
    (dict(steps=2.5), ["RunConfig.steps"]),
    (dict(warmup_steps=-1), ["RunConfig.warmup_steps", ">= 0"]),
    (dict(toggles=["warp_drive"]), ["unknown toggle 'warp_drive'", "allowed:", "compile", "bf16"]),
    (dict(toggles={"compile": "fastest"}), ["RunConfig.toggles['compile']", "'max-autotune'"]),
    (dict(toggles={"bf16": "yes"}), ["RunConfig.toggles['bf16']", "True"]),
    (dict(toggles=["bf16", "fp16"]), ["'bf16' and 'fp16' cannot be on together"]),
    (dict(preset="gpt5"), ["RunConfig.preset", "unknown preset 'gpt5'", "tiny", "gpt2-124m"]),
    (dict(data="wikipedia"), ["RunConfig.data", "shakespeare", "synthetic"]),
    (dict(device="tpu"), ["RunConfig.device", "'cuda:N'"]),
    (dict(lr=0), ["RunConfig.lr"]),
    (dict(model=Regressor), ["model, batch_fn (or dataset) and loss_fn go together"]),
    (dict(toggles=7), ["RunConfig.toggles must be a list"]),
])
def test_bad_input_names_the_field_and_allowed_values(kwargs, words):
    with pytest.raises(ConfigError) as info:
        RunConfig(**kwargs)
    for word in words:
        assert word in str(info.value)


def test_toggle_unavailable_on_this_hardware_says_why():
    cpu = detect("cpu")
    with pytest.raises(ToggleUnavailable, match="'tf32' is unavailable on this machine: TF32 .* CPU"):
        run(RunConfig(preset="tiny", toggles=["tf32"], device="cpu"), hw=cpu)


def test_gpt_only_toggles_are_refused_for_your_own_model():
    with pytest.raises(ToggleUnavailable, match=r"'sdpa' needs an attention switch, which your model \(Regressor\)"):
        RunConfig(model=Regressor, batch_fn=regression_batch, loss_fn=mse_loss, toggles=["sdpa"])


def test_toggles_are_normalised_to_application_order():
    cfg = RunConfig(toggles={"fused_adamw": True, "compile": True, "bf16": False})
    assert list(cfg.toggles) == ["compile", "fused_adamw"]
    assert cfg.toggles["compile"] == "default"
    assert cfg.describe() == "compile + fused_adamw"


def test_resolve_fills_in_the_preset_defaults():
    cfg = RunConfig().resolve(detect("cpu"))
    assert (cfg.preset, cfg.batch_size, cfg.seq_len, cfg.data) == ("tiny", 8, 64, "shakespeare")
    assert cfg.label == "baseline"


anything = st.one_of(st.none(), st.booleans(), st.integers(-5, 2**40), st.floats(allow_nan=True),
                     st.text(max_size=12), st.lists(st.text(max_size=8), max_size=3))
toggle_values = st.dictionaries(st.sampled_from([*TOGGLES, "bogus"]),
                                st.one_of(st.booleans(), st.none(), st.sampled_from(["default", "max-autotune", 3])),
                                max_size=4)
FIELDS = ["preset", "batch_size", "seq_len", "steps", "warmup_steps", "log_every", "data", "lr", "seed", "device",
          "peak_tflops", "tokens_per_sample"]


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(FIELDS), value=anything, toggles=toggle_values)
def test_fuzzed_configs_either_validate_or_raise_config_error(field, value, toggles):
    try:
        cfg = RunConfig(toggles=toggles, **{field: value})
    except ConfigError as exc:
        assert "RunConfig" in str(exc) or "toggle" in str(exc)
        return
    # whatever was accepted is runnable in shape: positive sizes, known names
    assert cfg.preset in PRESET_NAMES
    for name in ("batch_size", "seq_len"):
        v = getattr(cfg, name)
        assert v is None or (isinstance(v, int) and v > 0)
    assert cfg.steps > 0 and cfg.log_every > 0 and cfg.warmup_steps >= 0
    assert set(cfg.toggles) <= set(TOGGLES)
    resolved = cfg.resolve(detect("cpu"))
    assert resolved.batch_size > 0 and resolved.seq_len > 0
    assert dataclasses.asdict(resolved)  # plain data all the way down


@settings(max_examples=100, deadline=None)
@given(preset=st.sampled_from(PRESET_NAMES), batch=st.integers(1, 64), seq=st.integers(1, 256))
def test_fuzzed_valid_sizes_resolve(preset, batch, seq):
    cfg = RunConfig(preset=preset, batch_size=batch, seq_len=seq).resolve(detect("cpu"))
    assert (cfg.batch_size, cfg.seq_len) == (batch, seq)
