from .loaders import (
    DATA_SOURCES,
    TokenWindows,
    shakespeare_batches,
    shakespeare_loader,
    synthetic_batches,
    window_loader,
)
from .pipeline import CountedBatches, LoaderBatches, MappedBatches, to_device
from .raw import DEFAULT_TRANSFORM_ROUNDS, raw_loader
from .shakespeare import CharTokenizer, corpus_text, load_tokens, split_text, training_file
from .tokenized import TokenizedFile, tokenize_file
from .user import check_dataset, dataset_loader, first_batch, is_hf_dataset, sample_tokens

__all__ = ["DATA_SOURCES", "DEFAULT_TRANSFORM_ROUNDS", "CharTokenizer", "CountedBatches", "LoaderBatches", "MappedBatches",
           "TokenWindows", "corpus_text", "load_tokens", "raw_loader", "shakespeare_batches", "shakespeare_loader",
           "split_text", "synthetic_batches", "to_device", "training_file", "window_loader", "check_dataset",
           "dataset_loader", "first_batch", "is_hf_dataset", "sample_tokens", "TokenizedFile", "tokenize_file"]
