"""scalekit.generate: what it measures, what it refuses (with the field named), and how it ends."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from scalekit import ConfigError, ToggleUnavailable
from scalekit.inference import GenerateConfig, GenerateResult, compare_generations, generate
from scalekit.inference.weights import weight_bytes
from scalekit.models import load_pretrained
from tests.helpers import CPU, one_thread

QUICK = dict(measure_memory=False, quality=False, warmup_tokens=0, device="cpu")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


def test_a_generation_measures_its_parts_and_keeps_the_per_token_series():
    r = generate(max_new_tokens=40, toggles={"kv_cache": "static"}, device="cpu", warmup_tokens=4, hw=CPU)
    assert isinstance(r, GenerateResult) and r.status == "ok"
    assert r.new_tokens == 40 and len(r.token_ids[0]) == 40 and len(r.token_ms) == 39
    assert r.texts[0].startswith("ROMEO:") and len(r.texts[0]) == len("ROMEO:") + 40
    assert 0 < r.prefill_ms <= r.ttft_ms <= 1e3 * r.total_s
    assert r.decode_ms.n == 39 and r.decode_ms.min <= r.decode_ms.median <= r.decode_ms_p90 <= r.decode_ms.max
    assert r.decode_tokens_per_s == pytest.approx(1e3 / r.decode_ms.median)
    assert r.decode_tokens_per_s_wall == pytest.approx(39 / (sum(r.token_ms) / 1e3))
    assert r.warmup_s is not None and r.compile_s is None  # nothing compiled
    assert r.weight_bytes == r.weight_bytes_before == weight_bytes(load_pretrained()) == 932_736 * 4
    # live tensors at the peak: at least the weights and the whole cache
    assert r.peak_mem_bytes >= r.weight_bytes + r.kv_cache_bytes and "live tensor" in r.mem_source
    assert r.perplexity == pytest.approx(r.reference_perplexity) and 3 < r.perplexity < 7
    assert r.agreement == 1.0  # the model as built, unchanged
    assert json.loads(json.dumps(r.to_dict(), default=str))["token_ms"] == r.token_ms


def test_seeded_sampling_repeats_and_depends_on_the_seed():
    cfg = GenerateConfig(max_new_tokens=30, temperature=0.8, top_k=20, **QUICK)
    a, b = generate(cfg, hw=CPU), generate(cfg, hw=CPU)
    c = generate(cfg, seed=7, hw=CPU)
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids
    assert generate(cfg, temperature=0.0, hw=CPU).token_ids != a.token_ids


def test_tokens_stream_to_the_callback_as_they_come():
    seen = []
    r = generate(max_new_tokens=20, on_token=seen.append, hw=CPU, **QUICK)
    assert [t.index for t in seen] == list(range(20))
    assert "".join(t.texts[0] for t in seen) == r.texts[0][len("ROMEO:"):]
    assert [t.token_ids[0] for t in seen] == r.token_ids[0]
    assert all(t.ms > 0 for t in seen) and seen[0].position == len("ROMEO:")


def test_stop_ends_the_generation_and_keeps_what_it_made():
    stop = threading.Event()

    def on_token(record):
        if record.index == 9:
            stop.set()

    r = generate(max_new_tokens=500, on_token=on_token, stop=stop, hw=CPU, **QUICK)
    assert r.status == "stopped" and r.new_tokens == 10 and len(r.token_ids[0]) == 10
    assert len(r.texts[0]) == len("ROMEO:") + 10 and any("stopped" in n for n in r.notes)


class Bigram(torch.nn.Module):
    """Not a GPT: logits from the last token alone."""

    def __init__(self, vocab=65):
        super().__init__()
        self.table = torch.nn.Embedding(vocab, vocab)

    def forward(self, idx):
        return self.table(idx)


def test_your_own_model_and_a_random_preset_generate():
    bigram = Bigram()
    mine = generate(model=bigram, max_new_tokens=12, hw=CPU, **QUICK)
    assert mine.status == "ok" and len(mine.token_ids[0]) == 12 and mine.texts[0].startswith("ROMEO:")
    # a bigram's greedy continuation follows its table: each token is the argmax of the previous one's row
    previous = [GenerateConfig().prompt_ids()[0][-1]] + mine.token_ids[0][:-1]
    assert mine.token_ids[0] == [int(bigram.table.weight[t].argmax()) for t in previous]
    # quality for any model that returns logits: perplexity on the shipped corpus (its vocabulary fits), and
    # agreement with itself as built
    measured = generate(model=bigram, max_new_tokens=3, hw=CPU, device="cpu", measure_memory=False)
    assert measured.perplexity == pytest.approx(measured.reference_perplexity) and measured.agreement == 1.0
    preset = generate(model="tiny", max_new_tokens=12, toggles={"kv_cache": "dynamic"}, hw=CPU, **QUICK)
    assert preset.status == "ok" and preset.weight_bytes == weight_bytes(_tiny())


def _tiny():
    from scalekit.models import GPT, PRESETS

    return GPT(PRESETS["tiny"].gpt_config())


def test_a_failing_model_is_a_failed_result_in_words():
    class Broken(torch.nn.Module):
        def forward(self, idx):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")

    r = generate(model=Broken(), max_new_tokens=5, hw=CPU, catch_errors=True, **QUICK)
    assert r.status == "failed" and "out of memory" in r.error and "9.00 GiB" in r.error
    with pytest.raises(torch.OutOfMemoryError):
        generate(model=Broken(), max_new_tokens=5, hw=CPU, **QUICK)


@pytest.mark.parametrize("fields,words", [
    (dict(model="huge"), "GenerateConfig.model: unknown model 'huge'; allowed: shakespeare-char"),
    (dict(model=3), "GenerateConfig.model must be a model name"),
    (dict(prompts=[]), "GenerateConfig.prompts must be"),
    (dict(prompts=["ok", ""]), "GenerateConfig.prompts[1]"),
    (dict(prompts=[[1, -2]]), "GenerateConfig.prompts[0]"),
    (dict(prompts="naïve"), "does not know 'ï'"),
    (dict(max_new_tokens=0), "GenerateConfig.max_new_tokens must be a positive integer from 1"),
    (dict(max_new_tokens=True), "GenerateConfig.max_new_tokens"),
    (dict(max_new_tokens=1019), "beyond the context of GenerateConfig.model 'shakespeare-char' (1024 positions): at most 1018"),
    (dict(temperature=-1), "GenerateConfig.temperature"),
    (dict(temperature="hot"), "GenerateConfig.temperature"),
    (dict(top_k=0), "GenerateConfig.top_k"),
    (dict(seed=-1), "GenerateConfig.seed"),
    (dict(device="tpu"), "GenerateConfig.device"),
    (dict(label=""), "GenerateConfig.label"),
    (dict(quality="yes"), "GenerateConfig.quality"),
    (dict(quality_seq_len=2048), "GenerateConfig.quality_seq_len"),
    (dict(tokenizer=object()), "GenerateConfig.tokenizer"),
    (dict(toggles=["fused_adamw"]), "'fused_adamw' applies to training, not to generation"),
    (dict(toggles=["nope"]), "unknown toggle 'nope'"),
    (dict(toggles={"kv_cache": "paged"}), "must be True or one of 'dynamic', 'static'"),
    (dict(toggles={"quantize": "int3"}), "'torchao-int8'"),
    (dict(model=Bigram(), toggles=["kv_cache"]), "your model (Bigram) follows neither of the two: forward(idx, "
                                                 "cache=..., input_pos=...)"),
    (dict(model=Bigram(), toggles=["sdpa"]), "needs an attention switch, which your model (Bigram) does not have"),
    (dict(model=Bigram(), prompts=["a", "bc"]), "give prompts of one length"),
    (dict(prompts=[[1, 2, 65]]), "GenerateConfig.prompts[0] holds token id 65, outside the model's vocabulary of "
                                 "65 ids (allowed: 0 to 64)"),
    (dict(model="tiny", prompts=[[1] * 65]), "GenerateConfig.prompts[0] is 65 tokens, longer than the model's "
                                             "context of 64 positions"),
    (dict(model="tiny", max_new_tokens=8, quality_seq_len=65), "GenerateConfig.quality_seq_len (65) is beyond the model's context"),
    (dict(quality_tokens=[1, 2]), "GenerateConfig.quality_tokens must be a 1-D list"),
    (dict(quality_tokens=[1, 2, 99]), "GenerateConfig.quality_tokens holds token id 99"),
])
def test_bad_input_is_refused_with_the_field_named(fields, words):
    with pytest.raises(ConfigError) as info:
        GenerateConfig(**fields)
    assert words in str(info.value)


def test_unavailable_methods_say_why():
    with pytest.raises(ToggleUnavailable, match="CUDA GPUs only"):
        generate(toggles={"quantize": "gptq"}, hw=CPU, **QUICK)
    with pytest.raises(ConfigError, match="bf16 autocast"):
        generate(toggles={"quantize": "torch-dynamic-int8", "bf16": True}, hw=CPU, **QUICK)


def test_results_compare_side_by_side_and_write_atomically(tmp_path):
    a = generate(max_new_tokens=20, hw=CPU, **QUICK)
    b = generate(max_new_tokens=20, toggles={"kv_cache": "static"}, hw=CPU, **QUICK)
    df = compare_generations([a, b])
    assert df["run"].tolist() == ["baseline", "kv_cache=static"]
    assert df["speedup"].tolist() == pytest.approx([1.0, b.decode_tokens_per_s / a.decode_tokens_per_s])
    path = tmp_path / "g.json"
    b.to_json(path)
    assert json.loads(path.read_text())["token_ids"] == b.token_ids
    assert [p.name for p in tmp_path.iterdir()] == ["g.json"]  # no temporary file left


def test_generate_with_no_gpu_refuses_cuda():
    with pytest.raises(ConfigError, match="GenerateConfig.device|no CUDA GPU"):
        generate(device="cuda", **{k: v for k, v in QUICK.items() if k != "device"})


class Interrupted(Bigram):
    """A model the user interrupts (Ctrl-C) during its `at`-th forward call."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.calls = at, 0

    def forward(self, idx):
        self.calls += 1
        if self.calls == self.at:
            raise KeyboardInterrupt
        return super().forward(idx)


@pytest.mark.parametrize("at,status,tokens,note", [
    (2, "stopped", 0, "stopped during the warm-up: nothing was measured"),  # warm-up: 4 calls
    (4 + 6, "stopped", 5, "the tokens generated so far are kept"),  # the measured generation: calls 5 to 14
    (4 + 10 + 3, "stopped", 10, "while measuring memory or quality"),  # the memory probe: calls 15 on
])
def test_ctrl_c_keeps_what_was_measured(at, status, tokens, note):
    model = Interrupted(at)
    r = generate(model=model, max_new_tokens=10, warmup_tokens=4, device="cpu", hw=CPU, catch_errors=True)
    assert r.status == status and len(r.token_ids[0] if r.token_ids else []) == tokens, (r.status, r.token_ids)
    assert any(note in n for n in r.notes), r.notes
    if tokens == 10:  # interrupted after the generation: its figures are all there, the probe's are not
        assert len(r.token_ms) == 9 and r.decode_tokens_per_s and r.peak_mem_bytes is None
