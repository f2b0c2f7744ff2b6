"""pipeline_parallel: a schedule (True is 1f1b), refused in words otherwise and beside grad_accum; each
rank holds its stage's blocks (planned per rank). (Trained on gloo ranks against one process:
tests/distributed.)"""

from __future__ import annotations

import pytest

from scalekit import ConfigError, RunConfig
from scalekit.toggles import TOGGLES
from tests.helpers import small_plan


def test_pipeline_parallel_takes_a_schedule_and_refuses_anything_else():
    validate = TOGGLES["pipeline_parallel"].validate
    assert validate(True) == "1f1b"
    assert (validate("gpipe"), validate("1f1b,stages=2")) == ("gpipe", "1f1b,stages=2")
    with pytest.raises(ConfigError, match="must be True, 'gpipe', '1f1b' or 'interleaved'.*got 'zigzag'"):
        RunConfig(toggles={"pipeline_parallel": "zigzag"})
    with pytest.raises(ConfigError, match="cuts each batch into micro-batches itself"):
        RunConfig(toggles={"pipeline_parallel": "1f1b", "grad_accum": 2})


def test_each_pipeline_stage_holds_its_share_of_the_blocks():
    one, staged = small_plan(), small_plan({"pipeline_parallel": "1f1b"}, world_size=2)
    assert one.params_bytes // 2 < staged.params_bytes < one.params_bytes  # its stage: blocks and embedding
    assert staged.activations_bytes < one.activations_bytes
    assert any("1/2 of the blocks per rank" in note for note in staged.notes)
