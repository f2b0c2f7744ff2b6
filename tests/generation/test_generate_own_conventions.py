"""Generation of models written the way two well-known codebases write theirs, with every inference toggle.

- NanoLM, the nanoGPT way: forward(idx, targets=None) returns (logits, loss), and without targets the logits of
  the last position only, (B, 1, vocab).  Decoding reads only that position, so it generates with every toggle;
  perplexity and speculative verification need every position: quality is reported unavailable in one line
  (the generation kept), speculative decoding is refused before anything is generated.
- CachedLM, the gpt-fast way: setup_caches(max_batch_size, max_seq_length) allocates key and value buffers in
  each attention layer (in its weights' dtype), forward(idx, input_pos) writes them.  Every copy of it that
  runs (the measured model, the quality's reference, the speculative loop's) gets its caches set up for the
  rows it runs and in the dtype its keys come in (bfloat16 under bf16).
Both models are written here, small: width 32, 2 layers, 65 token ids.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from scalekit import ConfigError, GenerateConfig, ToggleUnavailable, generate
from scalekit.toggles import ORDER, TOGGLES
from tests.helpers import CPU, one_thread

pytestmark = pytest.mark.filterwarnings("ignore")  # libraries' own warnings (bitsandbytes' casts, torchao's notes)


@dataclass
class TinyConfig:
    block_size: int = 64  # positions the model holds
    vocab_size: int = 65  # token ids
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32


class MaskedSelfAttention(nn.Module):
    """Causal self-attention over the whole sequence, written out (no cache)."""

    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.out = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.n_head = cfg.n_head
        self.register_buffer("future", torch.ones(cfg.block_size, cfg.block_size).triu(1).bool(), persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(k.shape[-1])  # (B, nh, T, T)
        weights = scores.masked_fill(self.future[:T, :T], float("-inf")).softmax(dim=-1)
        return self.out((weights @ v).transpose(1, 2).reshape(B, T, C))


class NanoBlock(nn.Module):
    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.n_embd), nn.LayerNorm(cfg.n_embd)
        self.attn = MaskedSelfAttention(cfg)
        self.ffn = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


class NanoLM(nn.Module):
    """A GPT in nanoGPT's shape: without targets it returns (logits of the last position only, None)."""

    def __init__(self, cfg: TinyConfig | None = None):
        super().__init__()
        self.config = cfg = cfg or TinyConfig()
        self.wte, self.wpe = nn.Embedding(cfg.vocab_size, cfg.n_embd), nn.Embedding(cfg.block_size, cfg.n_embd)
        self.h = nn.ModuleList([NanoBlock(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def forward(self, idx, targets=None):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        if targets is None:  # inference: the head on the last position alone, (B, 1, vocab)
            return self.lm_head(x[:, -1:, :]), None
        logits = self.lm_head(x)
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class CachedAttention(nn.Module):
    """Attention whose keys and values live in buffers setup_caches allocates, written at input_pos."""

    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.wq, self.wkv = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False), nn.Linear(cfg.n_embd, 2 * cfg.n_embd)
        self.wo = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.n_head, self.head_dim = cfg.n_head, cfg.n_embd // cfg.n_head
        self.register_buffer("k_cache", None, persistent=False)  # allocated by CachedLM.setup_caches
        self.register_buffer("v_cache", None, persistent=False)

    def allocate(self, batch: int, length: int, like: torch.Tensor) -> None:
        """Key and value buffers of `batch` rows and `length` positions, in the dtype and device of `like`."""
        shape = (batch, self.n_head, length, self.head_dim)
        self.k_cache = torch.zeros(shape, dtype=like.dtype, device=like.device)
        self.v_cache = torch.zeros(shape, dtype=like.dtype, device=like.device)

    def forward(self, x, input_pos, allowed):
        B, T, C = x.shape
        heads = lambda t: t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # noqa: E731
        q = heads(self.wq(x))
        k, v = (heads(t) for t in self.wkv(x).chunk(2, dim=-1))
        self.k_cache.index_copy_(2, input_pos, k)  # the new keys and values, at their positions
        self.v_cache.index_copy_(2, input_pos, v)
        y = F.scaled_dot_product_attention(q, self.k_cache[:B], self.v_cache[:B], attn_mask=allowed)
        return self.wo(y.transpose(1, 2).reshape(B, T, C))


class CachedBlock(nn.Module):
    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.norm_attn, self.norm_ffn = nn.LayerNorm(cfg.n_embd), nn.LayerNorm(cfg.n_embd)
        self.attention = CachedAttention(cfg)
        self.ffn = nn.Sequential(nn.Linear(cfg.n_embd, 2 * cfg.n_embd), nn.SiLU(), nn.Linear(2 * cfg.n_embd, cfg.n_embd))

    def forward(self, x, input_pos, allowed):
        x = x + self.attention(self.norm_attn(x), input_pos, allowed)
        return x + self.ffn(self.norm_ffn(x))


class CachedLM(nn.Module):
    """gpt-fast's convention: no forward before setup_caches; forward(idx, input_pos) -> (B, T, vocab)."""

    def __init__(self, cfg: TinyConfig | None = None):
        super().__init__()
        self.config = cfg = cfg or TinyConfig()
        self.embed, self.position = nn.Embedding(cfg.vocab_size, cfg.n_embd), nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList([CachedBlock(cfg) for _ in range(cfg.n_layer)])
        self.norm, self.head = nn.LayerNorm(cfg.n_embd), nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.cache_rows = self.cache_len = 0

    def setup_caches(self, max_batch_size: int, max_seq_length: int) -> None:
        if self.cache_rows >= max_batch_size and self.cache_len >= max_seq_length:
            return  # the buffers already hold this many rows and positions
        self.cache_rows, self.cache_len = max_batch_size, max_seq_length
        weights = self.embed.weight  # (never quantized): the caches take its dtype, as gpt-fast's take the weights'
        for block in self.blocks:
            block.attention.allocate(max_batch_size, max_seq_length, weights)
        causal = torch.ones(max_seq_length, max_seq_length, dtype=torch.bool, device=weights.device).tril()
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, idx, input_pos):
        if not self.cache_len:
            raise RuntimeError("setup_caches(max_batch_size, max_seq_length) must run before forward")
        allowed = self.causal[None, None, input_pos]  # (1, 1, T, cache_len): positions each query may read
        x = self.embed(idx) + self.position(input_pos)
        for block in self.blocks:
            x = block(x, input_pos, allowed)
        return self.head(self.norm(x))


def sharp(cls: type, factor: float = 2.5) -> nn.Module:
    """A model of class `cls` from seed 0, its weights scaled up so that its greedy tokens vary."""
    torch.manual_seed(0)
    model = cls()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(factor)
    return model.eval()


QUICK = dict(device="cpu", warmup_tokens=0, measure_memory=False, quality_windows=2, quality_seq_len=24)
PROMPTS = [[1, 2, 3, 4, 1, 2, 3], [9, 8, 7, 6, 9, 8, 7]]  # one length; each repeats itself (prompt lookup matches)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


def one_line(text: str | None) -> bool:
    return bool(text) and "\n" not in text.strip() and "Traceback" not in text


@torch.no_grad()
def greedy(model: nn.Module, prompts, n: int) -> list[list[int]]:
    """The model's own greedy tokens: its forward on the whole sequence, the last position's argmax, n times."""
    seq = torch.tensor(prompts)
    for _ in range(n):
        if isinstance(model, CachedLM):
            model.setup_caches(seq.shape[0], seq.shape[1])
            logits = model(seq, torch.arange(seq.shape[1]))
        else:
            logits = model(seq)[0]
        seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return seq[:, len(prompts[0]):].tolist()


# -- nanoGPT's convention: logits of the last position only ------------------------------------------------------

def test_a_last_position_model_generates_its_own_tokens_and_says_in_one_line_why_quality_is_missing():
    model = sharp(NanoLM)
    r = generate(model=model, prompts=PROMPTS, max_new_tokens=10, hw=CPU, **QUICK)  # quality on, as by default
    assert r.status == "ok", r.error
    assert r.token_ids == greedy(model, PROMPTS, 10) and len(set(r.token_ids[0])) > 3  # tokens that vary
    assert r.perplexity is None and r.agreement is None
    notes = [n for n in r.notes if "quality not measured" in n]
    assert len(notes) == 1 and one_line(notes[0]), r.notes
    assert "NanoLM's forward returns logits for the last position only (shape (1, 1, 65) for 2 tokens)" in notes[0]
    # what quality can still measure is measured: the quantized model's greedy tokens against the model as built
    q = generate(model=model, prompts=PROMPTS, max_new_tokens=10, toggles={"quantize": "torch-dynamic-int8"}, hw=CPU,
                 **QUICK)
    assert q.status == "ok" and q.perplexity is None, q.error
    assert len(q.same_prefix_tokens) == 2 and all(0 <= n <= 10 for n in q.same_prefix_tokens)


@pytest.mark.parametrize("mode", ["prompt_lookup", "draft"])
def test_speculative_decoding_refuses_a_last_position_model_before_generating(mode):
    r = generate(model=sharp(NanoLM), prompts=PROMPTS[:1], max_new_tokens=8, toggles={"speculative": mode}, hw=CPU,
                 catch_errors=True, **QUICK)
    assert r.status == "failed" and one_line(r.error), r.error
    assert r.error.startswith("ToggleUnavailable: toggle 'speculative' checks k drafted tokens in one forward"), r.error
    assert "NanoLM's forward returns logits for the last position only" in r.error
    assert r.new_tokens == 0  # refused when built, before anything was generated


def test_a_last_position_model_drafts_for_a_model_that_returns_every_position():
    """A draft reads only its last position: a nanoGPT-style draft proposes for a gpt-fast-style model, and greedy
    speculative decoding makes the model's own greedy tokens."""
    target, draft = sharp(CachedLM), sharp(NanoLM, factor=2.0)
    r = generate(model=target, prompts=PROMPTS[:1], max_new_tokens=12, toggles={"speculative": {"draft": draft, "k": 3},
                 "kv_cache": "static"}, hw=CPU, **QUICK)
    assert r.status == "ok", r.error
    assert r.token_ids == greedy(target, PROMPTS[:1], 12) and r.same_as_plain_tokens == 12
    assert r.draft_forwards > 0 and r.acceptance_rate is not None  # the draft proposed, and its acceptance is known


def test_quality_refuses_a_last_position_model_in_one_line_when_called_directly():
    from contextlib import ExitStack

    from scalekit.inference.build import build_generation
    from scalekit.inference.quality import measure_quality

    cfg = GenerateConfig(model=sharp(NanoLM), prompts=PROMPTS, max_new_tokens=2, **QUICK).resolve(CPU)
    with ExitStack() as stack:
        ctx = build_generation(cfg, CPU, stack)
        with pytest.raises(ConfigError, match=r"NanoLM's forward returns logits for the last position only "
                                              r"\(shape \(2, 1, 65\) for 24 tokens\)"):
            measure_quality(ctx, 24, 2)


# -- gpt-fast's convention: setup_caches, forward(idx, input_pos) --------------------------------------------------

def test_every_copy_of_a_setup_caches_model_gets_caches_of_its_rows_and_its_keys_dtype():
    from scalekit.models.conventions import SetupCachesLM

    model, family = sharp(CachedLM), SetupCachesLM(CachedLM())
    family.prepare(model, 8, 16)  # eight held-out windows of 16 tokens
    family.prepare(model, 1, 12)  # then one prompt: the model keeps its bigger buffers, the rows are cut to 1
    layer = model.blocks[0].attention
    assert layer.k_cache.shape == (1, 2, 16, 16) and layer.k_cache.dtype == torch.float32
    ids = torch.tensor(PROMPTS[:1])
    with torch.no_grad():
        assert model(ids, torch.arange(7)).shape == (1, 7, 65)
        with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16's keys: the buffers in bfloat16
            family.prepare(model, 1, 12)
            assert layer.v_cache.dtype == torch.bfloat16 and model(ids, torch.arange(7)).shape == (1, 7, 65)
    family.prepare(model, 2, 12)  # fp32 again, two rows (the model's own setup_caches returned early)
    assert layer.k_cache.shape == (2, 2, 16, 16) and layer.k_cache.dtype == torch.float32


def test_bf16_sets_up_a_setup_caches_models_cache_in_bfloat16_and_speculates_with_it():
    model = sharp(CachedLM)
    runs = {name: generate(model=model, prompts=PROMPTS[:1], max_new_tokens=10, toggles=toggles, hw=CPU, **QUICK)
            for name, toggles in [("fp32", {"kv_cache": "static"}), ("bf16", {"kv_cache": "static", "bf16": True}),
                                  ("bf16 speculative", {"kv_cache": "static", "bf16": True,
                                                        "speculative": "prompt_lookup"})]}
    assert all(r.status == "ok" for r in runs.values()), {k: r.error for k, r in runs.items()}
    assert runs["bf16"].kv_cache_bytes * 2 == runs["fp32"].kv_cache_bytes > 0  # 2 bytes a value, not 4
    spec = runs["bf16 speculative"]
    assert spec.token_ids == runs["bf16"].token_ids and spec.same_as_plain_tokens == 10
    assert runs["bf16"].perplexity is not None and runs["bf16"].same_prefix_tokens is not None


def test_a_setup_caches_models_quality_is_its_own_perplexity_and_its_quantized_copy_generates_beside_it():
    from scalekit.inference.quality import heldout_windows

    model = sharp(CachedLM)
    r = generate(model=model, prompts=PROMPTS, max_new_tokens=8, toggles={"quantize": "torch-dynamic-int8"}, hw=CPU,
                 **QUICK)
    assert r.status == "ok", r.error
    windows = heldout_windows(24, 2)
    x, y = windows[:, :-1], windows[:, 1:]
    with torch.no_grad():
        model.setup_caches(2, 24)
        loss = F.cross_entropy(model(x, torch.arange(24)).transpose(1, 2), y)
    assert r.reference_perplexity == pytest.approx(math.exp(loss.item()), rel=1e-5)
    assert r.perplexity is not None and 0 < r.agreement <= 1
    assert len(r.same_prefix_tokens) == 2  # the reference (fp32, unquantized) generated beside it


# -- every inference toggle, every mode ------------------------------------------------------------------------------

# what each model must be refused (its class named); every other mode generates
REFUSED = {NanoLM: {"sdpa", "kv_cache", "speculative"}, CachedLM: {"sdpa", "kv_cache"}}
MUST_RUN = {CachedLM: {("kv_cache", "static")}}


def generation_cells() -> list:
    return [pytest.param(t.name, value, id=f"{t.name}={value}") for t in ORDER if "generate" in t.loops
            for value in ([True] if t.choices is None else t.choices)]


@pytest.mark.usefixtures("eager_compile")
@pytest.mark.parametrize("cls", [NanoLM, CachedLM], ids=["nanoGPT-style", "gpt-fast-style"])
@pytest.mark.parametrize(("name", "value"), generation_cells())
def test_every_inference_toggle_generates_or_refuses_naming_the_class(cls, name, value):
    toggle = TOGGLES[name]
    ok, why = toggle.choice_available(CPU, value)
    if not ok:
        assert one_line(why), why
        pytest.skip(f"{name}={value}: {why}")
    refusable = name in REFUSED[cls] and (name, value) not in MUST_RUN.get(cls, ())
    try:
        cfg = GenerateConfig(model=sharp(cls), prompts=PROMPTS[:1], max_new_tokens=4, toggles={name: value}, **QUICK)
    except (ConfigError, ToggleUnavailable) as exc:
        assert refusable and one_line(str(exc)) and cls.__name__ in str(exc), str(exc)
        return
    r = generate(cfg, hw=CPU, catch_errors=True)
    if r.status == "failed":
        assert refusable and one_line(r.error) and cls.__name__ in r.error, r.error
        assert r.error.startswith("ToggleUnavailable"), r.error
        return
    assert r.status == "ok" and r.new_tokens == 4, r.error
    if cls is NanoLM:  # quality is on: reported unavailable, in one line
        assert r.perplexity is None and any("NanoLM's forward returns logits for the last position only" in n
                                            and one_line(n) for n in r.notes), r.notes
    else:
        assert r.perplexity is not None and math.isfinite(r.perplexity)


@pytest.mark.slow  # a cold inductor compile of the decode step: about 15 s on two CPU cores
def test_a_setup_caches_model_compiles_with_inductor_into_one_decode_graph():
    toggle = TOGGLES["compile"]
    ok, why = toggle.choice_available(CPU, "default")
    if not ok:
        pytest.skip(why)
    model = sharp(CachedLM)
    eager = generate(model=model, prompts=PROMPTS, max_new_tokens=8, toggles={"kv_cache": "static"}, hw=CPU, **QUICK)
    compiled = generate(model=model, prompts=PROMPTS, max_new_tokens=8, hw=CPU,
                        toggles={"kv_cache": "static", "compile": "default"}, **{**QUICK, "warmup_tokens": 3})
    assert compiled.status == "ok", compiled.error
    assert compiled.token_ids == eager.token_ids and compiled.graphs_compiled >= 1 and compiled.recompiles_measured == 0
