from .loaders import (
    DATA_SOURCES,
    TokenWindows,
    shakespeare_batches,
    shakespeare_loader,
    synthetic_batches,
    window_loader,
)
from .pipeline import CountedBatches, LoaderBatches, to_device
from .shakespeare import CharTokenizer, corpus_text, load_tokens, training_file

__all__ = ["DATA_SOURCES", "CharTokenizer", "CountedBatches", "LoaderBatches",
           "TokenWindows", "corpus_text", "load_tokens", "shakespeare_batches", "shakespeare_loader",
           "synthetic_batches", "to_device", "training_file", "window_loader"]
