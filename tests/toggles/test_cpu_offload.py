"""cpu_offload: FSDP2's offload policy: it needs fsdp, and the shards fsdp keeps per rank move to host
memory (planned per rank). (Run on 2 gloo ranks: tests/distributed.)"""

from __future__ import annotations

import pytest

from scalekit import ConfigError, RunConfig
from tests.helpers import small_plan


def test_cpu_offload_needs_fsdp():
    with pytest.raises(ConfigError, match="'cpu_offload' needs 'fsdp' on too"):
        RunConfig(toggles=["cpu_offload"])


def test_cpu_offload_moves_fsdps_shards_to_host_memory():
    fsdp = small_plan({"fsdp": True}, world_size=2)
    offloaded = small_plan({"fsdp": True, "cpu_offload": True}, world_size=2)
    assert (offloaded.params_bytes, offloaded.grads_bytes, offloaded.optimizer_state_bytes) == (0, 0, 0)
    assert fsdp.host_bytes == 0
    assert offloaded.host_bytes == fsdp.params_bytes + fsdp.grads_bytes + fsdp.optimizer_state_bytes
    assert offloaded.peak_bytes < fsdp.peak_bytes
