"""ddp: refused on one process, saying how to launch ranks; each rank is planned with the whole model, its
optimizer state and gradient buckets, and its share of the batch. (Trained on 2 gloo ranks against one
process: tests/distributed.)"""

from __future__ import annotations

import pytest

from scalekit import ToggleUnavailable, run
from scalekit.toggles import TOGGLES
from tests.helpers import CPU, small_plan, tiny


def test_ddp_alone_is_refused_saying_how_to_launch_ranks():
    ok, why = TOGGLES["ddp"].available(CPU)
    assert not ok and "world size 1" in why and "--nproc-per-node 2" in why
    with pytest.raises(ToggleUnavailable, match="DDP needs several processes"):
        run(tiny(toggles=["ddp"]))


def test_each_ddp_rank_holds_the_whole_model_and_its_share_of_the_batch():
    one, half = small_plan(), small_plan(batch_size=8)  # half: one rank's share of 16, as one process
    ddp = small_plan({"ddp": True}, world_size=2)
    assert (ddp.params_bytes, ddp.grads_bytes, ddp.optimizer_state_bytes) == \
        (one.params_bytes, one.grads_bytes, one.optimizer_state_bytes)
    assert ddp.activations_bytes == half.activations_bytes + half.grads_bytes  # plus the gradient buckets
    assert any("every rank keeps the whole model" in note for note in ddp.notes)
