"""tensor_parallel: a degree (True is 2), refused in words otherwise and beside ddp; each rank holds its
share of the blocks' weights, the rest replicated (planned per rank). (Trained on 2 gloo ranks against one
process: tests/distributed.)"""

from __future__ import annotations

import pytest

from scalekit import ConfigError, RunConfig
from scalekit.toggles import TOGGLES
from tests.helpers import small_plan


def test_tensor_parallel_takes_a_degree_and_refuses_anything_else():
    assert TOGGLES["tensor_parallel"].validate(True) == 2 and TOGGLES["tensor_parallel"].validate(4) == 4
    with pytest.raises(ConfigError, match=r"toggles\['tensor_parallel'\] must be .*the degree"):
        RunConfig(toggles={"tensor_parallel": "x"})
    with pytest.raises(ConfigError, match="'ddp' and 'tensor_parallel' cannot be on together"):
        RunConfig(toggles={"tensor_parallel": 2, "ddp": True})


def test_each_tensor_parallel_rank_holds_half_of_each_blocks_weights():
    one, split = small_plan(), small_plan({"tensor_parallel": 2}, world_size=2)
    assert one.params_bytes // 2 < split.params_bytes < one.params_bytes  # the blocks halved, the rest whole
    assert one.grads_bytes // 2 < split.grads_bytes < one.grads_bytes
    assert any("1/2 of each block's weights" in note for note in split.notes)
