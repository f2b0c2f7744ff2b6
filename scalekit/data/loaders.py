"""Batches for the built-in GPT: windows of the shipped corpus, or synthetic tokens at any vocab size."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from .shakespeare import load_tokens

DATA_SOURCES = ("shakespeare", "synthetic")


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


def window_loader(tokens: np.ndarray, seq_len: int, batch_size: int, seed: int, drop_last: bool = False,
                  **loader_kwargs) -> DataLoader:
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(TokenWindows(tokens, seq_len), batch_size=batch_size, shuffle=True,
                      drop_last=drop_last, generator=generator, **loader_kwargs)


def endless(loader: DataLoader) -> Iterator:
    """Loop over a DataLoader epoch after epoch (each epoch reshuffled by the loader's generator)."""
    while True:
        yielded = False
        for batch in loader:
            yielded = True
            yield batch
        if not yielded:
            raise ValueError("the data loader produced no batch (drop_last with fewer samples than the batch?)")


def shakespeare_batches(seq_len: int, batch_size: int, seed: int, drop_last: bool = False,
                        split: str = "train", **loader_kwargs) -> Iterator:
    return endless(window_loader(load_tokens(split), seq_len, batch_size, seed, drop_last, **loader_kwargs))


def synthetic_batches(vocab_size: int, seq_len: int, batch_size: int, seed: int,
                      device: torch.device | str = "cpu") -> Iterator:
    """Uniform random tokens made on the device: throughput runs with no input pipeline in the way."""
    device = torch.device(device)
    generator = torch.Generator(device=device).manual_seed(seed)
    while True:
        xy = torch.randint(0, vocab_size, (batch_size, seq_len + 1), device=device, generator=generator)
        yield xy[:, :-1], xy[:, 1:]
