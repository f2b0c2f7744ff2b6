"""Batches for the built-in GPT: windows of the shipped corpus, or synthetic tokens at any vocab size.

The corpus comes in two forms: "shakespeare" reads its training format (the pre-tokenized memmap), and
"shakespeare-raw" tokenizes and transforms raw text per sample (`scalekit.data.raw`).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ..errors import ConfigError
from .shakespeare import load_tokens

# data sources a RunConfig can name: the corpus's training split, its raw text read and transformed per sample
# (the data-bound pipeline of chapter 05), random tokens, and the tail of plays the shipped model never saw (for
# fine-tuning; its own held-out part is measured before and after)
DATA_SOURCES = ("shakespeare", "shakespeare-raw", "synthetic", "new-plays")
FINETUNE_HELDOUT = {"new-plays": "new-plays-heldout"}  # fine-tuning sources -> their held-out split


class TokenWindows(Dataset):
    """Non-overlapping windows of seq_len+1 tokens: x is the first seq_len, y the same shifted by one."""

    def __init__(self, tokens: np.ndarray, seq_len: int):
        if len(tokens) < seq_len + 1:
            raise ValueError(f"{len(tokens)} tokens are too few for seq_len={seq_len}")
        self.tokens = tokens
        self.seq_len = seq_len

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.seq_len

    def __getitem__(self, i: int):
        start = i * self.seq_len
        chunk = torch.from_numpy(self.tokens[start: start + self.seq_len + 1].astype(np.int64))
        return chunk[:-1], chunk[1:]


class FullBatches(Sampler):
    """Index batches of exactly `batch_size`, epoch after epoch, each epoch a fresh shuffle.

    A plain DataLoader ends an epoch of N samples with a short batch of N mod B; a step that splits its
    batch into micro-batches or over ranks, or a compiled model, cannot always take it.  Here the remainder
    of an epoch is carried into the first batch of the next (nothing skipped), or, with drop_last, skipped
    as DataLoader(drop_last=True) skips it.  A batch larger than the dataset simply spans several epochs.
    """

    def __init__(self, n_samples: int, batch_size: int, generator: torch.Generator, drop_last: bool = False):
        if drop_last and n_samples < batch_size:
            raise ConfigError(f"RunConfig.batch_size ({batch_size}) is larger than the {n_samples:,} sequences an "
                              f"epoch holds, and drop_last skips every partial batch: no batch is left; switch "
                              f"drop_last off or use a batch of at most {n_samples}")
        self.n, self.batch_size, self.generator, self.drop_last = n_samples, batch_size, generator, drop_last

    def __iter__(self):
        carry: list[int] = []
        b = self.batch_size
        while True:
            order = torch.randperm(self.n, generator=self.generator).tolist()
            if self.drop_last:
                yield from (order[i:i + b] for i in range(0, self.n - b + 1, b))
                continue
            pool = carry + order
            full = len(pool) // b * b
            yield from (pool[i:i + b] for i in range(0, full, b))
            carry = pool[full:]


def window_loader(tokens: np.ndarray, seq_len: int, batch_size: int, seed: int, drop_last: bool = False,
                  **loader_kwargs) -> DataLoader:
    """A plain DataLoader over the windows, one epoch per iteration (its last batch short unless drop_last)."""
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(TokenWindows(tokens, seq_len), batch_size=batch_size, shuffle=True,
                      drop_last=drop_last, generator=generator, **loader_kwargs)


def shakespeare_loader(seq_len: int, batch_size: int, seed: int, drop_last: bool = False,
                       split: str = "train", **loader_kwargs) -> DataLoader:
    """A DataLoader of endless full batches of windows of the corpus (FullBatches: no short batch at an
    epoch's end)."""
    return token_loader(load_tokens(split), seq_len, batch_size, seed, drop_last, **loader_kwargs)


def token_loader(tokens: np.ndarray, seq_len: int, batch_size: int, seed: int, drop_last: bool = False,
                 **loader_kwargs) -> DataLoader:
    """Endless full batches of windows of `tokens` (the corpus's split, or a data file's training part)."""
    dataset = TokenWindows(tokens, seq_len)
    generator = torch.Generator().manual_seed(seed)
    sampler = FullBatches(len(dataset), batch_size, generator, drop_last)
    # the loader draws from the generator too (a seed for workers) before the sampler's first shuffle,
    # as a shuffling DataLoader does: the first epoch's batches are the same as DataLoader(shuffle=True)'s
    return DataLoader(dataset, batch_sampler=sampler, generator=generator, **loader_kwargs)


def shakespeare_batches(seq_len: int, batch_size: int, seed: int, drop_last: bool = False,
                        split: str = "train", **loader_kwargs) -> Iterator:
    """Endless full batches of windows of the corpus."""
    return iter(shakespeare_loader(seq_len, batch_size, seed, drop_last, split, **loader_kwargs))


def synthetic_batches(vocab_size: int, seq_len: int, batch_size: int, seed: int,
                      device: torch.device | str = "cpu") -> Iterator:
    """Uniform random tokens made on the device: throughput runs with no input pipeline in the way."""
    device = torch.device(device)
    generator = torch.Generator(device=device).manual_seed(seed)
    while True:
        xy = torch.randint(0, vocab_size, (batch_size, seq_len + 1), device=device, generator=generator)
        yield xy[:, :-1], xy[:, 1:]
