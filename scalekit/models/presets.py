"""Named model sizes. `tiny` runs a CPU step in milliseconds; `gpt2-124m` is GPT-2 small's exact shape."""

from __future__ import annotations

from dataclasses import dataclass

from .gpt import GPTConfig

CHAR_VOCAB = 65  # distinct characters in Tiny Shakespeare


@dataclass(frozen=True)
class Preset:
    name: str
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    vocab_size: int
    batch_size: int  # default batch for this preset
    data: str  # default data source: "shakespeare" (characters) or "synthetic"
    note: str
    pretrained: str | None = None  # the shipped weights of this shape (RunConfig(init="pretrained") loads them)

    def gpt_config(self, seq_len: int | None = None) -> GPTConfig:
        return GPTConfig(block_size=max(self.block_size, seq_len or 0), vocab_size=self.vocab_size,
                         n_layer=self.n_layer, n_head=self.n_head, n_embd=self.n_embd)


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("tiny", 2, 2, 64, 64, CHAR_VOCAB, 8, "shakespeare", "≈0.1M params; a CPU step in milliseconds"),
        Preset("small", 4, 4, 128, 128, CHAR_VOCAB, 16, "shakespeare", "≈0.8M params; CPU-friendly"),
        Preset("medium", 6, 6, 384, 256, CHAR_VOCAB, 16, "shakespeare",
               "≈10.7M params; nanoGPT's shakespeare-char model"),
        Preset("tiny-vocab50k", 2, 2, 64, 64, 50304, 8, "synthetic",
               "tiny's width with GPT-2's padded vocabulary (50,304): the loss head dominates memory"),
        Preset("gpt2-124m", 12, 12, 768, 1024, 50257, 16, "synthetic", "GPT-2 small: 124M params"),
        Preset("shakespeare-char", 4, 4, 128, 1024, CHAR_VOCAB, 8, "shakespeare",
               "≈0.93M params, context 1024: the shape of the shipped pretrained model", "shakespeare-char"),
    )
}

CPU_DEFAULT_PRESET = "tiny"
GPU_DEFAULT_PRESET = "gpt2-124m"
