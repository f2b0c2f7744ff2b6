"""fsdp: 1/W of the weights, gradients and optimizer state per rank of W, planned; refused beside ddp and
on one process. (Trained on 2 gloo ranks against one process: tests/distributed.)"""

from __future__ import annotations

import pytest

from scalekit import ConfigError, RunConfig
from scalekit.toggles import TOGGLES
from tests.helpers import CPU, small_plan


@pytest.mark.parametrize("ranks", [2, 4])
def test_fsdp_keeps_one_share_of_the_training_state_per_rank(ranks):
    one, fsdp = small_plan(), small_plan({"fsdp": True}, world_size=ranks)
    for part in ("params_bytes", "grads_bytes", "optimizer_state_bytes"):
        assert getattr(fsdp, part) == -(-getattr(one, part) // ranks), part
    assert any(f"fsdp: 1/{ranks} of the weights" in note for note in fsdp.notes)


def test_fsdp_is_refused_beside_ddp_and_alone():
    with pytest.raises(ConfigError, match="'ddp' and 'fsdp' cannot be on together.*pick one"):
        RunConfig(toggles=["ddp", "fsdp"])
    ok, why = TOGGLES["fsdp"].available(CPU)
    assert not ok and "FSDP needs several processes" in why
