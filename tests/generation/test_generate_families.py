"""Generation on every model family: Hugging Face causal LMs (their own caches), a model written the gpt-fast
way (setup_caches), a plain language model (no cache), each with the same greedy tokens however it is run."""

from __future__ import annotations

import pytest
import torch

from scalekit import ConfigError, ToggleUnavailable
from scalekit.inference import GenerateConfig, generate
from tests.helpers import CPU, FastLM, one_thread

transformers = pytest.importorskip("transformers")

QUICK = dict(measure_memory=False, quality=False, warmup_tokens=0, device="cpu")
PROMPTS = [[5, 9, 13, 2, 40, 7], [30, 1, 22, 4, 4, 11]]  # two prompts of one length (ids < 65)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


def hf_models():
    """Three families built offline from configs, with weights large enough that greedy tokens vary."""
    from scalekit.hf import model_config

    qwen2 = transformers.Qwen2Config(vocab_size=65, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
                                     initializer_range=0.3, bos_token_id=64, eos_token_id=64)
    configs = {"gpt2": model_config("gpt2", "tiny", dropout=0.0, initializer_range=0.3),
               "llama": model_config("llama", "tiny", initializer_range=0.3), "qwen2": qwen2}
    torch.manual_seed(0)
    return {name: transformers.AutoModelForCausalLM.from_config(c, attn_implementation="eager").eval()
            for name, c in configs.items()}


@pytest.fixture(scope="module")
def models():
    return hf_models()


def hf_generate(model, prompts, n: int) -> list[list[int]]:
    """transformers' own greedy generate(), with no end-of-sequence id, so that it makes exactly n tokens (no
    min_new_tokens: that would suppress the EOS id's logit, which scalekit's greedy steps do not)."""
    ids = torch.tensor(prompts)
    config = transformers.GenerationConfig(max_new_tokens=n, do_sample=False, pad_token_id=0)
    eos, model.generation_config.eos_token_id = model.generation_config.eos_token_id, None
    try:
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config, eos_token_id=None)
    finally:
        model.generation_config.eos_token_id = eos
    assert out.shape[1] == ids.shape[1] + n
    return out[:, ids.shape[1]:].tolist()


@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2"])
def test_hf_greedy_tokens_are_the_same_with_every_cache_and_equal_generate(models, family):
    model = models[family]
    runs = {name: generate(model=model, prompts=PROMPTS, max_new_tokens=12, toggles=toggles, hw=CPU, **QUICK)
            for name, toggles in [("none", {}), ("dynamic", {"kv_cache": "dynamic"}),
                                  ("static", {"kv_cache": "static"}), ("sdpa", {"kv_cache": "static", "sdpa": True}),
                                  ("inference_mode", {"kv_cache": "dynamic", "inference_mode": True})]}
    assert all(r.status == "ok" for r in runs.values()), {k: r.error for k, r in runs.items()}
    reference = hf_generate(model, PROMPTS, 12)
    assert len(set(map(str, reference))) == 2 and len(set(reference[0])) > 3  # tokens that vary: a real check
    for name, r in runs.items():
        assert r.token_ids == reference, name
    assert runs["dynamic"].kv_cache_bytes > 0 and runs["static"].kv_cache_bytes >= runs["dynamic"].kv_cache_bytes
    assert runs["none"].kv_cache_bytes == 0


@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2"])
def test_hf_batched_prompts_of_different_lengths_equal_each_prompt_alone(models, family):
    prompts = [[5, 9, 13, 2, 40, 7, 8, 3], [30, 1, 22]]
    for kind in ("dynamic", "static"):
        batched = generate(model=models[family], prompts=prompts, max_new_tokens=10, toggles={"kv_cache": kind},
                           hw=CPU, **QUICK)
        alone = [generate(model=models[family], prompts=[p], max_new_tokens=10, toggles={"kv_cache": kind}, hw=CPU,
                          **QUICK).token_ids[0] for p in prompts]
        assert batched.token_ids == alone, kind
        assert alone == [hf_generate(models[family], [p], 10)[0] for p in prompts]


def test_hf_model_from_a_config_or_causal_lm_generates_with_quality_and_a_tokenizer():
    from scalekit.hf import causal_lm, model_config

    config = model_config("llama", "tiny")
    by_config = generate(model=config, prompts="ROMEO:", max_new_tokens=6, hw=CPU, device="cpu", warmup_tokens=0,
                         measure_memory=False)
    by_spec = generate(model=causal_lm("llama", preset="tiny"), prompts="ROMEO:", max_new_tokens=6, hw=CPU,
                       device="cpu", warmup_tokens=0, measure_memory=False, toggles={"kv_cache": "static"})
    assert by_config.status == by_spec.status == "ok"
    assert by_config.token_ids == by_spec.token_ids  # the same seed, the same weights
    assert by_config.texts[0].startswith("ROMEO:")  # scalekit's character tokenizer decodes it
    assert 1 < by_config.perplexity and by_config.agreement == 1.0  # the shipped corpus fits a 65-id vocabulary
    ids = list(range(3, 60))
    given = generate(model=config, prompts="ROMEO:", max_new_tokens=4, hw=CPU, device="cpu", warmup_tokens=0,
                     measure_memory=False, quality_tokens=ids, quality_seq_len=16)
    assert given.perplexity != by_config.perplexity and given.agreement == 1.0


def test_a_transformers_tokenizer_encodes_and_decodes(models):
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {w: i for i, w in enumerate(["[UNK]", "to", "be", "or", "not", *[f"w{i}" for i in range(60)]])}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    backend.decoder = tokenizers.decoders.WordPiece()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    r = generate(model=models["llama"], prompts="to be or not", max_new_tokens=5, tokenizer=tok, hw=CPU, **QUICK)
    assert r.status == "ok" and r.texts[0].startswith("to be or not")
    assert r.texts[0] == tok.decode(tok.encode("to be or not") + r.token_ids[0])


def test_hf_quantize_reaches_gpt2s_conv1d_and_refuses_a_shape_that_does_not_fit(models):
    r = generate(model=models["gpt2"], prompts=PROMPTS, max_new_tokens=4, toggles={"quantize": "bnb-int8"}, hw=CPU,
                 device="cpu", warmup_tokens=0, measure_memory=False)
    assert r.status == "ok" and "8 linear layers" in " ".join(r.notes) and r.weight_bytes < r.weight_bytes_before
    assert 0 < r.agreement <= 1.0






@torch.no_grad()
def argmax_without_cache(model, prompts, n: int) -> list[list[int]]:
    """The no-cache loop: the whole sequence again every step (the model's cache rewritten at 0..T-1)."""
    seq = torch.tensor(prompts)
    model.setup_caches(seq.shape[0], seq.shape[1] + n)
    for _ in range(n):
        logits = model(seq, torch.arange(seq.shape[1]))
        seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return seq[:, len(prompts[0]):].tolist()


def test_a_gpt_fast_style_model_keeps_its_static_cache_and_makes_the_no_cache_tokens():
    torch.manual_seed(0)
    model = FastLM()
    for p in model.parameters():
        p.data.mul_(8)  # sharper logits: tokens that vary
    cached = generate(model=model, prompts=PROMPTS, max_new_tokens=14, toggles={"kv_cache": "static"}, hw=CPU, **QUICK)
    plain = generate(model=model, prompts=PROMPTS, max_new_tokens=14, hw=CPU, **QUICK)
    reference = argmax_without_cache(model, PROMPTS, 14)  # (scalekit generated from copies: model is as built)
    assert cached.status == plain.status == "ok", (cached.error, plain.error)
    assert cached.token_ids == plain.token_ids == reference and len(set(reference[0])) > 3
    assert cached.kv_cache_bytes == 2 * 2 * 2 * 20 * 32 * 4  # its own buffers: k and v, 2 layers, B=2, 20 positions
    with pytest.raises(ToggleUnavailable, match="keeps the static cache setup_caches allocates") as refused:
        GenerateConfig(model=model, prompts=PROMPTS, toggles={"kv_cache": "dynamic"})
    assert str(refused.value).startswith("GenerateConfig.model: toggle 'kv_cache'='dynamic': ")  # the value it refuses


class Bigram(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(65, 65)

    def forward(self, idx):
        return self.table(idx)


def test_a_model_without_a_cache_convention_is_told_both_and_a_convnet_is_refused_in_one_line():
    with pytest.raises(ToggleUnavailable) as info:
        GenerateConfig(model=Bigram(), toggles={"kv_cache": "static"})
    message = str(info.value)
    assert "your model (Bigram)" in message and "forward(idx, cache=..., input_pos=...)" in message
    assert "setup_caches(max_batch_size, max_seq_length)" in message and "\n" not in message
    from tests.helpers import ConvNet

    r = generate(model=ConvNet(), prompts=PROMPTS, max_new_tokens=3, hw=CPU, catch_errors=True, **QUICK)
    assert r.status == "failed" and "your model (ConvNet) cannot generate" in r.error and "\n" not in r.error


def test_hqq_refuses_a_layer_whose_size_its_groups_do_not_divide_naming_it():
    class Small(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(65, 16)
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(16, 10), torch.nn.Linear(10, 65)])

        def forward(self, idx):
            return self.blocks[1](self.blocks[0](self.emb(idx)))

    pytest.importorskip("hqq")
    r = generate(model=Small(), prompts=PROMPTS, max_new_tokens=2, toggles={"quantize": "hqq-4bit"}, hw=CPU,
                 catch_errors=True, **QUICK)
    assert r.status == "failed" and "layer blocks.0 (10×16 weight) does not fit: hqq quantizes groups of 64 values" \
        in r.error
    with pytest.raises(ConfigError, match="outside the model's vocabulary of 65 ids"):
        GenerateConfig(model=Small(), prompts=[[1, 70]])


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2"])
def test_hf_compiled_decode_over_a_static_cache_is_one_graph_with_the_eager_tokens(models, family):
    eager = generate(model=models[family], prompts=PROMPTS, max_new_tokens=10, toggles={"kv_cache": "static"},
                     hw=CPU, **QUICK)
    compiled = generate(model=models[family], prompts=PROMPTS, max_new_tokens=10, hw=CPU,
                        toggles={"kv_cache": "static", "compile": True}, **{**QUICK, "warmup_tokens": 4})
    assert compiled.status == "ok", compiled.error
    assert compiled.token_ids == eager.token_ids == hf_generate(models[family], PROMPTS, 10)
    assert compiled.recompiles_measured == 0 and compiled.graphs_compiled >= 1 and compiled.graph_breaks == 0


class MyCachedLM(torch.nn.Module):
    """A model of a user's own written to scalekit's convention: forward(idx, cache=..., input_pos=...)."""

    def __init__(self):
        super().__init__()
        from scalekit.models import GPT, GPTConfig

        self.inner = GPT(GPTConfig(block_size=64, vocab_size=65, n_layer=2, n_head=2, n_embd=32))

    def forward(self, idx, cache=None, input_pos=None):
        return self.inner(idx, cache=cache, input_pos=input_pos)[0]


def test_a_model_in_scalekits_convention_gets_scalekits_caches_and_the_same_tokens():
    torch.manual_seed(0)
    model = MyCachedLM()
    for p in model.parameters():
        p.data.mul_(6)
    runs = [generate(model=model, prompts=PROMPTS, max_new_tokens=12, toggles=t, hw=CPU, **QUICK)
            for t in ({}, {"kv_cache": "dynamic"}, {"kv_cache": "static"})]
    assert all(r.status == "ok" for r in runs), [r.error for r in runs]
    assert runs[0].token_ids == runs[1].token_ids == runs[2].token_ids and len(set(runs[0].token_ids[0])) > 3
    assert runs[2].kv_cache_bytes == 2 * 2 * 2 * 18 * 32 * 4  # k and v, 2 layers, 2 prompts, 18 positions
    with pytest.raises(ConfigError, match="give prompts of one length"):  # its forward takes no pad=
        GenerateConfig(model=model, prompts=[[1, 2], [3]])


def test_the_inference_ladder_skips_a_rung_the_models_family_cannot_take():
    from scalekit.inference import inference_ladder

    rungs = (("+ kv_cache", {"kv_cache": "dynamic"}), ("+ static", {"kv_cache": "static"}))
    results = inference_ladder(GenerateConfig(model=FastLM(), prompts=PROMPTS, max_new_tokens=4, **QUICK), rungs=rungs)
    assert [r.status for r in results] == ["ok", "skipped", "ok"]
    assert "keeps the static cache setup_caches allocates" in results[1].error


@pytest.mark.parametrize("method", [m for m in __import__("scalekit.models.quantization", fromlist=["METHODS"]).METHODS])
def test_every_quantize_method_runs_on_gpt2s_conv1d_layers_or_says_why_in_one_line(models, method):
    from scalekit.toggles import TOGGLES

    ok, why = TOGGLES["quantize"].choice_available(CPU, method)
    if not ok:
        assert "\n" not in why
        pytest.skip(why)
    r = generate(model=models["gpt2"], prompts=PROMPTS, max_new_tokens=3, toggles={"quantize": method}, hw=CPU,
                 catch_errors=True, **QUICK)
    assert r.status == "ok", r.error
    assert r.weight_bytes < r.weight_bytes_before and "8 linear layers" in " ".join(r.notes)
