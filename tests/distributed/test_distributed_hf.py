"""DDP and FSDP2 on a Hugging Face model over 2 gloo ranks: the same training as one process with the whole batch.

(In tests/distributed/: it forks ranks, so it runs before the tests that import bitsandbytes.)
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="the Transformers bridge needs transformers installed")

import scalekit  # noqa: E402
from scalekit import RunConfig  # noqa: E402
from scalekit.hf import causal_lm  # noqa: E402
from scalekit.launch import launch_run  # noqa: E402
from tests.forking import no_process_left_behind  # noqa: E402, F401 - the same deadline and cleanup here


def config(**toggles) -> RunConfig:
    return RunConfig(model=causal_lm("llama", "tiny"), batch_size=8, steps=3, warmup_steps=0, log_every=1,
                     device="cpu", toggles=toggles)


@pytest.mark.parametrize("toggles", [{"ddp": True}, {"fsdp": True}, {"fsdp": True, "checkpointing": 1}],
                         ids=["ddp", "fsdp", "fsdp+checkpointing"])
def test_two_ranks_train_an_hf_model_like_one_process(toggles):
    single = scalekit.run(config())
    spread = launch_run(config(**toggles), nprocs=2)
    assert spread.status == "ok", spread.error
    assert spread.world_size == 2 and spread.tokens_per_step == single.tokens_per_step
    assert [v for _, v in spread.losses] == pytest.approx([v for _, v in single.losses], abs=1e-5)
    assert single.losses[-1][1] < single.losses[0][1]  # it trained: the comparison is not of untouched models
