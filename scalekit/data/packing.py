"""Sequence packing: variable-length documents laid end to end in full rows, each attending only to itself.

A row of `seq_len` tokens holds whole documents, one after another (a document longer than a row is cut
into row-sized pieces); what no document fills at the end of a row is padding.  Each row comes with:
- `position_ids` that restart at 0 for every document, so each sees the positions it would see alone;
- a 4-D additive `attention_mask` (1, seq_len, seq_len): 0 where a token may attend (causal, within its own
  document), the dtype's minimum elsewhere (Hugging Face models take it as it is, eager and SDPA alike);
- `labels`: the tokens, with -100 at each document's first token (so the last token of the previous
  document predicts nothing across the boundary) and on the padding.
Each padding token is its own document of position 0 (it attends to itself alone); a document has at least two
tokens (a one-token document has nothing to predict and is left out).  So the real tokens of a row are those
whose position is not 0 or whose next position is 1 (`real_tokens`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from ..errors import ConfigError
from .user import readable

IGNORE = -100  # the label cross-entropy leaves out (torch's and transformers' ignore_index)
MIN_DOCUMENT_TOKENS = 2  # a one-token document has nothing to predict: it is left out
# An endless dataset whose documents are all too short would be read forever, inside the build where the Lab's Stop
# cannot reach: after this many too-short documents in a row, packing gives up and says why.
MAX_SHORT_DOCUMENTS_IN_A_ROW = 10_000


def check_row_length(seq_len: int) -> None:
    """Refuse rows too short for any document: a row of one token could only hold a document of one token."""
    if seq_len < MIN_DOCUMENT_TOKENS:
        raise ConfigError(f"RunConfig.seq_len={seq_len} is too short for sequence_packing: a packed row holds whole "
                          f"documents of at least {MIN_DOCUMENT_TOKENS} tokens (one token has nothing to predict), so "
                          f"no row could ever be filled; set seq_len to {MIN_DOCUMENT_TOKENS} or more")


def too_short(where: str, longest: int) -> ConfigError:
    return ConfigError(f"RunConfig.dataset: sequence_packing found no document of at least {MIN_DOCUMENT_TOKENS} "
                       f"tokens {where} (the longest has {longest} token{'s' * (longest != 1)}); a "
                       f"document of one token has nothing to predict: give documents of {MIN_DOCUMENT_TOKENS} "
                       f"tokens or more, or leave sequence_packing off")


def documents(dataset: Any, seed: int) -> Iterator[torch.Tensor]:
    """The dataset's documents of at least two tokens (1-D token ids), epoch after epoch: map-style in a fresh
    seeded order each epoch.  Refused (ConfigError) when a whole pass, or MAX_SHORT_DOCUMENTS_IN_A_ROW documents
    in a row, has none: otherwise packing would wait for one forever."""
    data = readable(dataset)
    generator = torch.Generator().manual_seed(seed)
    short_in_a_row = longest = 0
    while True:
        order = iter(data) if isinstance(data, IterableDataset) else \
            (data[int(i)] for i in torch.randperm(len(data), generator=generator))
        seen = kept = 0
        for sample in order:
            ids = sample["input_ids"] if isinstance(sample, Mapping) else sample
            ids = torch.as_tensor(ids).reshape(-1)
            seen += 1
            if len(ids) < MIN_DOCUMENT_TOKENS:
                short_in_a_row, longest = short_in_a_row + 1, max(longest, len(ids))
                if short_in_a_row >= MAX_SHORT_DOCUMENTS_IN_A_ROW:
                    raise too_short(f"in {short_in_a_row:,} documents in a row", longest)
                continue
            short_in_a_row, kept = 0, kept + 1
            yield ids
        if not seen:
            raise ConfigError("RunConfig.dataset yielded no document to pack")
        if not kept:
            raise too_short(f"in a whole pass over its {seen:,} documents", longest)


def pieces(docs: Iterator[torch.Tensor], seq_len: int) -> Iterator[torch.Tensor]:
    """Documents cut into pieces no longer than a row, each of at least two tokens."""
    for doc in docs:
        for piece in doc.split(seq_len):
            if len(piece) >= MIN_DOCUMENT_TOKENS:
                yield piece


def pack_row(docs: list[torch.Tensor], seq_len: int) -> dict[str, torch.Tensor]:
    """One row: `docs` end to end, padding after them, with positions, labels and the block-diagonal mask."""
    used = sum(len(d) for d in docs)
    pad = seq_len - used
    ids = torch.cat([*docs, torch.zeros(pad, dtype=docs[0].dtype)]).long()
    positions = torch.cat([*(torch.arange(len(d)) for d in docs), torch.zeros(pad, dtype=torch.long)])
    segment = torch.cat([torch.full((len(d),), k) for k, d in enumerate(docs)] +
                        [len(docs) + torch.arange(pad)])  # each padding token alone
    labels = ids.clone()
    labels[positions == 0] = IGNORE
    allowed = torch.ones(seq_len, seq_len, dtype=torch.bool).tril() & (segment[:, None] == segment[None, :])
    mask = torch.zeros(1, seq_len, seq_len).masked_fill(~allowed, torch.finfo(torch.float32).min)
    return {"input_ids": ids, "labels": labels, "position_ids": positions, "attention_mask": mask}


class PackedDocuments(IterableDataset):
    """`dataset`'s documents packed greedily, in order, into rows of `seq_len` tokens, without end.

    Read by DataLoader workers, each worker yields the rows of every num_workers-th batch of `batch_size` rows
    (worker k: batches k, k + n, ...), which the DataLoader takes from its workers in turn: the same batches, in
    the same order, as without workers (not each worker the whole stream, every batch n times)."""

    def __init__(self, dataset: Any, seq_len: int, seed: int, batch_size: int = 1):
        check_row_length(seq_len)  # refused here, before anything reads the dataset
        self.dataset, self.seq_len, self.seed, self.batch_size = dataset, seq_len, seed, batch_size

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        share, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for k, row in enumerate(self._rows()):
            if (k // self.batch_size) % workers == share:
                yield pack_row(row, self.seq_len)  # (only this worker's rows are made into tensors)

    def _rows(self) -> Iterator[list[torch.Tensor]]:
        """The documents (pieces) of each row, in order."""
        row: list[torch.Tensor] = []
        for piece in pieces(documents(self.dataset, self.seed), self.seq_len):
            if sum(len(d) for d in row) + len(piece) > self.seq_len:
                yield row
                row = []
            row.append(piece)


def real_tokens(batch: Mapping) -> int:
    """Tokens of a packed batch that belong to a document (padding left out), from its position ids."""
    positions = batch["position_ids"]
    following = torch.nn.functional.pad(positions[..., 1:], (0, 1), value=0)
    return int(((positions != 0) | (following == 1)).sum())
