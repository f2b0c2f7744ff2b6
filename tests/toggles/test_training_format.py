"""training_format: the pre-tokenized source gives the raw text's token batches, batch for batch
(raw_batches: tests/conftest.py)."""

from __future__ import annotations

from tests.helpers import SHAPES, assert_same, batches, tiny


def test_training_format_gives_the_same_token_batches_as_tokenizing_raw_text(raw_batches):
    assert_same(raw_batches, batches(tiny(**SHAPES, toggles=["training_format"])))
