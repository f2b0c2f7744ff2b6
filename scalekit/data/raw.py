"""A realistic, slow input pipeline to start from: raw text, decoded, tokenized and transformed per sample.

`data="shakespeare-raw"`: a `torch.utils.data.Dataset` whose every sample is cut from the raw text of the
corpus as corpora ship (compressed: `RawText` decompresses the block holding the window), tokenized there
(a dictionary lookup per character, in Python) and given its character noise (a Python loop per sample,
`noise.noise_sample`, costing what `RunConfig.transform_rounds` says), then collated by a real
`DataLoader`.  The data toggles change pieces of it:
- `training_format` reads the windows from the pre-tokenized uint16 memmap instead (`TokenFile`): the
  same tokens, without decompressing or tokenizing;
- `vectorized_transforms` applies the same noise to the whole batch in the collate function, with
  tensor ops (`noise.noise_batch`);
- `dataloader_num_workers` and `dataloader_pin_memory` are DataLoader options.
Every sample is numbered by its place in the stream (its draw) and its noise depends on that number, not
on which process made it, so the batches are the same, in the same order, whatever the toggles.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from .loaders import FullBatches
from .noise import noise_batch, noise_sample
from .shakespeare import CharTokenizer, corpus_text, load_tokens, split_text

DEFAULT_TRANSFORM_ROUNDS = 64  # hash rounds per character when RunConfig.transform_rounds is None


class RawText:
    """Windows of the raw text as corpora ship it, compressed, decoded and tokenized when asked for.

    Text corpora ship compressed (gzip, zstd).  A reader that needs a window at a random place decompresses
    the block that holds it: here blocks of BLOCK_CHARS characters, compressed one by one (as seekable
    formats such as BGZF do), and no decompressed block is kept, as a reader of a corpus far larger than
    memory could not keep them."""

    def __init__(self, blocks: tuple[bytes, ...], n_chars: int, tokenizer: CharTokenizer):
        self.blocks, self.n_chars, self.tokenizer = blocks, n_chars, tokenizer

    def __len__(self) -> int:
        return self.n_chars

    def window(self, start: int, n: int) -> list[int]:
        first, last = start // BLOCK_CHARS, (start + n - 1) // BLOCK_CHARS
        text = "".join(zlib.decompress(self.blocks[b]).decode("utf-8") for b in range(first, last + 1))
        offset = start - first * BLOCK_CHARS
        return self.tokenizer.encode(text[offset:offset + n])


BLOCK_CHARS = 2**16  # characters per compressed block of the raw text


@functools.lru_cache(maxsize=2)
def compressed_blocks(split: str) -> tuple[tuple[bytes, ...], int]:
    """The raw text of `split` compressed in blocks of BLOCK_CHARS characters (made once per process)."""
    text = split_text(split)
    blocks = tuple(zlib.compress(text[i:i + BLOCK_CHARS].encode("utf-8"))
                   for i in range(0, len(text), BLOCK_CHARS))
    return blocks, len(text)


class TokenFile:
    """Windows of the training format: the corpus tokenized once, a uint16 memmap on disk."""

    def __init__(self, tokens: np.ndarray):
        self.tokens = tokens

    def __len__(self) -> int:
        return len(self.tokens)

    def window(self, start: int, n: int) -> list[int]:
        return self.tokens[start:start + n].tolist()


@dataclass(frozen=True)
class Noise:
    """The character noise of one run: its seed, its cost in hash rounds per token, the vocabulary it draws from."""

    seed: int
    rounds: int
    vocab_size: int


class NoisyWindows(Dataset):
    """Sample (draw, i): window i of seq_len+1 tokens; x is its first seq_len tokens, with the sample's noise
    applied here when `noise` is given; y the same window shifted by one, clean."""

    def __init__(self, reader, seq_len: int, noise: Noise | None):
        if len(reader) < seq_len + 1:
            raise ValueError(f"{len(reader)} tokens are too few for seq_len={seq_len}")
        self.reader, self.seq_len, self.noise = reader, seq_len, noise

    def __len__(self) -> int:
        return (len(self.reader) - 1) // self.seq_len

    def __getitem__(self, key: tuple[int, int]):
        draw, i = key
        ids = self.reader.window(i * self.seq_len, self.seq_len + 1)
        x, y = ids[:-1], ids[1:]
        if self.noise is not None:
            n = self.noise
            x = noise_sample(x, draw, n.seed, n.rounds, n.vocab_size)
        return draw, torch.tensor(x, dtype=torch.int64), torch.tensor(y, dtype=torch.int64)


class Collate:
    """Stack the samples into (x, y); with `noise`, apply it to the whole batch at once (vectorized)."""

    def __init__(self, noise: Noise | None = None):
        self.noise = noise

    def __call__(self, samples):
        draws = torch.tensor([draw for draw, _, _ in samples], dtype=torch.int64)
        x = torch.stack([x for _, x, _ in samples])
        y = torch.stack([y for _, _, y in samples])
        if self.noise is not None:
            n = self.noise
            x = noise_batch(x, draws, n.seed, n.rounds, n.vocab_size)
        return x, y


class Drawn(Sampler):
    """FullBatches' index batches, each index paired with its draw: the sample's place in the stream."""

    def __init__(self, batches: FullBatches):
        self.batches = batches

    def __iter__(self):
        draw = 0
        for batch in self.batches:
            yield [(draw + j, i) for j, i in enumerate(batch)]
            draw += len(batch)


def raw_loader(seq_len: int, batch_size: int, seed: int, transform_rounds: int = DEFAULT_TRANSFORM_ROUNDS, *,
               pretokenized: bool = False, batch_transforms: bool = False, drop_last: bool = False,
               split: str = "train", **loader_kwargs) -> DataLoader:
    """The shakespeare-raw pipeline as a DataLoader of endless full batches (see the module's docstring)."""
    tokenizer = CharTokenizer(corpus_text())
    reader = TokenFile(load_tokens(split)) if pretokenized else RawText(*compressed_blocks(split), tokenizer)
    noise = Noise(seed, transform_rounds, tokenizer.vocab_size) if transform_rounds else None
    dataset = NoisyWindows(reader, seq_len, None if batch_transforms else noise)
    generator = torch.Generator().manual_seed(seed)
    sampler = Drawn(FullBatches(len(dataset), batch_size, generator, drop_last))
    # the loader draws a worker seed from the generator before the first shuffle, as for "shakespeare":
    # the windows come in the same order as there
    return DataLoader(dataset, batch_sampler=sampler, generator=generator,
                      collate_fn=Collate(noise if batch_transforms else None), **loader_kwargs)
