"""deepspeed: the config each ZeRO mode hands DeepSpeed, and what each stage splits and offloads per rank
(planned); refused beside scalekit's zero. (Trained by real DeepSpeed on 2 gloo ranks against one process:
tests/distributed/test_distributed_deepspeed.py.)"""

from __future__ import annotations

import pytest

from scalekit import ConfigError, RunConfig
from scalekit.toggles.deepspeed import ds_config
from tests.helpers import small_plan


def test_each_mode_gives_deepspeed_its_stage_its_offload_and_the_whole_batch():
    offload = ds_config("zero3-offload", micro_batch=4, ranks=2, bf16=True)
    in_host_memory = {"device": "cpu", "pin_memory": True}
    assert offload["zero_optimization"] == {"stage": 3, "offload_optimizer": in_host_memory,
                                            "offload_param": in_host_memory}
    assert offload["train_batch_size"] == 8 and offload["bf16"] == {"enabled": True}
    plain = ds_config("zero2", micro_batch=4, ranks=2, bf16=False)
    assert plain["zero_optimization"] == {"stage": 2} and plain["bf16"] == {"enabled": False}
    # accumulation is scalekit's, and no clipping that no other run does
    assert plain["gradient_accumulation_steps"] == 1 and plain["gradient_clipping"] == 0.0


def test_each_stage_splits_what_it_says_per_rank():
    one = small_plan()
    zero1 = small_plan({"deepspeed": "zero1"}, world_size=2)
    assert zero1.params_bytes == one.params_bytes
    assert zero1.optimizer_state_bytes == -(-one.optimizer_state_bytes // 2)
    zero3 = small_plan({"deepspeed": "zero3-offload"}, world_size=2)
    assert zero3.params_bytes == zero3.optimizer_state_bytes == 0 and zero3.host_bytes > 0  # in host memory
    assert zero3.grads_bytes == -(-one.grads_bytes // 2)
    with pytest.raises(ConfigError, match="both are ZeRO"):
        RunConfig(toggles={"deepspeed": "zero1", "zero": "zero1"})
