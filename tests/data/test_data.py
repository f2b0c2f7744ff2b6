"""The shipped corpus, its training format, and the synthetic token source."""

from __future__ import annotations

import numpy as np
import torch

from scalekit import run
from scalekit.data import CharTokenizer, corpus_text, load_tokens, synthetic_batches, training_file
from tests.helpers import tiny


def test_corpus_ships_with_the_package_and_round_trips_through_the_tokenizer():
    text = corpus_text()
    assert len(text) == 1_115_394 and text.startswith("First Citizen:")
    tok = CharTokenizer(text)
    assert tok.vocab_size == 65
    assert tok.decode(tok.encode(text[:500])) == text[:500]


def test_training_format_is_a_uint16_memmap_of_the_whole_corpus():
    train, val = load_tokens("train"), load_tokens("val")
    assert train.dtype == np.uint16 and isinstance(train, np.memmap)
    assert len(train) + len(val) == 1_115_394
    assert int(train.max()) < 65
    text = corpus_text()
    assert CharTokenizer(text).decode(train[:200]) == text[:200]
    assert not list(training_file().parent.glob("*.tmp"))  # written atomically


def test_synthetic_batches_cover_any_vocab_and_shift_targets_by_one():
    x, y = next(synthetic_batches(50257, 32, 4, seed=0))
    assert x.shape == y.shape == (4, 32) and int(torch.cat([x, y]).max()) < 50257
    x2, y2 = next(synthetic_batches(50257, 32, 4, seed=0))
    assert torch.equal(x, x2)  # seeded
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_a_run_on_synthetic_tokens_works():
    result = run(tiny(data="synthetic", steps=3))
    assert result.status == "ok" and result.config["data"] == "synthetic"
