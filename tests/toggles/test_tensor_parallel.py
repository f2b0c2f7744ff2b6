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


def test_tensor_parallel_alone_on_more_ranks_than_its_degree_is_refused_naming_the_numbers():
    # 4 ranks at degree 2 form 2 data-parallel replicas: without a toggle that averages their gradients each would
    # train on its half of the batch alone; refused from the config and the ranks, before any rank starts
    cfg = RunConfig(toggles={"tensor_parallel": 2})
    with pytest.raises(ConfigError, match=r"tensor_parallel=2 on 4 ranks leaves 2 data-parallel replicas that nothing "
                                          r"keeps in step .*: turn fsdp on too, or launch 2 ranks"):
        cfg.check_ranks(4)
    with pytest.raises(ConfigError, match=r"tensor_parallel=2,sequence_parallel on 8 ranks leaves 4 data-parallel "
                                          r"replicas .*launch 2 ranks"):
        RunConfig(toggles={"tensor_parallel": "2,sequence_parallel"}).check_ranks(8)
    cfg.check_ranks(2)  # one tensor-parallel group: no replicas to keep in step
    RunConfig(toggles={"tensor_parallel": 2, "fsdp": True}).check_ranks(4)  # fsdp averages over the 'dp' dimension
    # the same holds of pipelines side by side (',stages=S') without fsdp
    with pytest.raises(ConfigError, match=r"pipeline_parallel=1f1b,stages=2 on 4 ranks leaves 2 data-parallel "
                                          r"replicas .*turn fsdp on too, or launch 2 ranks"):
        RunConfig(toggles={"pipeline_parallel": "1f1b,stages=2"}).check_ranks(4)
