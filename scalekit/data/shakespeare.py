"""The shipped Tiny Shakespeare corpus (public domain), a character tokenizer, and its training format.

Training format: the corpus tokenized once into a flat array of uint16 token ids on disk, read back as a
memmap, so every run starts from the same bytes without re-tokenizing.  Written atomically (temporary
file, then rename): an interrupted preparation never leaves a half-written file behind.
"""

from __future__ import annotations

import os
import tempfile
from importlib import resources
from pathlib import Path

import numpy as np

CORPUS_NAME = "tinyshakespeare.txt"
VAL_FRACTION = 0.1


def corpus_text() -> str:
    return resources.files("scalekit.data").joinpath(CORPUS_NAME).read_text(encoding="utf-8")


class CharTokenizer:
    """One token per distinct character of the corpus (65 for Tiny Shakespeare)."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, s: str) -> list[int]:
        return [self.stoi[c] for c in s]

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def cache_dir() -> Path:
    root = os.environ.get("SCALEKIT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "scalekit")
    return Path(root)


def _write_atomic(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            array.tofile(f)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def training_file(split: str = "train") -> Path:
    """Path of the uint16 token file for `split` ("train" or "val"), preparing it on first use."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    path = cache_dir() / f"shakespeare_char_{split}.bin"
    if not path.exists():
        text = corpus_text()
        ids = np.array(CharTokenizer(text).encode(text), dtype=np.uint16)
        n_train = int(len(ids) * (1 - VAL_FRACTION))
        _write_atomic(cache_dir() / "shakespeare_char_train.bin", ids[:n_train])
        _write_atomic(cache_dir() / "shakespeare_char_val.bin", ids[n_train:])
    return path


def load_tokens(split: str = "train") -> np.memmap:
    return np.memmap(training_file(split), dtype=np.uint16, mode="r")
