"""Your own data: a DataLoader built from your Dataset, so the data toggles act on your pipeline.

`RunConfig(dataset=..., collate_fn=...)` takes a map-style `torch.utils.data.Dataset` (anything with
__getitem__ and __len__), an `IterableDataset`, or a Hugging Face `datasets.Dataset` of tokenized text (its
numeric columns, `input_ids` among them, read as tensors).  scalekit builds the real `DataLoader` over it
with the options the data toggles set (workers, pinned memory, drop_last), and the batches go through the
same device copy (non_blocking), echo and timing as the built-in corpus's.

- map-style: endless full batches, each epoch a fresh seeded shuffle (loaders.FullBatches: the remainder of
  an epoch carried into the next, or skipped with drop_last), so the batches and their order are the same
  with or without workers;
- iterable: the dataset's own order, epoch after epoch (a new pass when one ends); with workers, every
  worker runs the whole iterator unless the dataset splits itself by torch.utils.data.get_worker_info(), as
  PyTorch documents.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, default_collate

from ..errors import ConfigError
from .loaders import FullBatches

MODEL_COLUMNS = ("input_ids", "attention_mask", "labels", "token_type_ids", "position_ids")


def is_hf_dataset(dataset: Any) -> bool:
    """A Hugging Face datasets.Dataset (checked without importing datasets)."""
    module = sys.modules.get("datasets")
    return module is not None and isinstance(dataset, getattr(module, "Dataset", ()))


def check_dataset(dataset: Any) -> None:
    """Refuse what no DataLoader can read, naming the field."""
    if isinstance(dataset, IterableDataset) or is_hf_dataset(dataset):
        return
    if not (callable(getattr(dataset, "__getitem__", None)) and callable(getattr(dataset, "__len__", None))):
        raise ConfigError(f"RunConfig.dataset must be a torch.utils.data.Dataset (with __getitem__ and __len__), an "
                          f"IterableDataset or a Hugging Face datasets.Dataset, got {type(dataset).__name__}")
    if len(dataset) == 0:
        raise ConfigError("RunConfig.dataset is empty: it holds no sample")


def readable(dataset: Any):
    """The dataset as the DataLoader reads it: a Hugging Face dataset's model columns as torch tensors."""
    if not is_hf_dataset(dataset):
        return dataset
    columns = [c for c in MODEL_COLUMNS if c in dataset.column_names]
    if "input_ids" not in columns:
        raise ConfigError(f"RunConfig.dataset: a Hugging Face dataset needs an 'input_ids' column (tokenized text); "
                          f"it has {dataset.column_names}")
    return dataset.with_format("torch", columns=columns)


def stack_samples(samples: list) -> Any:
    """torch's default collate, with a batch of samples of different lengths said in words (the default collate
    stacks tensors, so it cannot batch them).  A module-level function: worker processes receive it by pickling."""
    try:
        return default_collate(samples)
    except RuntimeError as exc:
        if "stack expects each tensor to be equal size" not in str(exc):
            raise
        raise ConfigError(f"RunConfig.dataset: its samples have different lengths, and torch's default collate "
                          f"stacks them into one tensor ({exc}): give RunConfig.collate_fn (pad or cut each batch "
                          f"to one length), or switch on sequence_packing (for a model that takes position_ids "
                          f"and a 4-D attention mask, as Hugging Face models do)") from None


class Epochs:
    """An iterable dataset's loader, pass after pass: a new iterator when one ends (the DataLoader's own
    iterator, so its workers end when it is closed)."""

    def __init__(self, loader: DataLoader):
        self.loader = loader
        self._iterator = iter(loader)

    def __iter__(self) -> Epochs:
        return self

    def __next__(self):
        try:
            return next(self._iterator)
        except StopIteration:
            self._iterator = iter(self.loader)
        try:
            return next(self._iterator)
        except StopIteration:  # a whole new pass gave no batch: said in words, not as a bare StopIteration
            raise ConfigError(self._empty_pass()) from None

    def _empty_pass(self) -> str:
        short = f", or fewer than batch_size={self.loader.batch_size} with drop_last" if self.loader.drop_last else ""
        return f"RunConfig.dataset: the iterable dataset gave no batch in a whole pass (it yielded no sample{short})"

    @property
    def _workers(self):  # what LoaderBatches reads of a multi-process iterator
        return getattr(self._iterator, "_workers", [])

    def _shutdown_workers(self) -> None:
        shutdown = getattr(self._iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


def dataset_loader(dataset: Any, batch_size: int, seed: int, collate_fn=None, drop_last: bool = False,
                   **loader_kwargs) -> DataLoader | Epochs:
    """The DataLoader over your dataset: endless full batches (map-style), or pass after pass (iterable)."""
    data = readable(dataset)
    generator = torch.Generator().manual_seed(seed)
    collate_fn = collate_fn or stack_samples
    if isinstance(data, IterableDataset):
        if loader_kwargs.get("num_workers"):
            loader_kwargs["persistent_workers"] = True  # one set of workers for every pass
        return Epochs(DataLoader(data, batch_size=batch_size, drop_last=drop_last, collate_fn=collate_fn,
                                 generator=generator, **loader_kwargs))
    sampler = FullBatches(len(data), batch_size, generator, drop_last)
    return DataLoader(data, batch_sampler=sampler, collate_fn=collate_fn, generator=generator, **loader_kwargs)


def first_batch(dataset: Any, batch_size: int, seed: int, collate_fn=None):
    """One batch of the dataset, read in this process (for counting FLOPs and tokens before the run)."""
    loader = dataset_loader(dataset, batch_size, seed, collate_fn)
    return next(iter(loader))


def sample_tokens(dataset: Any) -> int | None:
    """Tokens in one sample of a map-style dataset of tokenized text (its input_ids' length), or None."""
    data = readable(dataset)
    if isinstance(data, IterableDataset):
        return None
    sample = data[0]
    ids = sample.get("input_ids") if isinstance(sample, Mapping) else None
    return len(ids) if ids is not None and hasattr(ids, "__len__") else None
