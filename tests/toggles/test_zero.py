"""zero: ZeRO-1 splits the optimizer state over the ranks, ZeRO-2 the gradients too (planned per rank);
refused beside the other ways of spreading training. (Trained on 2 gloo ranks against one process:
tests/distributed.)"""

from __future__ import annotations

import re

import pytest

from scalekit import ConfigError, RunConfig
from scalekit.toggles import TOGGLES
from tests.helpers import small_plan


def test_zero1_splits_the_optimizer_state_and_zero2_the_gradients_too():
    one = small_plan()
    zero1, zero2 = (small_plan({"zero": mode}, world_size=2) for mode in ("zero1", "zero2"))
    assert (zero1.params_bytes, zero1.grads_bytes) == (one.params_bytes, one.grads_bytes)
    assert zero1.optimizer_state_bytes == zero2.optimizer_state_bytes == -(-one.optimizer_state_bytes // 2)
    assert zero2.grads_bytes == -(-one.grads_bytes // 2)
    assert any("ZeRO-1: 1/2 of the optimizer state per rank" in note for note in zero1.notes)


@pytest.mark.parametrize("other", ["ddp", "fsdp", "deepspeed"])
def test_zero_is_refused_beside_another_way_of_spreading_training_saying_why(other):
    with pytest.raises(ConfigError, match=re.escape(TOGGLES["zero"].excludes[other])):
        RunConfig(toggles={"zero": "zero1", other: True})
