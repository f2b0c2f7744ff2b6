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
