"""Tiny Hugging Face causal LMs of every family the matrix tests try, built offline from configs (no hub).

Each config has the shape of scalekit's `tiny` preset where the family allows it (2 layers, width 64, 4 heads,
vocab 65, context 64) and keeps what makes the family itself: Gemma 2's sliding-window layers and capped logits,
Mistral's sliding window, Falcon's one key/value head (multi-query), Phi-3's fused qkv, GPT-NeoX's parallel
residual, OPT's learned positions."""

from __future__ import annotations

import torch

SHAPE = dict(vocab_size=65, max_position_embeddings=64)
LLAMA_LIKE = dict(SHAPE, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                  bos_token_id=64, eos_token_id=64, pad_token_id=0)


def hf_config(family: str):
    """A transformers config of `family` (a key of CONFIGS)."""
    import transformers

    build = {
        "gpt2": lambda: transformers.GPT2Config(vocab_size=65, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                                                bos_token_id=64, eos_token_id=64),
        "llama": lambda: transformers.LlamaConfig(**LLAMA_LIKE, num_key_value_heads=2),
        "qwen2": lambda: transformers.Qwen2Config(**LLAMA_LIKE, num_key_value_heads=2),
        "mistral": lambda: transformers.MistralConfig(**LLAMA_LIKE, num_key_value_heads=2, sliding_window=16),
        "phi3": lambda: transformers.Phi3Config(**LLAMA_LIKE, num_key_value_heads=4),
        "gemma2": lambda: transformers.Gemma2Config(**LLAMA_LIKE, num_key_value_heads=2, head_dim=16,
                                                    sliding_window=16),
        "gpt_neox": lambda: transformers.GPTNeoXConfig(vocab_size=65, max_position_embeddings=64, hidden_size=64,
                                                       num_hidden_layers=2, num_attention_heads=4,
                                                       intermediate_size=128, bos_token_id=64, eos_token_id=64),
        "opt": lambda: transformers.OPTConfig(vocab_size=65, max_position_embeddings=64, hidden_size=64,
                                              num_hidden_layers=2, num_attention_heads=4, ffn_dim=128,
                                              word_embed_proj_dim=64, bos_token_id=64, eos_token_id=64,
                                              pad_token_id=0),
        "falcon": lambda: transformers.FalconConfig(vocab_size=65, hidden_size=64, num_hidden_layers=2,
                                                    num_attention_heads=4, multi_query=True, new_decoder_architecture=False,
                                                    bos_token_id=64, eos_token_id=64),
    }
    if family not in build:
        raise KeyError(f"tests/families.py: unknown family {family!r}; known: {', '.join(build)}")
    return build[family]()


HF_FAMILIES = ("gpt2", "llama", "qwen2", "mistral", "phi3", "gemma2", "gpt_neox", "opt", "falcon")


def hf_model(family: str, seed: int = 0) -> torch.nn.Module:
    """A freshly initialised model of `family`, eager attention, dropout off (eval mode is the caller's)."""
    import transformers

    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(hf_config(family), attn_implementation="eager")


# -- every kind of model the matrix tests try (tests/toggles/test_every_toggle_every_model.py, its multi-rank twin) ----
class PlainLM(torch.nn.Module):
    """A language model of a user's own: embedding, repeated residual blocks of linears, a head; no cache."""

    def __init__(self, vocab: int = 65, d: int = 32, layers: int = 2, hidden: int = 64,
                 linear: type = torch.nn.Linear):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList([torch.nn.Sequential(linear(d, hidden), torch.nn.GELU(), linear(hidden, d))
                                           for _ in range(layers)])
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.emb(idx)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def token_pairs(batch_size, device):
    xy = torch.randint(0, 65, (batch_size, 9), device=device)
    return xy[:, :-1], xy[:, 1:]


def lm_loss(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())


def hf_spec(family: str):
    """`family`'s tiny model as RunConfig(model=...) and GenerateConfig(model=...) take it."""
    from scalekit.hf import causal_lm

    return causal_lm(hf_model(family))


def _hf_kind(family: str, cls: str) -> tuple:
    return (lambda: dict(model=hf_spec(family), seq_len=8), lambda: hf_spec(family), cls)


def _convnet_kind() -> tuple:
    from tests.helpers import ConvNet, classify_loss, image_batch

    return (lambda: dict(model=ConvNet, batch_fn=image_batch, loss_fn=classify_loss), lambda: ConvNet(), "ConvNet")


# name -> (training fields, generation model, the class a refusal must name).  Four Hugging Face families beside
# GPT-2 and Llama, each for what makes it differ: Phi-3's fused qkv, Gemma 2's sliding-window layers and capped logits,
# GPT-NeoX's parallel residual, Falcon's one key/value head and its own Linear class (Mistral's sliding window is
# Gemma 2's; OPT is tried by the parallelism tests): each family costs the grid ~45 s of CPU
MODEL_KINDS = {
    "built-in GPT": (lambda: dict(preset="tiny", seq_len=8), lambda: "tiny", "GPT"),
    "HF GPT-2": _hf_kind("gpt2", "GPT2LMHeadModel"),
    "HF Llama": _hf_kind("llama", "LlamaForCausalLM"),
    "HF Phi-3": _hf_kind("phi3", "Phi3ForCausalLM"),
    "HF Gemma 2": _hf_kind("gemma2", "Gemma2ForCausalLM"),
    "HF GPT-NeoX": _hf_kind("gpt_neox", "GPTNeoXForCausalLM"),
    "HF Falcon": _hf_kind("falcon", "FalconForCausalLM"),
    "plain LM": (lambda: dict(model=PlainLM, batch_fn=token_pairs, loss_fn=lm_loss, tokens_per_sample=8),
                 lambda: PlainLM(), "PlainLM"),
    "ConvNet": _convnet_kind(),
}
NOT_A_LANGUAGE_MODEL = "ConvNet"


# -- the matrix's cells ---------------------------------------------------------------------------------------
WITH = {"quantized_base": {"lora": 8}, "cpu_offload": {"fsdp": True}}  # toggles that need another one on
BATCH = 4  # rows per step: both grad_accum counts below divide it, and so do 2 ranks

# A count stands for one code path whatever its size: the smallest and the largest a toggle offers (the largest is
# past the tiny models' sizes: more loss chunks than tokens, a LoRA rank above the width), except where that costs
# more than it shows here.  Counts the run's shape cannot take are the batch check's to refuse (test_config).
COUNTS = {"dataloader_num_workers": (1, 2),  # each worker is a forked process: two say "several" as well as eight
          "grad_accum": (2, BATCH)}


def modes(name: str) -> list:
    """Every mode of toggle `name` a cell tries: True for an on/off toggle, each word, and representative counts."""
    from scalekit.toggles import TOGGLES

    choices = TOGGLES[name].choices
    if choices is None:
        return [True]
    counts = [c for c in choices if isinstance(c, int)]
    words = [c for c in choices if not isinstance(c, int)]
    return [*COUNTS.get(name, sorted({min(counts), max(counts)}) if counts else ()), *words]


def one_step(fields: dict, toggles: dict):
    """A RunConfig of one step, nothing measured but the step: each cell as cheap as a run can be."""
    from scalekit import RunConfig

    return RunConfig(**{"batch_size": BATCH, **fields}, toggles=toggles, steps=1, warmup_steps=0, log_every=1,
                     device="cpu", measure_memory=False, check_memory=False)


def one_line(text: str) -> bool:
    return bool(text) and "\n" not in text.strip() and "Traceback" not in text
