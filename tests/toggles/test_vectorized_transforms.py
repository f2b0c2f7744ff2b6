"""vectorized_transforms: the batch transform gives the per-sample loop's batches, batch for batch, also
with training_format (raw_batches: tests/conftest.py)."""

from __future__ import annotations

from tests.helpers import SHAPES, assert_same, batches, tiny


def test_vectorized_transforms_give_the_same_batches_as_the_per_sample_loop(raw_batches):
    assert_same(raw_batches, batches(tiny(**SHAPES, toggles=["vectorized_transforms"])))
    assert_same(raw_batches, batches(tiny(**SHAPES, toggles=["vectorized_transforms", "training_format"])))
