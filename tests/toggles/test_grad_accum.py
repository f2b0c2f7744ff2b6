"""grad_accum: the gradients of the whole batch, less activation memory, and a count that must divide the
batch."""

from __future__ import annotations

import pytest

from scalekit import ConfigError, run
from tests.helpers import assert_same_grads, built, grads_of_one_step, tiny


def test_grad_accum_must_divide_the_batch():
    with pytest.raises(ConfigError, match=r"grad_accum'\]=3 must divide batch_size=8.*1, 2, 4, 8"):
        run(tiny(batch_size=8, toggles={"grad_accum": 3}))


@pytest.mark.parametrize("k", [2, 4])
def test_accumulation_gives_the_gradients_of_the_whole_batch(k):
    with built(tiny(batch_size=8)) as ctx:
        batch = next(ctx.batches)
    whole = grads_of_one_step(tiny(batch_size=8), batch)
    accumulated = grads_of_one_step(tiny(batch_size=8, toggles={"grad_accum": k}), batch)
    assert_same_grads(whole, accumulated, atol=1e-6)


def test_accumulation_lowers_measured_activation_memory():
    base = run(tiny(batch_size=16, steps=1, warmup_steps=0))
    acc = run(tiny(batch_size=16, steps=1, warmup_steps=0, toggles={"grad_accum": 4}))
    assert acc.params_bytes == base.params_bytes and acc.optimizer_state_bytes == base.optimizer_state_bytes
    assert acc.activations_bytes < 0.5 * base.activations_bytes
