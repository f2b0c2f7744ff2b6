"""Your model everywhere scalekit is used: what applies to it (scalekit.applicable, `scalekit toggles
--hf-model`), the command line's --hf-model and the presets' fitting defaults, the Lab and autotune."""

from __future__ import annotations

import pytest

import scalekit
from scalekit import GenerateConfig, RunConfig, applicable
from scalekit.cli.main import main
from scalekit.toggles import ORDER
from tests.helpers import CPU, ConvNet, classify_loss, image_batch, one_thread

transformers = pytest.importorskip("transformers")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


def test_applicable_answers_every_toggle_in_both_loops_with_a_reason():
    from scalekit.hf import causal_lm

    table = applicable(causal_lm("llama"), hw=CPU)
    assert len(table.frame) == 2 * len(ORDER) and set(table.frame.loop) == {"train", "generate"}
    assert table.status("kv_cache", "generate") == ("applies", "")
    assert table.status("sdpa", "train") == ("applies", "")
    status, why = table.status("tf32", "train")
    assert status == "applies here only on a GPU" and "CPU" in why
    status, why = table.status("dataloader_pin_memory", "train")
    assert status == "applies here only on a GPU"
    assert table.status("quantize", "train")[0] == "does not apply"
    assert all(r.reason for r in table.frame.itertuples() if r.status != "applies")  # every refusal says why
    assert "what applies to Hugging Face LlamaForCausalLM" in str(table)
    generation = table.in_loop("generate")  # the toggles that act in generation, each once
    assert set(generation.frame.loop) == {"generate"}
    assert list(generation.frame.toggle) == [t.name for t in ORDER if "generate" in t.loops]
    assert {"kv_cache", "quantize", "speculative", "bf16", "tf32"} <= set(generation.frame.toggle)
    assert "lora" not in set(generation.frame.toggle)
    assert generation.status("kv_cache", "generate") == ("applies", "")
    html = generation._repr_html_()
    assert max(len(r) for r in generation.frame.reason) > 50 and all(r in html for r in generation.frame.reason)
    with pytest.raises(ValueError, match=r"loop must be one of \['train', 'generate'\], got 'decode'"):
        table.in_loop("decode")


def test_applicable_for_a_convnet_and_a_batch_fn_names_the_model_and_the_data():
    cfg = RunConfig(model=ConvNet, batch_fn=image_batch, loss_fn=classify_loss)
    table = applicable(cfg, hw=CPU)
    assert table.status("sdpa", "train") == ("does not apply",
                                             "sdpa needs an attention switch, which your model (ConvNet) does not have")
    status, why = table.status("kv_cache", "generate")
    assert status == "does not apply" and "your model (ConvNet) follows neither" in why
    status, why = table.status("dataloader_num_workers", "train")
    assert status == "does not apply" and "batches your batch_fn makes" in why and "RunConfig.dataset" in why
    assert table.status("bf16", "train") == ("applies", "")
    builtin = applicable(None, hw=CPU)
    assert builtin.family == "the built-in GPT" and builtin.status("nice_numbers", "train") == ("applies", "")


def test_scalekit_toggles_hf_model_prints_the_table(capsys):
    assert main(["toggles", "--hf-model", "gpt2", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "what applies to Hugging Face GPT2LMHeadModel" in out
    assert "kv_cache" in out and "applies here only on a GPU" in out


def test_generate_on_a_preset_fits_its_context_and_takes_the_quality_window(capsys):
    assert main(["generate", "--model", "tiny", "--device", "cpu", "--warmup-tokens", "0"]) == 0
    out = capsys.readouterr().out
    assert "perplexity" in out  # quality measured in windows cut to the preset's 64 positions
    code = main(["generate", "--model", "tiny", "--device", "cpu", "--max-new-tokens", "4", "--quality-seq-len",
                 "100"])
    assert code == 2 and "GenerateConfig.quality_seq_len (100)" in capsys.readouterr().err
    assert GenerateConfig(model="tiny", max_new_tokens=5).quality_window() == 63


def test_generate_and_ladder_inference_take_a_hugging_face_model(capsys):
    assert main(["generate", "--hf-model", "llama", "--model", "tiny", "--device", "cpu", "--max-new-tokens", "6",
                 "--warmup-tokens", "0", "--toggle", "kv_cache=static", "--no-quality"]) == 0
    assert "ROMEO:" in capsys.readouterr().out
    from scalekit.cli.main import _generate_config, parser

    args = parser().parse_args(["ladder", "inference", "--hf-model", "gpt2", "--preset", "tiny", "--device", "cpu"])
    cfg = _generate_config(args, {}, ladder=True)
    assert cfg.family().family == "Hugging Face GPT2LMHeadModel" and cfg.max_new_tokens == 58
    args = parser().parse_args(["tune", "--generate", "--hf-model", "llama", "--preset", "tiny", "--device", "cpu"])
    assert _generate_config(args, {}, ladder=True).family().family == "Hugging Face LlamaForCausalLM"


def test_the_lab_takes_your_model_and_dataset_and_the_generation_lab_a_hugging_face_model():
    pytest.importorskip("ipywidgets")
    from tests.test_user_dataset import NoisyWindows, TinyLM, lm_loss

    lab = scalekit.Lab(model=TinyLM, dataset=NoisyWindows(), loss_fn=lm_loss, device="cpu", steps=2, hw=CPU)
    assert not lab.controls["dataloader_num_workers"].widget.disabled  # your DataLoader: the workers act on it
    assert lab.controls["training_format"].widget.disabled
    from scalekit.hf import model_config

    tok_vocab = {chr(97 + i): i for i in range(26)}
    tokenizers = pytest.importorskip("tokenizers")
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({**tok_vocab, "[UNK]": 26}, unk_token="[UNK]"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Split("", "isolated")
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    model = transformers.AutoModelForCausalLM.from_config(model_config("llama", "tiny"))
    gen = scalekit.Lab(task="generate", model=model, tokenizer=tok, prompts="abc", device="cpu", hw=CPU,
                       measure_memory=False, warmup_tokens=0, quality=False)
    assert gen.base_config.max_new_tokens == 61  # 200, cut to the 64 positions the model holds
    assert not gen.controls["kv_cache"].widget.disabled and not gen.controls["sdpa"].widget.disabled
    gen.set(kv_cache="static")
    gen.max_new_tokens.value = 5
    gen.run_button.click()
    result = gen.wait(120)
    assert result.status == "ok", result.error
    assert result.texts[0].replace(" ", "").startswith("abc")


def test_generation_autotune_on_your_model_tries_only_what_its_family_takes(monkeypatch):
    from scalekit.autotune import generation
    from tests.test_autotune import ScriptedGeneration
    from tests.test_generate_families import FastLM

    scripted = ScriptedGeneration(speed={"kv_cache": 3.0}, agreement={})
    monkeypatch.setattr(generation, "generate", scripted)
    result = scalekit.autotune(GenerateConfig(model=FastLM(), prompts=[[1, 2, 3]], max_new_tokens=20, device="cpu"),
                               time_budget_s=600, run_steps=10_000, hw=CPU)
    c = {cand.label.split(" (")[0]: cand for cand in result.search.candidates}
    assert "sdpa" not in c  # no attention switch: not searched
    assert not c["kv_cache=dynamic"].accepted and "keeps the static cache" in c["kv_cache=dynamic"].reason
    assert c["kv_cache=static"].accepted and result.best.toggles["kv_cache"] == "static"
    assert all(call.get("kv_cache") != "dynamic" for call in scripted.calls)  # refused before it ran


@pytest.mark.slow
def test_a_hugging_face_model_is_tuned_for_generation_for_real():
    from scalekit.hf import causal_lm

    cfg = GenerateConfig(model=causal_lm("llama"), prompts=[[1, 2, 3]], device="cpu", measure_memory=False)
    result = scalekit.autotune(cfg, time_budget_s=8, run_steps=10_000, hw=CPU)
    assert result.search.candidates and all(c.reason for c in result.search.candidates)
    assert not any("Traceback" in c.reason or "Error:" in c.reason for c in result.search.candidates), \
        [c.reason for c in result.search.candidates]
    assert result.best.max_new_tokens == 61  # the config's own length (200 cut to the context) is kept
