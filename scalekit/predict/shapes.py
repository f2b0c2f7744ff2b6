"""The shape of a model as the cost model needs it: its parameters grouped as FSDP shards them (the root's own, then
each repeated block's), its width, layers, heads and vocabulary.  No weights, no memory: built from the numbers.

Three ways in:
- a built-in preset name ('tiny', 'small', 'medium', 'gpt2-124m', ...) or a GPTConfig: the GPT built on the meta
  device and read (exact, as scalekit runs it);
- a public shape by name (PUBLIC: GPT-2 124M to 1.5B, Llama 3 8B/70B/405B, Llama 2 7B, Qwen2 0.5B-72B, Mistral 7B),
  from its published config; the
  same numbers build a transformers config offline with `hf_config(name)` (no hub);
- a transformers config (GPT-2 or Llama layout: GPT2Config, LlamaConfig, Qwen2Config, MistralConfig).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ConfigError

Shapes = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class ModelShape:
    name: str
    n_layer: int
    d: int  # hidden size
    n_head: int
    n_kv_head: int
    ffn: int  # the MLP's hidden width
    vocab: int
    root: Shapes  # parameters outside the blocks (embeddings, final norm, an untied head), one shape each
    block: Shapes  # one block's parameters
    mlp_matrices: int = 2  # GPT-2: 2 (fc, proj); Llama's SwiGLU: 3
    buffer_bytes: int = 0  # module buffers (DDP broadcasts them before every forward)
    source: str = ""

    @property
    def root_params(self) -> int:
        return sum(math.prod(s) for s in self.root)

    @property
    def block_params(self) -> int:
        return sum(math.prod(s) for s in self.block)

    @property
    def n_params(self) -> int:
        return self.root_params + self.n_layer * self.block_params

    @property
    def units(self) -> list[Shapes]:
        """FSDP's units in the order forward gathers them: the root's own parameters, then each block."""
        return [self.root] + [self.block] * self.n_layer

    def train_flops_per_token(self, seq: int) -> float:
        """6N for the weights' matmuls plus 12·L·d·T for the attention scores (PaLM, appendix B; the formula
        scalekit's MFU uses).  N leaves out the tables that are lookups: the position table, and the token
        embedding when the head is a matrix of its own (a tied one is counted once, as the head)."""
        lookups = self.positions * self.d + (0 if self.head_tied else self.vocab * self.d)
        return 6 * (self.n_params - lookups) + 12 * self.n_layer * self.d * seq

    @property
    def head_tied(self) -> bool:
        return not any(s == (self.vocab, self.d) for s in self.root[1:])

    @property
    def positions(self) -> int:
        """Rows of a learned position table (GPT-2), 0 for rotary models."""
        return next((s[0] for s in self.root if len(s) == 2 and s[1] == self.d and s[0] != self.vocab), 0)


def padded_elements(shapes: Shapes, world: int) -> int:
    """Elements FSDP2 moves for these parameters over `world` ranks: each parameter's dim 0 padded to a multiple of
    the ranks (fully_shard shards dim 0 evenly, padding the last shard)."""
    return sum(-(-s[0] // world) * world * math.prod(s[1:]) for s in shapes)


def gpt2_shape(name, n_layer, d, n_head, vocab, positions, source="") -> ModelShape:
    block = ((d,), (d,), (3 * d, d), (3 * d,), (d, d), (d,), (d,), (d,), (4 * d, d), (4 * d,), (d, 4 * d), (d,))
    root = ((vocab, d), (positions, d), (d,), (d,))  # wte (tied with the head), wpe, ln_f
    return ModelShape(name, n_layer, d, n_head, n_head, 4 * d, vocab, root, block, 2, 0, source)


def llama_shape(name, n_layer, d, n_head, n_kv, ffn, vocab, tied=False, source="", qkv_bias=False) -> ModelShape:
    hd = d // n_head
    bias = ((d,), (n_kv * hd,), (n_kv * hd,)) if qkv_bias else ()  # Qwen2's q, k and v projections have biases
    block = ((d, d), (n_kv * hd, d), (n_kv * hd, d), (d, d), (ffn, d), (ffn, d), (d, ffn), (d,), (d,)) + bias
    root = ((vocab, d), (d,)) + (() if tied else ((vocab, d),))
    return ModelShape(name, n_layer, d, n_head, n_kv, ffn, vocab, root, block, 3, 0, source)


HF_GPT2 = "openai-community/gpt2* config.json on the Hugging Face hub (published numbers, typed here)"
QWEN2 = "Qwen/Qwen2-{} config.json (published numbers, typed here; q, k, v biases counted)"
META_LLAMA = "meta-llama/Llama-3.1-{size} config.json and the Llama 3 paper, table 3 (published numbers, typed here)"
PUBLIC: dict[str, ModelShape] = {s.name: s for s in (
    gpt2_shape("gpt2-124m", 12, 768, 12, 50257, 1024, HF_GPT2),
    gpt2_shape("gpt2-350m", 24, 1024, 16, 50257, 1024, HF_GPT2),
    gpt2_shape("gpt2-774m", 36, 1280, 20, 50257, 1024, HF_GPT2),
    gpt2_shape("gpt2-1.5b", 48, 1600, 25, 50257, 1024, HF_GPT2),
    llama_shape("llama3-8b", 32, 4096, 32, 8, 14336, 128256, source=META_LLAMA.format(size="8B")),
    llama_shape("llama3-70b", 80, 8192, 64, 8, 28672, 128256, source=META_LLAMA.format(size="70B")),
    llama_shape("llama3-405b", 126, 16384, 128, 8, 53248, 128256, source=META_LLAMA.format(size="405B")),
    llama_shape("llama2-7b", 32, 4096, 32, 32, 11008, 32000,
                source="meta-llama/Llama-2-7b-hf config.json (published numbers, typed here)"),
    llama_shape("qwen2-0.5b", 24, 896, 14, 2, 4864, 151936, tied=True, qkv_bias=True, source=QWEN2.format("0.5B")),
    llama_shape("qwen2-1.5b", 28, 1536, 12, 2, 8960, 151936, tied=True, qkv_bias=True, source=QWEN2.format("1.5B")),
    llama_shape("qwen2-7b", 28, 3584, 28, 4, 18944, 152064, qkv_bias=True, source=QWEN2.format("7B")),
    llama_shape("qwen2-72b", 80, 8192, 64, 8, 29568, 152064, qkv_bias=True, source=QWEN2.format("72B")),
    llama_shape("mistral-7b", 32, 4096, 32, 8, 14336, 32000,
                source="mistralai/Mistral-7B-v0.1 config.json (published numbers, typed here; its 4,096-token "
                       "sliding window is not modelled: attention is priced as full causal attention)"),
)}
ALIASES = {"gpt2": "gpt2-124m", "gpt2-medium": "gpt2-350m", "gpt2-large": "gpt2-774m", "gpt2-xl": "gpt2-1.5b",
           "llama3-8B": "llama3-8b", "llama-3-8b": "llama3-8b", "llama-3.1-8b": "llama3-8b",
           "llama-3-70b": "llama3-70b", "llama-3.1-70b": "llama3-70b", "llama-3.1-405b": "llama3-405b",
           "mistral": "mistral-7b", "mistral-7b-v0.1": "mistral-7b", "qwen2": "qwen2-7b"}


def hf_config(name: str):
    """A transformers config of the public shape `name`, built offline (no hub): GPT2Config or LlamaConfig."""
    from ..hf.model import _transformers

    s = shape_of(name)
    t = _transformers()
    if s.mlp_matrices == 2:
        return t.GPT2Config(n_layer=s.n_layer, n_head=s.n_head, n_embd=s.d, vocab_size=s.vocab,
                            n_positions=s.positions)
    common = dict(num_hidden_layers=s.n_layer, num_attention_heads=s.n_head, num_key_value_heads=s.n_kv_head,
                  hidden_size=s.d, intermediate_size=s.ffn, vocab_size=s.vocab, tie_word_embeddings=s.head_tied)
    if s.name.startswith("qwen2"):
        return t.Qwen2Config(**common)
    if s.name.startswith("mistral"):
        return t.MistralConfig(**common)
    return t.LlamaConfig(**common)


def shape_of(model) -> ModelShape:
    """The ModelShape of a public name, a built-in preset name, a GPTConfig, a RunConfig of the built-in GPT, a
    transformers config, or a built model that carries one (a transformers model, scalekit's GPT); a ConfigError
    names what it takes otherwise."""
    if isinstance(model, ModelShape):
        return model
    if isinstance(model, str):
        key = ALIASES.get(model, model.lower())
        if key in PUBLIC:
            return PUBLIC[key]
        from ..models.presets import PRESETS

        if model in PRESETS:
            return _from_gpt(PRESETS[model].gpt_config(), model)
        raise ConfigError(f"unknown model {model!r}: public shapes {', '.join(PUBLIC)}; built-in presets "
                          f"{', '.join(PRESETS)}; or give a GPTConfig, a RunConfig or a transformers config")
    from ..models.gpt import GPTConfig

    if isinstance(model, GPTConfig):
        return _from_gpt(model, "gpt")
    if hasattr(model, "preset") and hasattr(model, "toggles") and not getattr(model, "custom_model", True):
        from ..models.presets import PRESETS

        return _from_gpt(PRESETS[model.preset].gpt_config(model.seq_len), model.preset)
    if hasattr(model, "model_type"):
        return _from_hf(model)
    config = getattr(model, "config", None)  # a built model: scalekit's GPT, or a transformers model (its config)
    if isinstance(config, GPTConfig):
        return _from_gpt(config, "gpt")
    if hasattr(config, "model_type"):
        return _from_hf(config)
    raise ConfigError(f"predict: cannot read a shape from {type(model).__name__} (a module with no transformers or "
                      f"GPT config: its layers, widths and heads are not known): give a public name "
                      f"({', '.join(PUBLIC)}), a preset, a GPTConfig, a RunConfig, a transformers config or model, or "
                      f"scalekit's GPT")


def _from_gpt(cfg, name: str) -> ModelShape:
    """The built-in GPT as scalekit builds it, read off the meta device (its padded vocabulary, its causal masks)."""
    import torch

    from ..models import GPT

    with torch.device("meta"):
        model = GPT(cfg)
    blocks = model.transformer.h
    in_blocks = {id(p) for p in blocks.parameters()}
    root = tuple(tuple(p.shape) for p in model.parameters() if id(p) not in in_blocks)
    block = tuple(tuple(p.shape) for p in blocks[0].parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return ModelShape(name, cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_head, 4 * cfg.n_embd, cfg.embedding_rows,
                      root, block, 2, buffers, "scalekit's built-in GPT, built on the meta device")


def _from_hf(cfg) -> ModelShape:
    kind = cfg.model_type
    if kind == "gpt2":
        return gpt2_shape(f"hf-{kind}", cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.vocab_size, cfg.n_positions,
                          "a transformers GPT2Config")
    if kind in ("llama", "qwen2", "mistral", "qwen3"):
        return llama_shape(f"hf-{kind}", cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads,
                           cfg.num_key_value_heads or cfg.num_attention_heads, cfg.intermediate_size,
                           cfg.vocab_size, bool(getattr(cfg, "tie_word_embeddings", False)),
                           f"a transformers {type(cfg).__name__} (Llama's layout"
                           + (": q, k, v biases counted)" if kind == "qwen2" else ": biases not counted)"),
                           qkv_bias=kind == "qwen2")
    raise ConfigError(f"predict: a transformers config of model_type {kind!r} is not read yet; it reads gpt2, "
                      f"llama, qwen2, qwen3 and mistral")
