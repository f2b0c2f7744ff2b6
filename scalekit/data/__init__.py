from .loaders import DATA_SOURCES, TokenWindows, shakespeare_batches, synthetic_batches, window_loader
from .shakespeare import CharTokenizer, corpus_text, load_tokens, training_file

__all__ = ["DATA_SOURCES", "CharTokenizer", "TokenWindows", "corpus_text", "load_tokens", "shakespeare_batches",
           "synthetic_batches", "training_file", "window_loader"]
