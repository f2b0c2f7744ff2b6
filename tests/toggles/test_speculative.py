"""Speculative decoding and the int8 KV caches, compared in numbers: greedy speculative tokens equal plain greedy
tokens (draft model and prompt lookup, built-in GPT and a Hugging Face model, several k, prompts and caches),
also with a draft that is wrong at every position (both caches cut back at every verification); sampling keeps
the model's distribution (frequencies over many seeded draws on a 4-token vocabulary); int8 caches' bytes, and
their perplexity and agreement within the bounds measured on the shipped model; refusals in one line."""

from __future__ import annotations

import contextlib

import pytest
import torch

from scalekit import ConfigError, ToggleUnavailable
from scalekit.hf.family_of import generation_family
from scalekit.inference import GenerateConfig, generate
from scalekit.inference.loop import Sampling
from scalekit.inference.speculative import speculative_decode
from scalekit.models import GPT, load_pretrained
from scalekit.models.kv_cache import make_cache
from scalekit.models.speculative import Speculation, greedy_accept, lookup_draft
from scalekit.toggles import BuildContext
from tests.helpers import CPU, one_thread

QUICK = dict(measure_memory=False, quality=False, warmup_tokens=0, device="cpu")
PROMPTS = ["ROMEO:", "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak."]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


def tokens(toggles, prompt, n=40, **kw):
    r = generate(GenerateConfig(prompts=prompt, max_new_tokens=n, toggles=toggles, **{**QUICK, **kw}), hw=CPU)
    assert r.status == "ok", r.error
    return r


@pytest.mark.parametrize(("cache", "prompt", "values"), [
    (None, PROMPTS[0], ("draft", "prompt_lookup,k=8,ngram=2")),
    ("dynamic", PROMPTS[1], ("draft,k=2", {"draft": "shakespeare-char-draft", "k": 7}, "prompt_lookup")),
    ("static", PROMPTS[0], ("draft", "prompt_lookup,k=2", "draft,k=5")),
    ("static-int8", PROMPTS[1], ("draft,k=3", "prompt_lookup")),
])
def test_greedy_speculative_tokens_equal_plain_greedy_on_the_built_in_gpt(cache, prompt, values):
    caches = {"kv_cache": cache} if cache else {}
    plain = tokens(caches, prompt)
    for value in values:
        r = tokens({**caches, "speculative": value}, prompt)
        assert r.token_ids == plain.token_ids, value
        assert sum(r.accepted_counts) == len(r.accepted_steps) > 0
        made = sum(r.accepted_steps) + len(r.accepted_steps) + 1
        assert made == r.new_tokens == 40 and r.target_forwards_per_token == pytest.approx(
            (len(r.accepted_steps) + 1) / made)
        assert r.acceptance_rate > 0  # right sometimes (the draft model, and the repeats prompt lookup finds)


class WrongDraft(GPT):
    """The shipped draft, made to propose at every position a token the model never picks next (shifted by
    one from the draft's own choice, and never the model's): every verification rejects every draft token."""

    def __init__(self, never: torch.Tensor):
        base = load_pretrained("shakespeare-char-draft")
        super().__init__(base.config)
        self.load_state_dict(base.state_dict())
        self.never = never  # (positions,) for each position, a token the model does not pick there

    def forward(self, idx, targets=None, *, cache=None, input_pos=None, pad=None):
        logits, loss = super().forward(idx, targets, cache=cache, input_pos=input_pos, pad=pad)
        pos = input_pos if input_pos is not None else torch.arange(idx.shape[1])
        return logits + 1e4 * torch.nn.functional.one_hot(self.never[pos], logits.shape[-1]), loss


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_a_draft_wrong_at_every_position_still_gives_plain_greedy_tokens(cache):
    prompt = PROMPTS[0]
    plain = tokens({"kv_cache": cache}, prompt, n=40)
    seq = [*GenerateConfig(prompts=prompt).prompt_ids()[0], *plain.token_ids[0]]
    never = torch.tensor([(t + 1) % 65 for t in seq[1:]] + [0] * 20)  # at position i, not the token at i + 1
    draft = WrongDraft(never)
    r = tokens({"kv_cache": cache, "speculative": {"draft": draft, "k": 3}}, prompt, n=40)
    assert r.token_ids == plain.token_ids
    assert r.accepted_steps == [0] * 39 and r.acceptance_rate == 0  # all rejected: one token per verification
    assert r.draft_forwards == 3 * 36 + 2 + 1  # k per verification, fewer where the end leaves less room


@pytest.fixture(scope="module")
def llama():
    from scalekit.hf import causal_lm

    return causal_lm("llama", preset="tiny", initializer_range=0.3), causal_lm("llama", preset="tiny",
                                                                               num_hidden_layers=1)


@pytest.mark.parametrize(("cache", "prompt"), [(None, "ROMEO:"), ("dynamic", "ROMEO:"), ("dynamic", "abcabcabcab")])
def test_greedy_speculative_tokens_equal_plain_greedy_on_a_hugging_face_model(llama, cache, prompt):
    target, draft = llama
    caches = {"kv_cache": cache} if cache else {}
    plain = tokens(caches, prompt, n=24, model=target)
    assert len(set(plain.token_ids[0])) > 3
    for value in ({"draft": draft, "k": 2}, {"draft": draft, "k": 5}, "prompt_lookup,k=6"):
        r = tokens({**caches, "speculative": value}, prompt, n=24, model=target)
        assert r.token_ids == plain.token_ids, value
        assert r.accepted_steps


class Bigram(torch.nn.Module):
    """A model over 4 tokens whose next-token logits depend on the last token only: its distribution is known."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = torch.nn.Parameter(table)

    def forward(self, idx):
        return self.table[idx]


def test_sampled_speculative_tokens_follow_the_models_distribution_whatever_the_draft():
    torch.manual_seed(0)
    target, draft = Bigram(torch.randn(4, 4) * 1.5), Bigram(torch.randn(4, 4) * 1.5)
    ctx = BuildContext(config=None, hw=CPU, device=torch.device("cpu"), stack=contextlib.ExitStack(),
                       model_adapter=generation_family(target), base_model=target, model=target,
                       speculative=Speculation("draft", k=3), draft=(generation_family(draft), draft))
    sampling = Sampling(temperature=1.0, generator=torch.Generator().manual_seed(1))
    draws = 4000
    counts = torch.zeros(4, 4)  # (second token, third token)
    for _ in range(draws):
        out = speculative_decode(ctx, torch.tensor([[0]]), None, 3, 4, sampling)
        counts[out.tokens[0, 1], out.tokens[0, 2]] += 1
    p = torch.softmax(target.table.detach(), -1)
    expected = torch.softmax(target.table.detach()[0], -1) @ p  # the second token after two steps from token 0
    first = counts.sum(1) / draws
    assert (first - expected).abs().max() < 0.03, (first, expected)
    rows = counts.sum(1, keepdim=True)
    conditional = counts / rows  # the third token given the second: the model's bigram row
    assert ((conditional - p).abs() * (rows > 400)).max() < 0.06
    plain_q = torch.softmax(draft.table.detach()[0], -1) @ torch.softmax(draft.table.detach(), -1)
    assert (plain_q - expected).abs().max() > 0.05  # the draft's own distribution is visibly another


def test_prompt_lookup_copies_what_followed_the_first_earlier_match_and_greedy_keeps_the_agreeing_prefix():
    seq = torch.tensor([5, 6, 7, 8, 9, 5, 6, 7])
    assert lookup_draft(seq, 3).tolist() == [8, 9, 5]  # "5 6 7" seen at 0: what followed it
    assert lookup_draft(torch.tensor([1, 2, 3]), 3).tolist() == []
    logits = torch.nn.functional.one_hot(torch.tensor([4, 2, 9, 1]), 10).float()
    assert greedy_accept(logits, torch.tensor([4, 2, 3])) == (2, torch.tensor(9))
    assert greedy_accept(logits, torch.tensor([0, 2, 9]))[0] == 0


@torch.no_grad()
def test_int8_caches_hold_a_quarter_of_fp32s_bytes_plus_their_scales():
    model = load_pretrained("shakespeare-char")  # 4 layers, 4 heads of 32
    x = torch.randint(0, 65, (2, 30))
    for kind in ("static", "static-int8"):
        cache = make_cache(kind, 4, 100, "cpu")
        model(x, cache=cache, input_pos=torch.arange(30))
        per_value = 4 if kind == "static" else 1
        scales = 0 if kind == "static" else 2 * 4 * 2 * 4 * 100 * 4  # k and v, layers, rows, heads, positions, fp32
        assert cache.nbytes() == 2 * 4 * 2 * 100 * 128 * per_value + scales
    dynamic = make_cache("dynamic-int8", 4, 100, "cpu")
    model(x, cache=dynamic, input_pos=torch.arange(30))
    assert dynamic.nbytes() == 2 * 4 * 2 * 30 * 4 * (32 + 4)


def test_int8_kv_keeps_perplexity_and_greedy_tokens_within_the_measured_bounds():
    # measured on the shipped model (200 tokens after 'ROMEO:'): perplexity 4.5203 → 4.5201, agreement 0.9976,
    # the first 60 greedy tokens equal; the bounds leave room for another machine's rounding
    for kind in ("static-int8", "dynamic-int8"):
        r = generate(GenerateConfig(prompts="ROMEO:", max_new_tokens=80, toggles={"kv_cache": kind}, device="cpu",
                                    measure_memory=False, warmup_tokens=0, quality_windows=4), hw=CPU)
        assert abs(r.perplexity / r.reference_perplexity - 1) < 0.002
        assert r.agreement > 0.99 and r.same_prefix_tokens[0] >= 40
        assert r.kv_cache_bytes < 0.3 * 2 * 4 * 86 * 128 * 4


def test_autotune_refuses_a_speculative_change_whose_tokens_differ_and_keeps_an_exact_one():
    from scalekit.autotune.generation import _exact, _refusal
    from scalekit.inference.results import GenerateResult

    cfg = GenerateConfig(toggles={"kv_cache": "static", "speculative": "draft"})
    assert _exact(cfg) and not _exact(GenerateConfig(toggles={"kv_cache": "static"}))
    r = tokens({"kv_cache": "static", "speculative": "draft"}, "ROMEO:", n=20, quality=True, quality_windows=1)
    assert r.same_as_plain_tokens == 20 and _refusal(r, 0.95, exact=True) is None
    changed = GenerateResult(label="x", config={}, new_tokens=20, same_as_plain_tokens=7, agreement=1.0)
    assert "differ from token 8 of 20" in _refusal(changed, 0.95, exact=True)


def test_refusals_say_what_and_why_in_one_line(llama):
    target, _ = llama
    with pytest.raises(ConfigError, match=r"one prompt at a time \(batch 1\); got 2 prompts") as err:
        generate(GenerateConfig(prompts=PROMPTS, max_new_tokens=5, toggles={"speculative": "draft"}, **QUICK), hw=CPU)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="'speculative' and 'compile'|'compile' and 'speculative'"):
        GenerateConfig(toggles={"speculative": "draft", "compile": "default"})
    for bad in ("guess", "draft,k=0", "draft=nope", "prompt_lookup,x=2", {"k": 4}, 3):
        with pytest.raises(ConfigError, match=r"GenerateConfig.toggles\['speculative'\]"):
            GenerateConfig(toggles={"speculative": bad})
    small = torch.nn.Sequential(torch.nn.Embedding(10, 10))
    with pytest.raises(ConfigError, match="reads 10 token ids and the model 65; a draft must share the model's"):
        generate(GenerateConfig(max_new_tokens=3, toggles={"speculative": {"draft": small, "k": 2}}, **QUICK), hw=CPU)
    with pytest.raises(ConfigError, match="StaticCache counts the positions written itself and cannot be cut back"):
        tokens({"kv_cache": "static", "speculative": "prompt_lookup"}, "abcabcabcab", n=8, model=target)
    with pytest.raises(ToggleUnavailable, match="use kv_cache='dynamic-int8' on a Hugging Face model"):
        GenerateConfig(model=target, toggles={"kv_cache": "static-int8"})
    assert GenerateConfig(toggles={"speculative": {"draft": "shakespeare-char-draft", "k": 6}}).toggles == \
        {"speculative": "draft,k=6"}


def test_a_hugging_face_model_keeps_an_hqq_int8_cache_or_says_why_not(llama, monkeypatch):
    target, _ = llama
    plain = tokens({"kv_cache": "dynamic"}, "ROMEO:", n=20, model=target)
    int8 = tokens({"kv_cache": "dynamic-int8"}, "ROMEO:", n=20, model=target)
    assert 0 < int8.kv_cache_bytes < plain.kv_cache_bytes  # the prompt's positions held in 8 bits
    assert int8.token_ids[0][:3] == plain.token_ids[0][:3]
    import scalekit.hf.generation as hf_generation

    real = hf_generation.importlib.util.find_spec
    monkeypatch.setattr(hf_generation.importlib.util, "find_spec", lambda name: None if name == "hqq" else real(name))
    ok, why = hf_generation.kv_cache_support(type(target.build()), "dynamic-int8")
    assert not ok and "hqq is not installed" in why


def test_the_ladder_skips_the_draft_rung_on_a_model_of_another_tokenizer_with_the_reason():
    from scalekit.inference import inference_ladder
    from scalekit.toggles import TOGGLES

    base = GenerateConfig(model="tiny-vocab50k", max_new_tokens=3, **QUICK)
    ok, why = TOGGLES["speculative"].config_applies(base, "draft")
    assert not ok and "reads 65 token ids and the model 50304" in why
    assert TOGGLES["speculative"].config_applies(base, "prompt_lookup") == (True, "")
    assert TOGGLES["speculative"].config_applies(GenerateConfig(**QUICK), "draft") == (True, "")
    rows = inference_ladder(base, rungs=(("+ speculative (draft)", {"speculative": "draft"}),
                                         ("+ prompt lookup", {"speculative": "prompt_lookup"})))
    assert [r.status for r in rows] == ["ok", "skipped", "ok"], [(r.label, r.error) for r in rows]
    assert "share the model's tokenizer" in rows[1].error and "\n" not in rows[1].error


@pytest.mark.parametrize("speculative", ["draft", "prompt_lookup"])
def test_speculative_runs_on_a_model_a_toggle_left_computing_in_bf16(speculative):
    """The inference ladder's last rungs: bf16 with hqq's 4-bit layers (which compute in bf16) and an int8 cache;
    the check that the model returns every position runs under the run's autocast, as its forwards do (it ran in
    fp32 and read the mixed dtypes as "cannot generate")."""
    toggles = {"bf16": True, "kv_cache": "static-int8", "quantize": "hqq-4bit", "inference_mode": True,
               "speculative": speculative}
    r = tokens(toggles, PROMPTS[0], n=8, model="tiny")
    assert r.new_tokens == 8 and r.acceptance_rate is not None
