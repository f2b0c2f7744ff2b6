"""No silent no-ops and no wrong words: a toggle given twice is refused, a setting that changes nothing says
so, an adapter rank beyond a layer is refused naming the layer, and generation's errors name what is at
fault (the prompt, GenerateConfig's own fields)."""

from __future__ import annotations

import pytest

from scalekit import ConfigError, RunConfig, run
from scalekit.cli.main import main
from scalekit.inference import GenerateConfig, generate
from tests.helpers import tiny

QUICK = dict(measure_memory=False, steps=2, warmup_steps=0, log_every=1)


# -- a toggle given twice --------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["generate", "--toggle", "quantize=hqq-4bit", "--toggle", "quantize=bnb-nf4"],
    ["bench", "--toggle", "bf16", "--toggle", "bf16"],
    ["plan", "--toggle", "grad_accum=2", "--toggle", "grad_accum=4"],
    ["export", "hf", "--toggle", "bf16", "--toggle", "bf16=1"],
    ["tune", "--toggle", "compile", "--toggle", "compile=max-autotune"],
])
def test_a_toggle_given_twice_on_the_command_line_is_refused(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--toggle" in err and "twice" in err and argv[2].split("=")[0] in err, err


def test_a_toggle_named_twice_in_a_list_is_refused():
    with pytest.raises(ConfigError, match=r"RunConfig\.toggles: 'bf16' is given twice"):
        RunConfig(toggles=["bf16", "fused_adamw", "bf16"])
    with pytest.raises(ConfigError, match=r"GenerateConfig\.toggles: 'kv_cache' is given twice"):
        GenerateConfig(toggles=["kv_cache", "kv_cache"])


# -- settings that change nothing say so ------------------------------------------------------------------------
def test_data_echo_1_says_it_changes_nothing():
    result = run(tiny(toggles={"data_echo": 1}, **QUICK))
    assert result.status == "ok"
    assert any("data_echo=1 changes nothing" in n for n in result.notes), result.notes


def test_eval_every_beyond_the_steps_says_no_evaluation_runs():
    result = run(tiny(eval_every=50, toggles={"kv_cache": "static"}, eval_new_tokens=4, **QUICK))
    assert result.status == "ok" and not result.evals
    note = next(n for n in result.notes if "eval_every" in n)
    assert "eval_every=50" in note and "steps=2" in note and "no evaluation" in note and "kv_cache" in note


def test_eval_every_within_the_steps_evaluates_without_that_note():
    result = run(tiny(eval_every=2, **QUICK))
    assert result.evals and not any("no evaluation" in n for n in result.notes)


# -- an adapter rank beyond a layer ---------------------------------------------------------------------------------
@pytest.mark.parametrize("toggle", ["lora", "dora"])
def test_an_adapter_rank_above_a_layers_width_is_refused_naming_the_layer(toggle):
    pytest.importorskip("peft")
    from scalekit.training.finetune import finetune_config

    with pytest.raises(ConfigError, match=rf"RunConfig\.toggles\['{toggle}'\]=10000.*'transformer\.h\.0\.attn\.c_attn'"
                                          r".*128.*at most 128"):
        run(finetune_config(toggles={toggle: 10000}, **QUICK))


def test_an_adapter_rank_at_the_width_is_accepted():
    pytest.importorskip("peft")
    from scalekit.training.finetune import finetune_config

    assert run(finetune_config(toggles={"lora": 128}, **QUICK)).status == "ok"


# -- generation's words ----------------------------------------------------------------------------------------------
def test_a_prompt_longer_than_the_context_blames_the_prompt():
    with pytest.raises(ConfigError) as info:
        GenerateConfig(prompts="ROMEO: " * 200, max_new_tokens=10)  # 1,400 characters; the context is 1,024
    words = str(info.value)
    assert words.startswith("GenerateConfig.prompts") and "1400 tokens" in words and "1024" in words
    assert "-" not in words.split("tokens")[0] and "at most 1023" in words, words


def test_the_cli_names_the_prompt_flag_for_a_prompt_too_long(capsys):
    assert main(["generate", "--prompt", "x" * 1100, "--max-new-tokens", "4"]) == 2
    err = capsys.readouterr().err
    assert "(flag: --prompt" in err and "-26" not in err and err.count("\n") == 1


def test_a_prompt_that_fits_but_leaves_too_few_tokens_still_names_max_new_tokens():
    with pytest.raises(ConfigError, match=r"GenerateConfig\.max_new_tokens.*at most 24 new tokens"):
        GenerateConfig(prompts="x" * 1000, max_new_tokens=100)


def test_generation_errors_name_generate_config_not_run_config(capsys):
    with pytest.raises(ConfigError) as info:
        generate(GenerateConfig(device="cuda", quality=False))
    assert "GenerateConfig.device" in str(info.value) and "RunConfig" not in str(info.value)
    assert main(["generate", "--device", "cuda:0"]) == 2
    err = capsys.readouterr().err
    assert "GenerateConfig.device" in err and "(flag: --device)" in err and "RunConfig" not in err


def test_generation_of_your_own_model_names_generate_config():
    with pytest.raises(ConfigError) as info:
        GenerateConfig(model=42)
    assert "GenerateConfig.model" in str(info.value)
    with pytest.raises(ConfigError) as info:
        GenerateConfig(model=lambda: None, toggles={"sdpa": True})  # a GPT-only toggle on your own model
    assert "GenerateConfig.model" in str(info.value) and "RunConfig" not in str(info.value)


def test_the_allowed_models_are_listed_once_each():
    with pytest.raises(ConfigError) as info:
        GenerateConfig(model="nope")
    allowed = str(info.value).split("allowed: ", 1)[1].split(", or")[0].split(", ")
    assert len(allowed) == len(set(allowed)) and "shakespeare-char" in allowed, allowed


def test_a_stopped_generation_is_said_once():
    import threading

    from scalekit.inference.report import generation_table

    stop = threading.Event()
    r = generate(GenerateConfig(max_new_tokens=50, quality=False, warmup_tokens=0, device="cpu"),
                 on_token=lambda record: stop.set() if record.index == 3 else None, stop=stop)
    assert r.status == "stopped"
    row = generation_table([r]).splitlines()[2]
    assert row.count("stopped") == 1, row


def test_a_generation_stopped_in_its_warm_up_says_why():
    import threading

    from scalekit.inference.report import generation_table

    stop = threading.Event()  # pressed as the warm-up starts (a stop before the start builds nothing at all)
    r = generate(GenerateConfig(max_new_tokens=20, quality=False, warmup_tokens=8, device="cpu"), stop=stop,
                 on_status=lambda words: stop.set() if words.startswith("warm-up") else None)
    assert r.status == "stopped"
    row = generation_table([r]).splitlines()[2]
    assert "warm-up" in row and row.count("stopped") == 1, row


def test_a_tokenizer_whose_decode_fails_keeps_the_generation():
    class Tok:
        def encode(self, text):
            return [1, 2, 3]

        def decode(self, ids):
            raise TypeError("cannot decode")

    r = generate(GenerateConfig(model="tiny", prompts="abc", tokenizer=Tok(), max_new_tokens=3, quality=False,
                                warmup_tokens=0, device="cpu"))
    assert r.status == "ok" and r.new_tokens == 3 and any("not decoded" in n for n in r.notes), (r.error, r.notes)
